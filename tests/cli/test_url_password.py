"""A password given with --url is visible to every local user (``ps``): dblock warns, without
printing it, and README shows the ways that keep it off the command line (issue 29, point 7)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dblock.cli import main

SECRET = "Sekr3t-pw-7781"  # noqa: S105 - must never be printed
README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://app:{SECRET}@127.0.0.1:1/app",
        f"mysql://app:{SECRET}@127.0.0.1:1/app",
        f"postgresql://app@127.0.0.1:1/app?password={SECRET}",
        f"postgresql://app@127.0.0.1:1/app?sslpassword={SECRET}",
    ],
)
def test_password_in_url_option_warns_once(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    # given twice (before and after the command): one warning; `schema` does not connect
    assert main(["--url", url, "schema", "--url", url]) == 0
    out, err = capsys.readouterr()
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert len(warnings) == 1, err
    assert "DBLOCK_URL" in warnings[0] and "pgpass" in warnings[0]
    assert SECRET not in out + err


@pytest.mark.parametrize(
    "url", ["postgresql://app@127.0.0.1:1/app", "postgresql://app:@127.0.0.1:1/app"]
)
def test_no_warning_without_a_password(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--url", url, "schema"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_no_warning_for_dblock_url(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dblock", "schema"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DBLOCK_URL": f"postgresql://app:{SECRET}@127.0.0.1:1/app"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr
    assert SECRET not in done.stdout + done.stderr


def test_readme_keeps_passwords_off_the_command_line() -> None:
    text = README.read_text()
    cli = text[text.index("## Command line") : text.index("## Patterns")]
    for advice in ("DBLOCK_URL", ".pgpass", "PGPASSFILE", "`ps`"):
        assert advice in cli
