"""``lock.guard(conn)``: a commit that happens only while its lock is held (issue 50).

Every test runs where the store has CommitGuards, from the application's own connection of
each kind (tests/contract/_guard_kit.py: DB-API and SQLAlchemy, blocking and asyncio). The
async kinds drive the async client on a loop of their own, so these tests take the blocking
client mode only. The takeover that a guard must hold off comes from another client (its own
connections) or, for the paused holder, from another process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import dblock
from tests._worker import freeze
from tests.contract._guard_kit import KINDS, App
from tests.providers import Provider

GUARDED = pytest.mark.needs("CommitGuards", "processes", "blocking")

ROOT = Path(__file__).resolve().parents[2]


class Holder:
    """A client and lock of ``kind``'s side: the async client for the asyncio kinds, on the
    app's loop, called through ``app.run``."""

    def __init__(self, url: str, table: str, app: App) -> None:
        self.app = app
        if app.awaited:
            self.client: Any = app.run(dblock.connect_async(url, table=table))
        else:
            self.client = dblock.connect(url, table=table)

    def lock(self, key: str, **kw: Any) -> Any:
        return self.client.lock(key, **kw)

    def call(self, value: Any) -> Any:
        return self.app.run(value)

    def sleep(self, seconds: float) -> None:
        """Let time pass; an async client's background work runs on its loop meanwhile."""
        self.app.run(asyncio.sleep(seconds)) if self.app.awaited else time.sleep(seconds)

    def close(self) -> None:
        self.app.run(self.client.close()) if self.app.awaited else self.client.close()


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@contextlib.contextmanager
def _side(provider: Provider, table: str, kind: str, loop: Any) -> Iterator[tuple[App, Holder]]:
    """The application's connection of ``kind`` and a holder's client beside it, closed after."""
    assert provider.url is not None
    app = App(provider.url, kind, loop)
    holder = Holder(provider.url, table, app)
    try:
        yield app, holder
    finally:
        holder.close()
        app.close()


@pytest.fixture
def other(provider: Provider, table: str) -> Iterator[dblock.Client]:
    """Another client of the same table: the next holder, an operator."""
    assert provider.url is not None
    with dblock.connect(provider.url, table=table) as c:
        yield c


def _in_thread(fn: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


@GUARDED
@pytest.mark.parametrize("kind", KINDS)
def test_a_guard_keeps_the_row_until_the_transaction_ends(
    provider: Provider, table: str, kind: str, loop: Any, other: dblock.Client
) -> None:
    """While the guarded transaction is open, a force-release (and a takeover of the lapsed
    key) waits; the rollback frees the row at once."""
    with _side(provider, table, kind, loop) as (app, holder):
        lock = holder.lock("g:row", ttl=30)
        assert holder.call(lock.acquire())
        app.begin()
        app.guard(lock)
        t, out = _in_thread(lambda: other.force_release("g:row"))
        t.join(0.6)
        assert t.is_alive(), "force_release did not wait for the guarded transaction"
        app.rollback()
        t.join(10)
        assert out == [True]
        with pytest.raises(dblock.LockLost):
            holder.call(lock.release())


@GUARDED
@pytest.mark.parametrize("kind", KINDS)
def test_a_hold_taken_before_the_guard_raises_lock_lost_and_nothing_is_written(
    provider: Provider, table: str, kind: str, loop: Any, other: dblock.Client
) -> None:
    with _side(provider, table, kind, loop) as (app, holder):
        business = app.create_table()
        try:
            lock = holder.lock("g:lost", ttl=30)
            assert holder.call(lock.acquire())
            assert other.force_release("g:lost")
            assert other.lock("g:lost", ttl=30).acquire(blocking=False)
            app.begin()
            app.write(business, "stale")
            with pytest.raises(dblock.LockLost, match="Roll the transaction back"):
                app.guard(lock)
            app.rollback()
            assert app.rows(business) == []
            assert not lock.held
            with pytest.raises(dblock.LockLost):
                holder.call(lock.release())
        finally:
            app.drop(business)


@GUARDED
@pytest.mark.parametrize("kind", ["dbapi", "async-dbapi"])
def test_release_and_renew_inside_the_guarded_transaction_refuse_instead_of_waiting(
    provider: Provider, table: str, kind: str, loop: Any, other: dblock.Client
) -> None:
    """Each would wait for the transaction's own row lock (its own thread's, here): they raise
    at once, and once the transaction has ended the release goes through."""
    with _side(provider, table, kind, loop) as (app, holder):
        lock = holder.lock("g:inside", ttl=30, auto_renew=True)
        assert holder.call(lock.acquire())
        app.begin()
        app.guard(lock)
        started = time.monotonic()
        with pytest.raises(dblock.DBLockError, match="still open"):
            holder.call(lock.renew())
        with pytest.raises(dblock.DBLockError, match="still open"):
            holder.call(lock.release())
        assert time.monotonic() - started < 5.0  # refused, not waited for
        assert holder.call(lock.acquire())  # re-entry counts without a statement
        app.commit()
        holder.call(lock.release())
        holder.call(lock.release())
        assert other.info("g:inside") is None


@GUARDED
@pytest.mark.parametrize("kind", ["dbapi", "async-dbapi"])
def test_an_auto_renewed_hold_outlives_a_guard_longer_than_its_lease(
    provider: Provider, table: str, kind: str, loop: Any, other: dblock.Client
) -> None:
    lost: list[Any] = []
    with _side(provider, table, kind, loop) as (app, holder):
        lock = holder.lock("g:outlive", ttl=1.0, auto_renew=True, on_lost=lost.append)
        assert holder.call(lock.acquire())
        app.begin()
        app.guard(lock)
        holder.sleep(2.0)  # the lease is twice over; the row is ours all along
        app.commit()
        deadline = time.monotonic() + 5
        while not lock.held and time.monotonic() < deadline:
            holder.sleep(0.05)
        assert lock.held, "the hold was not renewed after the guarded transaction"
        assert lost == []
        info = other.info("g:outlive")
        assert info is not None and info.owner == lock.owner
        assert not other.lock("g:outlive", ttl=30).acquire(blocking=False)
        holder.call(lock.release())  # no LockLost: the hold never lapsed for anyone


@GUARDED
@pytest.mark.parametrize("kind", ["dbapi", "async-dbapi"])
def test_lock_many_guards_every_key(
    provider: Provider, table: str, kind: str, loop: Any, other: dblock.Client
) -> None:
    provider.require("ManyKeys")
    with _side(provider, table, kind, loop) as (app, holder):
        held = holder.client.lock_many(["g:m1", "g:m2", "g:m3"], ttl=30)
        assert holder.call(held.acquire())
        app.begin()
        app.guard(held)
        app.commit()
        assert other.force_release("g:m2")
        app.begin()
        with pytest.raises(dblock.LockLost):
            app.guard(held)
        app.rollback()


@GUARDED
def test_what_guard_refuses(
    provider: Provider, table: str, loop: Any, client: dblock.Client, tmp_path: Path
) -> None:
    assert provider.url is not None
    app = App(provider.url, "dbapi")
    try:
        lock = client.lock("g:refuse", ttl=30)
        with pytest.raises(dblock.NotHeld):
            lock.guard(app.conn)
        assert lock.acquire()
        with pytest.raises(TypeError, match="conn must be"):
            lock.guard(object())
        import sqlite3

        foreign = sqlite3.connect(str(tmp_path / "other.sqlite3"))
        if provider.dialect != "sqlite":
            with pytest.raises(dblock.ConfigurationError, match="sqlite connection"):
                lock.guard(foreign)
        else:
            foreign.execute("BEGIN")
            with pytest.raises(dblock.ConfigurationError, match="not in the database of conn"):
                lock.guard(foreign)
        foreign.close()
        from tests._servers import raw_connect

        auto = raw_connect(provider.url)  # autocommit, no transaction open
        with pytest.raises(dblock.ConfigurationError, match="autocommit"):
            lock.guard(auto)
        auto.close()
        async_app = App(provider.url, "async-dbapi", loop)
        with pytest.raises(TypeError, match="asyncio connection"):
            lock.guard(async_app.conn)
        async_app.close()
        lock.release()
    finally:
        app.close()


@GUARDED
@pytest.mark.needs("SessionHolds")
def test_a_session_hold_has_no_row_to_guard(provider: Provider, client: dblock.Client) -> None:
    assert provider.url is not None
    app = App(provider.url, "dbapi")
    try:
        with client.lock("g:session", ttl=None) as lock:
            app.begin()
            with pytest.raises(dblock.ConfigurationError, match="session hold"):
                lock.guard(app.conn)
            app.rollback()
    finally:
        app.close()


# -- a holder paused inside its guarded transaction (another process) ---------------------------
HOLDER = """
import asyncio, sys, time
import dblock
from tests.contract._guard_kit import App

url, table, business, kind = sys.argv[1:5]
loop = asyncio.new_event_loop() if kind.startswith("async") else None
app = App(url, kind, loop)
opened = dblock.connect_async(url, table=table) if loop else dblock.connect(url, table=table)
client = app.run(opened)
lock = client.lock("g:paused", ttl=1.0)
assert app.run(lock.acquire())
app.begin()
app.guard(lock)
app.write(business, "first")
print("guarded", flush=True)
sys.stdin.readline()  # the test stops this process here, past the lease, then lets it go on
print("committing", time.time(), flush=True)
app.commit()
try:
    app.run(lock.release())
except dblock.LockLost:
    pass
app.run(client.close()) if loop else client.close()
app.close()
"""


@GUARDED
@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "paused"),
    [("dbapi", 1.5), ("async-dbapi", 1.5), ("dbapi", 7.0)],
    ids=["dbapi", "async-dbapi", "dbapi-long"],
)
def test_a_holder_paused_inside_its_guarded_transaction_holds_off_the_next(
    provider: Provider, table: str, kind: str, paused: float, other: dblock.Client
) -> None:
    """SIGSTOP after guard and before COMMIT, past the lease: the next holder's acquire waits
    until the paused transaction ends, and the two transactions' writes are serialised. The
    long pause outlasts a statement's 5 s bound: the waiter still waits (no BackendError),
    and a try-once meanwhile answers False."""
    assert provider.url is not None
    app = App(provider.url, "dbapi")
    business = app.create_table()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'src'}"}
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, provider.url, table, business, kind],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "guarded"
        freeze(proc.pid)
        time.sleep(1.5)  # its lease is over; it still holds the row in its transaction

        def next_holder() -> float:
            lock = other.lock("g:paused", ttl=30)
            assert lock.acquire(timeout=60)
            got = time.time()
            app.begin()
            app.guard(lock)
            app.write(business, "second")
            app.commit()
            lock.release()
            return got

        t, out = _in_thread(next_holder)
        t.join(paused)
        assert t.is_alive(), f"the next holder did not wait for the paused transaction: {out}"
        assert not other.lock("g:paused", ttl=30).acquire(blocking=False)
        os.kill(proc.pid, signal.SIGCONT)
        proc.stdin.write("\n")
        proc.stdin.flush()
        committing = float(proc.stdout.readline().split()[1])
        t.join(60)
        assert len(out) == 1 and isinstance(out[0], float), out
        assert out[0] >= committing, "the next holder got the key before the paused commit"
        assert app.rows(business) == [(1, "first"), (2, "second")]
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()
        app.drop(business)
        app.close()


@pytest.mark.needs("blocking")
def test_guard_needs_a_sql_store(provider: Provider, client: dblock.Client) -> None:
    if provider.has("CommitGuards"):
        pytest.skip(f"provider {provider.name} has CommitGuards")
    with client.lock("g:nosql", ttl=30) as lock:
        with pytest.raises(dblock.ConfigurationError, match="CommitGuards"):
            lock.guard(object())
