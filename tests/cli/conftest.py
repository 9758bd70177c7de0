"""Run the real ``dblock`` command in subprocesses against the ``db_url`` backends."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

CHILD = str(Path(__file__).with_name("_child.py"))
SIGNAL_AT = str(Path(__file__).with_name("_signal_at.py"))
#: generous bound on anything the tests wait for (never a timing assertion)
WAIT = 30.0


def wait_for(predicate: Callable[[], object], timeout: float = WAIT, what: str = "") -> None:
    """Poll ``predicate`` until it is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what or predicate}")
        time.sleep(0.02)


class Dblock:
    """The ``dblock`` command on one database URL and lock table; a work dir for CMD."""

    def __init__(self, url: str, table: str, work: Path) -> None:
        self.url = url
        self.table = table
        self.work = work
        self.env = {k: v for k, v in os.environ.items() if k != "DBLOCK_URL"}
        self.env["PYTHONUNBUFFERED"] = "1"
        self.env["PYTHONFAULTHANDLER"] = "1"  # a stack dump on SIGABRT (see finish)
        self._started: list[subprocess.Popen[bytes]] = []
        self.stderr_of: dict[int, Path] = {}
        self._signum: int = signal.SIGINT  # start_signalled's

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "dblock", "--url", self.url, "--table", self.table, *args]

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*args),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            stdin=subprocess.DEVNULL,
            check=False,
        )

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        """Start dblock; its stderr goes to a file, readable while it runs (:meth:`stderr`)."""
        return self._start(self.argv(*args))

    def start_signalled(self, signum: int, *args: str) -> subprocess.Popen[bytes]:
        """Start dblock as :meth:`start` does; once :meth:`arm` is called, its next wait on a
        condition gets ``signum`` at the worst moment (see _signal_at.py)."""
        argv = self.argv(*args)
        self._signum = signum
        return self._start([argv[0], SIGNAL_AT, str(self.work / "arm"), str(signum), *argv[3:]])

    def arm(self, proc: subprocess.Popen[bytes]) -> None:
        """Arm the signal of :meth:`start_signalled`. A wait that does not sleep on a
        condition in the main thread (a poll with plain sleeps) gets it in the usual way
        after a few seconds."""
        arm = self.work / "arm"
        arm.touch()
        deadline = time.monotonic() + 5.0
        while not arm.with_suffix(".sent").exists() and proc.poll() is None:
            if time.monotonic() > deadline:
                proc.send_signal(self._signum)
                return
            time.sleep(0.02)

    def _start(self, argv: list[str]) -> subprocess.Popen[bytes]:
        path = self.work / f"stderr.{len(self._started)}"
        out_path = path.with_name(path.name.replace("err", "out"))
        with path.open("w") as err, out_path.open("w") as out:
            proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env=self.env,
            )
        self._started.append(proc)
        self.stderr_of[proc.pid] = path
        return proc

    def stderr(self, proc: subprocess.Popen[bytes]) -> str:
        return self.stderr_of[proc.pid].read_text()

    def stdout(self, proc: subprocess.Popen[bytes]) -> str:
        path = self.stderr_of[proc.pid]
        return path.with_name(path.name.replace("err", "out")).read_text()

    def child(self, mode: str) -> list[str]:
        """``-- CMD`` running tests/cli/_child.py in ``mode``."""
        return ["--", sys.executable, CHILD, str(self.work), mode]

    def runs(self) -> list[str]:
        path = self.work / "runs"
        return path.read_text().splitlines() if path.exists() else []

    def ready_pids(self) -> list[int]:
        return [int(p.name.split(".")[1]) for p in self.work.glob("ready.*")]

    def stop_children(self) -> None:
        (self.work / "stop").touch()

    def cleanup(self) -> None:
        self.stop_children()
        for pid in self.ready_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        for proc in self._started:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=WAIT)
            # captured: pytest shows it with a failed test (what a dblock that never started
            # its command, or hung, had said)
            print(f"stderr of dblock {proc.args!r} (exit {proc.returncode}):")
            print(self.stderr_of[proc.pid].read_text(errors="replace"))


@pytest.fixture
def cli(db_url: str, table: str, tmp_path: Path) -> Iterator[Dblock]:
    work = tmp_path / "work"
    work.mkdir()
    runner = Dblock(db_url, table, work)
    yield runner
    runner.cleanup()


def finish(
    cli: Dblock, proc: subprocess.Popen[bytes], timeout: float = WAIT
) -> tuple[int, str, str]:
    """Wait (bounded) for a started dblock; its status, stdout and stderr."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        # SIGABRT first: faulthandler (PYTHONFAULTHANDLER in its environment) writes every
        # thread's stack to its stderr, which tells where it hung
        proc.send_signal(signal.SIGABRT)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        pytest.fail(f"dblock did not exit within {timeout:g} s; stderr: {cli.stderr(proc)}")
    return proc.returncode, cli.stdout(proc), cli.stderr(proc)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
