"""CommitGuards on SQLite (``lock.guard(conn)``, issue 50), at the store level: the store's
guard statement run in an application's own transaction, on a sqlite3 connection of its own
to the lock file, beside a dblock client; and the renewal of a hold a guard kept."""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest

import dblock
from dblock._contract import CommitGuards, provides
from tests._internals import store_of

T = TypeVar("T")
TTL = 30.0
#: a lease that runs out while a test waits for it (long enough to be guarded while live)
SHORT = 1.5


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "locks.sqlite3"


@pytest.fixture
def url(path: Path) -> str:
    return f"sqlite:///{path}"


@pytest.fixture
def table() -> str:
    return "t_" + uuid.uuid4().hex[:16]


@pytest.fixture
def client(url: str, table: str) -> Iterator[dblock.Client]:
    with dblock.connect(url, table=table) as c:
        yield c


@pytest.fixture
def app(path: Path, client: dblock.Client) -> Iterator[sqlite3.Connection]:
    """The application's own connection to the lock file (the client made the file)."""
    conn = sqlite3.connect(path, timeout=5)
    yield conn
    conn.close()


def _guard(app: sqlite3.Connection, store: Any, owner: str, tokens: Mapping[str, int]) -> int:
    """The guard's count in ``app``'s transaction: rows changed (or returned, as the store
    says) by guard_sql over ``tokens``."""
    params: dict[str, object] = {"owner": owner}
    for i, (key, token) in enumerate(tokens.items()):
        params[f"k{i}"], params[f"t{i}"] = key, token
    cur = app.execute(store.guard_sql(len(tokens)), params)
    return len(cur.fetchall()) if store.guard_counts == "rows" else int(cur.rowcount)


def _held(lock: dblock.Lock) -> tuple[str, dict[str, int]]:
    assert lock.acquire(blocking=False)
    assert lock.token is not None
    return lock.owner, {lock.key: lock.token}


def _expire(store: Any, key: str) -> None:
    """Wait until ``key``'s lease has run out on SQLite's clock."""
    deadline = time.monotonic() + 10
    while store.info(key) is not None:
        assert time.monotonic() < deadline, "the lease did not run out"
        time.sleep(0.05)


def _pending(future: Future[T], then: Callable[[], object]) -> T:
    """``future`` is still waiting ~0.5 s on; after ``then()`` it finishes: its result."""
    time.sleep(0.5)
    assert not future.done(), "the guarded row did not hold off the other writer"
    then()
    return future.result(timeout=15)


def test_store_declares_commit_guards(client: dblock.Client) -> None:
    store = store_of(client)
    assert provides(store, CommitGuards)
    assert (store.guard_paramstyle, store.guard_counts) == ("named", "rowcount")
    assert store.guard_sql(3) is store.guard_sql(3)  # built once per count of keys


def test_guard_counts_each_live_hold_and_nothing_else(
    client: dblock.Client, app: sqlite3.Connection
) -> None:
    """In the application's open transaction the guard changes one row per live hold of
    the owner, and none for a wrong token, another owner, or a lease that ran out; it
    changes nothing in the rows."""
    store = store_of(client)
    owner, tokens = _held(client.lock("a", ttl=TTL))
    other, other_tokens = _held(client.lock("b", ttl=TTL))
    expired_owner, expired = _held(client.lock("c", ttl=SHORT))
    many = client.lock_many(["m1", "m2", "m3"], ttl=TTL)
    assert many.acquire(blocking=False) and many.tokens is not None
    many_tokens = many.tokens
    before = {k: store.info(k) for k in ("a", "b", "m1", "m2", "m3")}
    _expire(store, "c")

    app.execute("BEGIN")
    assert _guard(app, store, owner, tokens) == 1
    assert _guard(app, store, owner, {"a": tokens["a"] + 1}) == 0  # a wrong token
    assert _guard(app, store, owner, {"a": tokens["a"] - 1}) == 0
    assert _guard(app, store, other, tokens) == 0  # another owner's hold of its own key
    assert _guard(app, store, owner, other_tokens) == 0  # the owner's token, another owner
    assert _guard(app, store, expired_owner, expired) == 0  # the lease ran out
    assert _guard(app, store, owner, {"nowhere": 1}) == 0
    assert _guard(app, store, many.owner, many_tokens) == 3
    assert _guard(app, store, many.owner, {**many_tokens, "m2": many_tokens["m2"] + 1}) == 2
    app.commit()

    # a no-op write: owners, tokens and leases are as they were
    assert {k: store.info(k) for k in before} == before


def test_guard_holds_off_every_other_writer_until_the_transaction_ends(
    client: dblock.Client, app: sqlite3.Connection, url: str, table: str
) -> None:
    """While the guarding transaction is open nobody else writes the file: a takeover of
    the key whose lease ran out meanwhile fails or waits, and so does a force_release;
    after COMMIT (or ROLLBACK) they go through."""
    store = store_of(client)
    lock = client.lock("k", ttl=SHORT)
    owner, tokens = _held(lock)
    with dblock.connect(url, table=table) as other, ThreadPoolExecutor(1) as worker:

        def take(blocking: bool) -> tuple[bool, str | None]:
            # a client of its own, its own connection, another thread
            taker = other.lock("k", ttl=TTL, timeout=10)
            got = taker.acquire(blocking=blocking)
            info = other.info("k")
            return got, None if info is None else info.owner

        app.execute("BEGIN")
        assert _guard(app, store, owner, tokens) == 1
        _expire(store, "k")  # nobody holds the key now, but it is not to be taken yet
        assert worker.submit(take, False).result(timeout=15) == (False, None)
        got, taker = _pending(worker.submit(take, True), app.commit)
        assert got and taker not in (None, owner)

        held = client.lock("f", ttl=TTL)
        owner, tokens = _held(held)
        app.execute("BEGIN")
        assert _guard(app, store, owner, tokens) == 1
        assert _pending(worker.submit(store.force_release, "f"), app.commit)
        assert store.info("f") is None

        owner, tokens = _held(client.lock("r", ttl=TTL))
        app.execute("BEGIN")
        assert _guard(app, store, owner, tokens) == 1
        assert _pending(worker.submit(store.force_release, "r"), app.rollback)
        assert store.info("r") is None


def test_renew_after_guard_extends_a_hold_still_named_even_if_it_ran_out(
    client: dblock.Client, url: str, table: str
) -> None:
    """The renewal after a guard: each row that still names the owner and its token gets a
    fresh lease, live or not; a row taken since, force-released or missing makes it False,
    and one such key among several does too."""
    store = store_of(client)
    owner, tokens = _held(client.lock("a", ttl=SHORT))
    _expire(store, "a")
    assert not store.renew("a", owner, tokens["a"], TTL)  # a plain renewal refuses it
    assert store.renew_after_guard(tokens, owner, TTL)
    assert store.renew_after_guard(tokens, owner, TTL)  # again, as a retry would
    info = store.info("a")
    assert info is not None and (info.owner, info.token) == (owner, tokens["a"])
    assert info.expires_at.timestamp() > time.time() + TTL - 5

    assert not store.renew_after_guard({"a": tokens["a"] + 1}, owner, TTL)
    assert not store.renew_after_guard(tokens, "someone else", TTL)

    # taken by another owner once it ran out
    old_owner, old = _held(client.lock("b", ttl=SHORT))
    _expire(store, "b")
    with dblock.connect(url, table=table) as other:
        thief = other.lock("b", ttl=TTL)
        assert thief.acquire(blocking=False)
        assert not store.renew_after_guard(old, old_owner, TTL)
        info = store.info("b")
        assert info is not None and info.owner == thief.owner
        thief.release()

    # force-released, and never taken
    gone_owner, gone = _held(client.lock("c", ttl=TTL))
    assert store.force_release("c")
    assert not store.renew_after_guard(gone, gone_owner, TTL)
    assert store.info("c") is None
    assert not store.renew_after_guard({"missing": 1}, owner, TTL)

    # several keys: all still named, or False
    many = client.lock_many(["m1", "m2", "m3"], ttl=SHORT)
    assert many.acquire(blocking=False) and many.tokens is not None
    many_owner, many_tokens = many.owner, many.tokens
    _expire(store, "m3")
    assert store.renew_after_guard(many_tokens, many_owner, TTL)
    assert all(store.info(k) is not None for k in many_tokens)
    assert not store.renew_after_guard(
        {**many_tokens, "m2": many_tokens["m2"] + 1}, many_owner, TTL
    )
    assert store.force_release("m1")
    assert not store.renew_after_guard(many_tokens, many_owner, TTL)
    assert store.renew_after_guard({}, many_owner, TTL)


def test_guard_identity_names_the_stores_file_and_no_other(
    client: dblock.Client, app: sqlite3.Connection, path: Path, tmp_path: Path
) -> None:
    """What guard_identity reads on a connection is identity() for a connection to the
    store's file (by any name of it), and something else for another database."""
    store = store_of(client)

    def identity(conn: sqlite3.Connection) -> str | None:
        rows = conn.execute(store.guard_identity_sql()).fetchall()
        assert len(rows) == 1
        named: str | None = store.guard_identity(rows[0])
        return named

    mine = store.identity()
    assert mine is not None
    assert identity(app) == mine
    link = tmp_path / "link.sqlite3"
    link.symlink_to(path)
    with_link = sqlite3.connect(link)
    try:
        assert identity(with_link) == mine  # the file, not its name
    finally:
        with_link.close()

    other = sqlite3.connect(tmp_path / "other.sqlite3")
    try:
        other.execute("CREATE TABLE x (a)")
        assert identity(other) not in (None, mine)
    finally:
        other.close()
    memory = sqlite3.connect(":memory:")
    try:
        assert identity(memory) is None  # no file: cannot tell
    finally:
        memory.close()


def test_a_guard_on_another_file_with_the_same_table_is_a_configuration_error(
    url: str, table: str, tmp_path: Path
) -> None:
    """The other file has a lock table of the same name (so the statement runs and finds no
    row): the guard tells the other database from a lost hold by the files' identities."""
    other_url = f"sqlite:///{tmp_path / 'other.sqlite3'}"
    with dblock.connect(url, table=table) as client, dblock.connect(other_url, table=table):
        lock = client.lock("k", ttl=TTL)
        assert lock.acquire()
        conn = sqlite3.connect(str(tmp_path / "other.sqlite3"))
        try:
            with pytest.raises(dblock.ConfigurationError, match="another database"):
                lock.guard(conn)
            conn.rollback()
        finally:
            conn.close()
        assert lock.held  # not taken for lost
        lock.release()
