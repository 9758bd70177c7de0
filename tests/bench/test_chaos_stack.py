"""The chaos soak prints where a hung process is: its run directory goes at the end, and a
hang seen once in CI may not come back."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench import chaos

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="py-spy: Linux here")


def test_a_hung_process_s_stack_is_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hung = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                """
                import time
                def stuck_in_the_release():
                    time.sleep(60)
                stuck_in_the_release()
                """
            ),
        ]
    )
    try:
        time.sleep(0.5)  # past the interpreter's start
        chaos.Soak.dump_stack(SimpleNamespace(dir=str(tmp_path)), hung.pid)  # only its dir is read
    finally:
        hung.kill()
        hung.wait()
    printed = capsys.readouterr().out
    assert f"chaos: where {hung.pid} is" in printed
    assert "stuck_in_the_release" in printed
    assert "stuck_in_the_release" in (tmp_path / f"hung-{hung.pid}.txt").read_text()
