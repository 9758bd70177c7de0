"""The connection pool is bounded (issue 29, point 17).

``connect(max_connections=N)`` (or ``?max_connections=N``) bounds the connections a client's
pool has open, idle or in use; a thread that finds them all in use waits for one within its
own deadline, and waiters, which may hold connections of their own (change watches, doorbells,
a listener), never starve the threads that need one to make progress.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import dblock
from tests import _pg_crowd
from tests._internals import store_of
from tests._servers import POSTGRESQL_URL, raw_connect

#: generous bound on anything the tests wait for (never a speed measurement)
WAIT = 60.0


def _threads(n: int, target: Callable[[int], None]) -> None:
    """Run ``target(i)`` on ``n`` threads; re-raise the first failure; fail on a hang."""
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            target(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
        assert not t.is_alive(), "a thread is still running: deadlock or hang"
    if errors:
        raise errors[0]


# -- the option -------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [0, -1, 10_001, True, 1.5, "3", None.__class__])
def test_bad_max_connections_is_a_configuration_error(tmp_path: Path, value: object) -> None:
    with pytest.raises(dblock.ConfigurationError, match="max_connections"):
        dblock.connect(f"sqlite:///{tmp_path}/l.db", max_connections=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["0", "-1", "abc", "1.5", "nan", "", "1e3", "10001"])
def test_bad_max_connections_in_the_url_is_a_configuration_error(
    tmp_path: Path, value: str
) -> None:
    with pytest.raises(dblock.ConfigurationError, match="max_connections"):
        dblock.connect(f"sqlite:///{tmp_path}/l.db?max_connections={value}")


def test_max_connections_from_the_url_and_the_argument(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/l.db?max_connections=3"
    with dblock.connect(url) as client:
        assert store_of(client).max_connections == 3  # type: ignore[attr-defined]
    with dblock.connect(url, max_connections=5) as client:  # the argument wins
        assert store_of(client).max_connections == 5  # type: ignore[attr-defined]


def test_max_connections_is_not_passed_to_the_driver(pg_table: str) -> None:
    """libpq would refuse an option it does not know; MySQL and SQLite too."""
    with dblock.connect(f"{POSTGRESQL_URL}?max_connections=2", table=pg_table) as client:
        assert client.lock("k").acquire(blocking=False)


# -- the bound --------------------------------------------------------------------------------
def _sqlite_connections(path: Path) -> int:
    """Connections this process has open on the file: one descriptor of the file each."""
    fds = Path("/proc/self/fd")
    count = 0
    for fd in fds.iterdir():
        try:
            if os.readlink(fd) == str(path):
                count += 1
        except OSError:
            pass
    return count


def test_sqlite_pool_never_opens_more_than_max_connections(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite3"
    peak = 0
    stop = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, _sqlite_connections(path))
            time.sleep(0.001)

    with dblock.connect(f"sqlite:///{path}", max_connections=3) as client:
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()

        def work(i: int) -> None:
            for j in range(30):
                lock = client.lock(f"k-{i}-{j % 3}", ttl=10)
                assert lock.acquire(timeout=WAIT)
                lock.release()

        try:
            _threads(16, work)
        finally:
            stop.set()
            watcher.join()
        # statement connections only: nobody waited on a held key, so no change watches
        assert 1 <= peak <= 3
        assert _sqlite_connections(path) <= 3  # kept open for reuse, no more


@pytest.fixture
def app_name() -> str:
    return "dblock_pool_" + uuid.uuid4().hex[:12]


def _pg_connections(app_name: str) -> int:
    conn = raw_connect(POSTGRESQL_URL)
    try:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (app_name,)
        ).fetchone()
        return int(row[0])
    finally:
        conn.close()


def test_postgresql_pool_never_opens_more_than_max_connections(
    pg_table: str, app_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # six waiters: they listen, below the crowd that sends each to a doorbell connection of
    # its own (tests/_pg_crowd.py)
    _pg_crowd.dblocks_own(monkeypatch)
    peak = 0
    stop = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, _pg_connections(app_name))
            time.sleep(0.005)

    url = f"{POSTGRESQL_URL}?application_name={app_name}"
    with dblock.connect(url, table=pg_table, max_connections=3) as client:
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        key = "hot-" + uuid.uuid4().hex

        def work(i: int) -> None:
            for j in range(20):
                # half the threads contend on one key (they wait: the listener connects)
                lock = client.lock(key if i % 2 else f"k-{i}-{j % 3}", ttl=10)
                assert lock.acquire(timeout=WAIT)
                lock.release()

        try:
            _threads(12, work)
        finally:
            stop.set()
            watcher.join()
        assert peak <= 3 + 1  # the pool, and one LISTEN connection for all the waiters
        assert _pg_connections(app_name) <= 3 + 1


# -- waiting for a connection -----------------------------------------------------------------
@pytest.fixture
def one_connection(db_url: str, table: str) -> Iterator[tuple[dblock.Client, threading.Event]]:
    """A client whose only pooled connection another thread holds until the event is set.

    The holder runs a statement of its own through the pool (the seam where the fault is
    injected: a statement that takes long), as a slow purge on a big table would."""
    with dblock.connect(db_url, table=table, max_connections=1) as client:
        release = threading.Event()
        taken = threading.Event()

        def slow(conn: object) -> None:
            taken.set()
            release.wait(WAIT)

        holder = threading.Thread(
            target=store_of(client).run,  # type: ignore[attr-defined]
            args=("slow statement", slow),
            kwargs={"deadline": WAIT},
            daemon=True,
        )
        holder.start()
        assert taken.wait(WAIT)
        try:
            yield client, release
        finally:
            release.set()
            holder.join(WAIT)


def test_try_once_waits_for_a_connection_only_within_its_deadline(
    one_connection: tuple[dblock.Client, threading.Event], key: str
) -> None:
    client, _ = one_connection
    lock = client.lock(key, ttl=10)
    t0 = time.monotonic()
    assert lock.acquire(blocking=False) is False  # not had in time: no connection was free
    assert lock.acquire(timeout=0.3) is False
    with pytest.raises(dblock.LockTimeout):
        with client.lock(key, ttl=10, timeout=0.2):
            pass
    assert time.monotonic() - t0 < WAIT / 2  # not held up until the statement ends


def test_blocking_acquire_waits_for_a_connection(
    one_connection: tuple[dblock.Client, threading.Event], key: str
) -> None:
    client, release = one_connection
    threading.Timer(0.5, release.set).start()
    lock = client.lock(key, ttl=10)
    assert lock.acquire(timeout=WAIT)  # served once the statement ends
    lock.release()


def test_waiters_never_starve_the_pool(db_url: str, table: str, key: str) -> None:
    """More waiters than connections on one held key: every one gets it in turn."""
    with dblock.connect(db_url, table=table, max_connections=2) as client:
        done: list[int] = []
        waiting = threading.Barrier(9)

        def hold() -> None:  # a hold belongs to the thread that took it
            holder = client.lock(key, ttl=30)
            assert holder.acquire(blocking=False)
            waiting.wait(WAIT)
            time.sleep(0.5)  # the waiters are waiting now
            holder.release()

        def wait_for_it(i: int) -> None:
            if i == 8:
                hold()
                return
            lock = client.lock(key, ttl=30)
            waiting.wait(WAIT)
            assert lock.acquire(timeout=WAIT), f"waiter {i} was starved"
            done.append(i)
            lock.release()

        _threads(9, wait_for_it)
        assert sorted(done) == list(range(8))
