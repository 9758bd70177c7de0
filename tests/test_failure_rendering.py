"""The suite's own harness: a failure pytest cannot render still ends as that test's failure,
not as an internal error that stops the whole run (tests/conftest.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FAILING = """
import _pytest._code.code as code

def test_fails(monkeypatch):
    # rendering breaks as on Python 3.11 when a frame has no line number (tb_lineno None)
    monkeypatch.setattr(code.TracebackEntry, "lineno", property(lambda self: None - 1))
    assert 1 == 2

def test_passes():
    pass
"""


def test_an_unrenderable_failure_is_reported_and_the_run_goes_on(tmp_path: Path) -> None:
    (tmp_path / "test_unrenderable.py").write_text(FAILING)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.conftest",
            "--rootdir",
            str(tmp_path),
            str(tmp_path),
        ],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "INTERNALERROR" not in run.stdout + run.stderr
    assert "1 failed, 1 passed" in run.stdout, run.stdout[-3000:]
    assert "assert 1 == 2" in run.stdout
