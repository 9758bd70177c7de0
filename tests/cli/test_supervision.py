"""``dblock run`` keeps CMD, and every process CMD starts, inside the lease (issue 29, 1-2).

Each test watches from outside: CMD and its children append ``time.monotonic()`` (one clock
for every process on a Linux host) to heartbeat files (``_heartbeat.py``), and a second
``dblock run`` on the same key, connected straight to the server, records when its own CMD
starts. No process of the first run may show a sign of life after that moment. The database
becomes unreachable through a proxy that black-holes the first run's connections
(``tests/_proxy.py``); the shared server itself is never touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import shlex
import shutil
import signal
import subprocess
import sys
import termios
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests._proxy import Proxy
from tests._servers import POSTGRESQL_URL, drop_tables, raw_connect, require_server
from tests._waiting import until

from .conftest import WAIT, Dblock, finish, wait_for

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="one monotonic clock for all processes: Linux"
)

HEARTBEAT = str(Path(__file__).with_name("_heartbeat.py"))
#: short, so that a lease runs out in seconds: SIGTERM at 2.25 s, SIGKILL at 2.75 s
TTL = "3"


def beats(path: Path) -> list[tuple[int, float]]:
    """The (pid, monotonic time) lines of a heartbeat file (a torn last line is skipped)."""
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            pid, at = line.split()
            found.append((int(pid), float(at)))
    return found


def last_beat(*paths: Path) -> float:
    return max(at for path in paths for _, at in beats(path))


def first_beat(path: Path) -> float:
    return beats(path)[0][1]


def running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2 :].split()[0] != b"Z"


def heartbeat(path: Path, *flags: str) -> list[str]:
    return [sys.executable, HEARTBEAT, str(path), *flags]


def in_shell(script: str, *paths: Path) -> list[str]:
    """``sh -c script``, with $0 the Python interpreter, $1 _heartbeat.py, $2... ``paths``."""
    return ["sh", "-c", script, sys.executable, HEARTBEAT, *map(str, paths)]


@pytest.fixture
def pg(tmp_path: Path) -> Iterator[Dblock]:
    require_server("postgresql", POSTGRESQL_URL)
    table = "t_" + uuid.uuid4().hex[:16]
    work = tmp_path / "work"
    work.mkdir()
    runner = Dblock(POSTGRESQL_URL, table, work)
    yield runner
    runner.cleanup()
    drop_tables(POSTGRESQL_URL, table)


@pytest.fixture
def beats_dir(tmp_path: Path) -> Iterator[Path]:
    """Where heartbeat files go; every process that wrote one is killed at the end."""
    where = tmp_path / "beats"
    where.mkdir()
    yield where
    for path in where.iterdir():
        for pid in {pid for pid, _ in beats(path)}:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[Proxy]:
    parts = urlsplit(POSTGRESQL_URL)
    with Proxy(parts.hostname or "127.0.0.1", parts.port or 5432, tmp_path / "proxy") as p:
        yield p


def via(pg: Dblock, proxy: Proxy, work: Path) -> Dblock:
    """The same database and table as ``pg``, reached through ``proxy``."""
    parts = urlsplit(pg.url)
    netloc = parts.netloc.rsplit("@", 1)[0] + f"@127.0.0.1:{proxy.port}"
    work.mkdir()
    return Dblock(urlunsplit(parts._replace(netloc=netloc)), pg.table, work)


#: a minimal job-control shell: runs argv as the foreground job (a process group of its own
#: that owns the terminal), and exits with its status, as an interactive shell would
JOB_SHELL = """
import os, signal, sys
signal.signal(signal.SIGTTOU, signal.SIG_IGN)
pid = os.fork()
if pid == 0:
    os.setpgid(0, 0)
    os.tcsetpgrp(0, os.getpgrp())
    signal.signal(signal.SIGTTOU, signal.SIG_DFL)
    os.execvp(sys.argv[1], sys.argv[1:])
try:
    os.setpgid(pid, pid)
except PermissionError:  # the child has run exec already, after its own setpgid: as shells do
    pass
os.tcsetpgrp(0, pid)
_, status = os.waitpid(pid, 0)
os.tcsetpgrp(0, os.getpgrp())  # the terminal back, as a shell takes it: its hang-up is ours
sys.exit(os.waitstatus_to_exitcode(status) % 256)
"""


_TERMINALS: list[Terminal] = []


@pytest.fixture(autouse=True)
def _no_terminal_left() -> Iterator[None]:
    """A test that failed before its terminal's command ended leaves none running."""
    yield
    while _TERMINALS:
        term = _TERMINALS.pop()
        if term.process.poll() is None:
            term.process.kill()
            term.wait()


class Terminal:
    """A command run as the foreground job of a fresh pseudo-terminal, under a shell that
    is the session leader (so the terminal's hang-up at the end signals nobody else)."""

    def __init__(self, argv: list[str], env: dict[str, str], *, as_job: bool = True) -> None:
        master, replica = pty.openpty()
        self.master = master
        self.output = b""
        self.process = subprocess.Popen(
            [sys.executable, "-c", JOB_SHELL, *argv] if as_job else argv,
            stdin=replica,
            stdout=replica,
            stderr=replica,
            env={**env, "TERM": "xterm"},
            start_new_session=True,
            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),  # noqa: PLW1509
        )
        os.close(replica)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        _TERMINALS.append(self)

    def _read(self) -> None:
        with contextlib.suppress(OSError):  # EIO once every process has closed the terminal
            while data := os.read(self.master, 65536):
                self.output += data

    def wait_for(self, predicate: Callable[[], object], what: str) -> None:
        """:func:`wait_for`, failing at once, with what the terminal showed, if the command
        ended meanwhile or the wait runs out."""
        try:
            wait_for(lambda: predicate() or self.process.poll() is not None, what=what)
        except pytest.fail.Exception as exc:
            raise AssertionError(f"{exc}; the terminal showed {self.output!r}") from None
        assert predicate(), f"{what}: the terminal's command ended; it showed {self.output!r}"

    def type(self, data: bytes) -> None:
        os.write(self.master, data)

    def wait(self) -> int:
        try:
            return self.process.wait(WAIT)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            self._reader.join(5)
            with contextlib.suppress(OSError):
                os.close(self.master)


def start_second(pg: Dblock, key: str, path: Path) -> subprocess.Popen[bytes]:
    """The next host's run: waits for ``key``, and its CMD records when it starts."""
    return pg.start("run", "--ttl", TTL, "--timeout", "60", key, "--", *heartbeat(path))


def end_second(pg: Dblock, second: subprocess.Popen[bytes], path: Path) -> None:
    wait_for(lambda: beats(path), what="the second run's CMD")
    second.send_signal(signal.SIGTERM)
    status, _, err = finish(pg, second)
    assert status == 128 + signal.SIGTERM, err


@pytest.mark.slow
def test_cmd_is_dead_before_the_lease_can_end(
    pg: Dblock, key: str, proxy: Proxy, beats_dir: Path, tmp_path: Path
) -> None:
    """Point 1: the database drops out of reach; CMD ignores SIGTERM; its last heartbeat
    still precedes the start of the next holder's CMD."""
    first = via(pg, proxy, tmp_path / "first")
    cmd, nxt = beats_dir / "cmd", beats_dir / "next"
    run = first.start("run", "--ttl", TTL, key, "--", *heartbeat(cmd, "ignore-term"))
    wait_for(lambda: beats(cmd), what="CMD to start")
    second = start_second(pg, key, nxt)
    proxy.blackhole()
    status, _, err = finish(first, run)
    assert status == 70, err
    assert "lost the lease" in err
    assert "Traceback" not in err
    (pid,) = {pid for pid, _ in beats(cmd)}
    assert not running(pid)
    wait_for(lambda: beats(nxt), what="the next holder's CMD")
    assert last_beat(cmd) < first_beat(nxt)
    end_second(pg, second, nxt)


@pytest.mark.slow
def test_lease_loss_stops_the_whole_job_on_a_terminal(
    pg: Dblock, key: str, proxy: Proxy, beats_dir: Path, tmp_path: Path
) -> None:
    """Point 2: in a terminal's foreground, a process CMD started in the background (which
    ignores SIGTERM) is stopped with CMD, before the lease can end."""
    first = via(pg, proxy, tmp_path / "first")
    child = beats_dir / "child"
    nxt = beats_dir / "next"
    cmd = in_shell('"$0" "$1" "$2" ignore-term & wait', child)
    term = Terminal(first.argv("run", "--ttl", TTL, key, "--", *cmd), first.env)
    term.wait_for(lambda: beats(child), what="CMD's child to start")
    second = start_second(pg, key, nxt)
    proxy.blackhole()
    status = term.wait()
    assert status == 70, term.output
    assert b"lost the lease" in term.output
    (pid,) = {pid for pid, _ in beats(child)}
    assert not running(pid)
    wait_for(lambda: beats(nxt), what="the next holder's CMD")
    assert last_beat(child) < first_beat(nxt)
    end_second(pg, second, nxt)


def test_ctrl_c_on_a_terminal_reaches_cmd_and_its_children(
    pg: Dblock, key: str, beats_dir: Path
) -> None:
    """CMD has the terminal: Ctrl-C reaches its process group, and what survives it (a
    background job ignores SIGINT) is stopped before the lock is released."""
    child, probe = beats_dir / "child", beats_dir / "probe"
    script = (
        '"$0" -c "import os; print(os.tcgetpgrp(0) == os.getpgrp(), os.getpgrp() != os.getsid(0))"'
        ' > "$3"; "$0" "$1" "$2" & wait'
    )
    term = Terminal(pg.argv("run", key, "--", *in_shell(script, child, probe)), pg.env)
    term.wait_for(lambda: beats(child), what="CMD's child to start")
    term.type(b"\x03")
    assert term.wait() == 128 + signal.SIGINT, term.output
    (pid,) = {pid for pid, _ in beats(child)}
    assert not running(pid)
    assert pg.run("info", key).returncode == 1  # released
    assert probe.read_text().split() == ["True", "True"]  # CMD's own group, in the foreground


def test_a_lock_handed_over_is_renewed_before_cmd_starts(
    pg: Dblock, key: str, beats_dir: Path
) -> None:
    """A waiter handed the lock by its releaser gets what is left of its queue entry (at most
    9 s) as its first lease: it renews to the full ttl before CMD starts, instead of stopping
    CMD at once because the lease's end is nearer than the kill grace."""
    held, go = beats_dir / "held", beats_dir / "go"
    # the first run holds until told: a hold of a second was over before a look at it came
    gate = 'touch "$2"; while [ ! -e "$3" ]; do sleep 0.05; done'
    first = pg.start("run", key, "--", *in_shell(gate, held, go))
    wait_for(held.exists, what="the first run to hold the key")
    nxt = beats_dir / "next"
    args = ["run", "--ttl", "30", "--kill-grace", "9", "--timeout", "60", key, "--"]
    second = pg.start(*args, *heartbeat(nxt))
    wait_for(lambda: queued(pg.table, key), what="the second run to join the key's queue")
    go.touch()
    assert finish(pg, first)[0] == 0
    wait_for(lambda: beats(nxt), what="the second run's CMD")
    assert not stalled(nxt, 1.0)
    assert second.poll() is None, pg.stderr(second)
    end_second(pg, second, nxt)


def queued(table: str, key: str) -> bool:
    """A queue entry of ``key`` in PostgreSQL's holders table."""
    conn = raw_connect(POSTGRESQL_URL)
    try:
        row = conn.execute(
            f'SELECT count(*) FROM "{table}_holders" WHERE lock_key = %s AND waiting = 1', (key,)
        ).fetchone()
    finally:
        conn.close()
    return bool(row[0])


def stalled(path: Path, seconds: float = 0.3) -> bool:
    """No heartbeat in ``path`` for ``seconds``."""
    before = len(beats(path))
    time.sleep(seconds)
    return len(beats(path)) == before


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash for job control")
@pytest.mark.parametrize("stopped_for", [0.0, 3.5])
def test_ctrl_z_and_fg_in_an_interactive_shell(
    pg: Dblock, key: str, beats_dir: Path, stopped_for: float
) -> None:
    """Ctrl-Z stops the job (dblock follows CMD's stop, so bash sees it stopped) and ``fg``
    continues CMD, unless the lease may have ended meanwhile: then CMD is killed, not
    continued (exit 70)."""
    cmd = beats_dir / "cmd"
    env = {**pg.env, "PS1": "$ ", "HISTFILE": "/dev/null"}
    term = Terminal(["bash", "--norc", "--noprofile", "-i"], env, as_job=False)
    try:
        argv = pg.argv("run", "--ttl", TTL, key, "--", *heartbeat(cmd))
        term.type(shlex.join(argv).encode() + b"\n")
        term.wait_for(lambda: beats(cmd), what="CMD to start")
        term.type(b"\x1a")
        term.wait_for(lambda: b"Stopped" in term.output, what="bash to see the job stopped")
        assert stalled(cmd)
        stopped_at = time.monotonic()
        time.sleep(stopped_for)
        term.type(b"fg\n")
        if stopped_for:
            term.type(b"echo status=$?\n")
            term.wait_for(lambda: b"status=70" in term.output, what="dblock to exit 70")
            assert last_beat(cmd) < stopped_at  # never continued
        else:
            term.wait_for(lambda: not stalled(cmd, 0.1), what="CMD to continue")
            term.type(b"\x03")
            term.type(b"echo status=$?\n")
            term.wait_for(lambda: b"status=130" in term.output, what="dblock to exit 130")
        assert pg.run("info", key).returncode == 1
        term.type(b"exit\n")
        assert term.wait() == 0
    finally:
        if term.process.poll() is None:
            term.process.kill()
            term.wait()


@pytest.mark.parametrize("escape", ["", "setsid"])
def test_what_cmd_leaves_behind_is_stopped_before_release(
    pg: Dblock, key: str, beats_dir: Path, escape: str
) -> None:
    """Point 2: CMD exits and leaves a background process (one even in a session of its
    own): it is stopped before KEY is released, so it never overlaps the next holder."""
    child, nxt = beats_dir / "child", beats_dir / "next"
    cmd = in_shell(f'"$0" "$1" "$2" {escape} & sleep 1', child)
    run = pg.start("run", key, "--", *cmd)
    wait_for(lambda: beats(child), what="CMD's child to start")
    second = start_second(pg, key, nxt)
    status, _, err = finish(pg, run)
    assert status == 0, err
    assert "leaving processes behind" in err
    (pid,) = {pid for pid, _ in beats(child)}
    assert not running(pid)
    wait_for(lambda: beats(nxt), what="the next holder's CMD")
    assert last_beat(child) < first_beat(nxt)
    end_second(pg, second, nxt)


def test_sigterm_to_run_stops_every_process_of_cmd(pg: Dblock, key: str, beats_dir: Path) -> None:
    """Point 2: SIGTERM to ``run`` reaches CMD's whole group; a process that ignores it is
    killed after --kill-grace, and ``run`` exits only when none is left."""
    child = beats_dir / "child"
    cmd = in_shell('"$0" "$1" "$2" ignore-term & wait', child)
    run = pg.start("run", "--kill-grace", "0.5", key, "--", *cmd)
    wait_for(lambda: beats(child), what="CMD's child to start")
    run.send_signal(signal.SIGTERM)
    status, _, err = finish(pg, run)
    assert status == 128 + signal.SIGTERM, err
    (pid,) = {pid for pid, _ in beats(child)}
    assert not running(pid)
    assert pg.run("info", key).returncode == 1  # released


@pytest.mark.parametrize(
    ("ttl", "grace", "ok"),
    [("3", None, True), ("0.5", None, False), ("10", "4", True), ("10", "5", False)],
)
def test_ttl_too_short_for_the_kill_grace_is_refused(
    pg: Dblock, key: str, ttl: str, grace: str | None, ok: bool
) -> None:
    args = ["run", "--ttl", ttl, *(["--kill-grace", grace] if grace else []), key, "--", "true"]
    done = pg.run(*args)
    if ok:
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode == 2
        assert "too short for a kill grace" in done.stderr
        assert "Traceback" not in done.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_CHILD_SUBREAPER")
def test_run_leaves_its_process_no_subreaper(tmp_path: Path) -> None:
    """``run`` adopts CMD's orphans only while CMD runs: a process that goes on after it (an
    embedding program, this test run) must not collect every later orphan as a zombie."""
    import ctypes

    from dblock.cli import main

    def subreaper() -> int:
        value = ctypes.c_int(0)
        assert ctypes.CDLL(None, use_errno=True).prctl(37, ctypes.byref(value), 0, 0, 0) == 0
        return value.value

    assert subreaper() == 0
    url = f"sqlite:///{tmp_path}/locks.sqlite3"
    assert main(["--url", url, "run", "--no-wait", "k", "--", "/nonexistent/cmd"]) == 127
    assert subreaper() == 0
    assert main(["--url", url, "run", "--no-wait", "k", "--", "true"]) == 0
    assert subreaper() == 0
    assert main(["--url", url, "once", "k2", "--", "true"]) == 0
    assert subreaper() == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and subreapers")
def test_run_in_process_leaves_the_programs_other_children_alone(tmp_path: Path) -> None:
    """A program that calls ``run`` in-process may have children of its own: they are not
    CMD's, so they are neither signalled nor reaped (their exit status stays theirs)."""
    from dblock.cli import main

    sleeper = subprocess.Popen(["sleep", "60"])
    exited = subprocess.Popen(["sh", "-c", "exit 3"])
    try:
        until(lambda: Path(f"/proc/{exited.pid}/stat").read_text().split()[2] == "Z", "exit")
        url = f"sqlite:///{tmp_path}/locks.sqlite3"
        assert main(["--url", url, "run", "--no-wait", "k", "--", "sh", "-c", "sleep 0.3"]) == 0
        assert sleeper.poll() is None, "run signalled a process that was not CMD's"
        assert exited.wait(5) == 3, "run reaped a process that was not CMD's"
    finally:
        sleeper.kill()
        sleeper.wait()
