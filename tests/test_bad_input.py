"""Bad input ends in a clear, documented error (issue 29, points 10, 11 and 12).

- every URL parameter dblock reads is validated (nan, inf, negative, absurd, junk) with a
  ConfigurationError naming it;
- SQLite's busy wait honours the caller's deadline: a try-once or a short timeout does not
  sit out the URL's whole busy timeout (10 s) on a file another process keeps write-locked;
- ``sqlite:///:memory:`` is refused, saying why;
- notes are validated like keys, and a huge ``older_than`` stays inside the hierarchy.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import dblock
from tests._servers import MYSQL_URL, POSTGRESQL_URL

#: far below the URL's busy timeout (10 s), which these waits must not sit out, far above what
#: the waits are allowed (their timeout plus a quarter of a second); not a speed measurement
BOUND = 5.0


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-5", "1e300", "3601", "abc", ""])
def test_sqlite_timeout_parameter_is_validated(tmp_path: Path, value: str) -> None:
    with pytest.raises(dblock.ConfigurationError, match="timeout"):
        dblock.connect(f"sqlite:///{tmp_path}/l.db?timeout={value}")


@pytest.mark.parametrize(
    "url",
    [
        f"{MYSQL_URL}?connect_timeout=-1",
        f"{MYSQL_URL}?connect_timeout=0",
        f"{MYSQL_URL}?read_timeout=0",
        f"{MYSQL_URL}?write_timeout=1e9",
        f"{MYSQL_URL}?read_timeout=nan",
        f"{POSTGRESQL_URL}?connect_timeout=0",  # libpq would wait forever
        f"{POSTGRESQL_URL}?connect_timeout=-1",
        f"{POSTGRESQL_URL}?connect_timeout=1.5",
        f"{POSTGRESQL_URL}?connect_timeout=99999999999",
    ],
)
def test_server_timeout_parameters_are_validated(url: str) -> None:
    name = url.rpartition("?")[2].partition("=")[0]
    with pytest.raises(dblock.ConfigurationError, match=name):
        dblock.connect(url, table="never_created")


def test_sqlite_timeout_of_zero_and_a_fraction_are_accepted(tmp_path: Path) -> None:
    for value in ("0", "0.5", "3600"):
        dblock.connect(f"sqlite:///{tmp_path}/l.db?timeout={value}").close()


def test_memory_database_is_refused_with_the_reason() -> None:
    with pytest.raises(dblock.ConfigurationError, match="in-memory") as info:
        dblock.connect("sqlite:///:memory:")
    assert "use a file" in str(info.value)


# -- a busy SQLite file and the caller's deadline --------------------------------------------
@pytest.fixture
def busy_file(tmp_path: Path) -> Iterator[str]:
    """A database with dblock's tables whose write lock another process holds."""
    path = tmp_path / "busy.sqlite3"
    url = f"sqlite:///{path}"
    dblock.connect(url).close()  # tables created
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys, time\n"
            f"c = sqlite3.connect({str(path)!r}, isolation_level=None)\n"
            "c.execute('BEGIN IMMEDIATE')\n"
            "print('locked', flush=True)\n"
            "sys.stdin.read()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "locked"
    try:
        yield url
    finally:
        holder.communicate("", timeout=30)


def _timed(fn: object) -> tuple[object, float]:
    assert callable(fn)
    t0 = time.monotonic()
    value = fn()
    return value, time.monotonic() - t0


def test_try_once_does_not_wait_out_the_busy_timeout(busy_file: str) -> None:
    with dblock.connect(busy_file) as client:
        lock = client.lock("k-" + uuid.uuid4().hex, ttl=5)
        got, took = _timed(lambda: lock.acquire(blocking=False))
        assert got is False
        assert took < BOUND


def test_short_timeout_does_not_wait_out_the_busy_timeout(busy_file: str) -> None:
    with dblock.connect(busy_file) as client:
        lock = client.lock("k-" + uuid.uuid4().hex, ttl=5, timeout=0.5)
        got, took = _timed(lock.acquire)
        assert got is False
        assert took < BOUND
        with pytest.raises(dblock.LockTimeout):
            with lock:
                pass


def test_no_wait_on_the_command_line_returns_at_once(busy_file: str) -> None:
    args = [sys.executable, "-m", "dblock", "--url", busy_file, "run", "--no-wait", "k", "--"]
    done, took = _timed(
        lambda: subprocess.run(
            [*args, "true"], capture_output=True, text=True, timeout=60, check=False
        )
    )
    assert isinstance(done, subprocess.CompletedProcess)
    assert done.returncode == 75, done.stderr
    assert took < BOUND + 3  # plus the interpreter's start


def test_busy_timeout_still_bounds_a_wait_without_deadline(tmp_path: Path) -> None:
    """With no timeout, the URL's busy timeout is what bounds a busy file (BackendError)."""
    path = tmp_path / "b.sqlite3"
    dblock.connect(f"sqlite:///{path}").close()
    import sqlite3

    other = sqlite3.connect(str(path), isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        with dblock.connect(f"sqlite:///{path}?timeout=0.3") as client:
            with pytest.raises(dblock.BackendError, match="locked"):
                client.lock("k").acquire()
    finally:
        other.execute("ROLLBACK")
        other.close()


# -- notes and other values -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("note", "error"),
    [
        ("\ud800", ValueError),
        ("a\udfffb", ValueError),
        ("nul\x00inside", ValueError),
        ("x" * 4097, ValueError),
        (b"bytes", TypeError),
        (42, TypeError),
    ],
)
def test_bad_notes_are_refused_up_front(
    client: dblock.Client, key: str, note: object, error: type[Exception]
) -> None:
    with pytest.raises(error) as info:
        client.once(key, note=note)  # type: ignore[arg-type]
    assert not isinstance(info.value, UnicodeError)  # a clear message, not a codec's
    assert client.state(key) is None  # nothing reached the database


def test_good_notes_are_stored(client: dblock.Client, key: str) -> None:
    for i, note in enumerate(["", "é \U0010ffff 漢字", "x" * 4096, None]):
        with client.once(f"{key}-{i}", note=note):
            pass
        assert client.state(f"{key}-{i}") == "succeeded"


@pytest.mark.parametrize("older_than", [1e308, 1e20, 31_536_000.0 * 200, 2**70])
def test_huge_purge_age_stays_in_the_hierarchy(client: dblock.Client, older_than: float) -> None:
    assert client.purge(older_than) >= 0


def test_scheduled_job_with_at_least_equal_to_at_most(client: dblock.Client, key: str) -> None:
    """A job that keeps the lock for its whole lease leaves it as it was: still ours (MySQL
    counted the unchanged row as not updated, and the job ended in LockLost)."""
    runs: list[int] = []

    @client.scheduled(key, at_most=60, at_least=60)
    def job() -> int:
        runs.append(1)
        return 7

    assert job() == 7
    assert runs == [1]
    info = client.info(key)
    assert info is not None  # kept until at_least
    assert job() is None  # another firing within at_least skips
