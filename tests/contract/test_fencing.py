"""dblock.fencing: the guarded UPDATE rejects stale tokens on every SQL store."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import dblock
import dblock.fencing
from tests.providers import Provider


@pytest.fixture
def resource(provider: Provider) -> Iterator[tuple[Any, str, str]]:
    """A protected table (id, balance, fence_token) with rows 1 and 2, dropped afterwards."""
    provider.require("sql")
    name = "fenced_" + uuid.uuid4().hex[:12]
    dialect = provider.dialect
    assert dialect is not None
    q = provider.q
    conn = provider.raw()
    cur = conn.cursor()
    cur.execute(
        f"CREATE TABLE {q}{name}{q} (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL, "
        "fence_token BIGINT)"
    )
    cur.execute(f"INSERT INTO {q}{name}{q} (id, balance, fence_token) VALUES (1, 100, NULL)")
    cur.execute(f"INSERT INTO {q}{name}{q} (id, balance, fence_token) VALUES (2, 100, 0)")
    try:
        yield conn, dialect, name
    finally:
        conn.cursor().execute(f"DROP TABLE IF EXISTS {q}{name}{q}")
        conn.close()


def _row(conn: Any, provider: Provider, name: str, rid: int) -> tuple[int, int | None]:
    q, mark = provider.q, provider.mark
    cur = conn.cursor()
    cur.execute(f"SELECT balance, fence_token FROM {q}{name}{q} WHERE id = {mark}", (rid,))
    balance, token = cur.fetchone()
    return int(balance), None if token is None else int(token)


def test_stale_token_rejected_newer_accepted(
    provider: Provider, resource: tuple[Any, str, str]
) -> None:
    conn, dialect, name = resource
    stmt = dblock.fencing.fenced_update(dialect, name, ["balance"], ["id"])
    cur = conn.cursor()
    assert stmt.execute(cur, [90], [1], 5)  # NULL token: first write accepted
    assert _row(conn, provider, name, 1) == (90, 5)
    assert not stmt.execute(cur, [80], [1], 4)  # stale
    assert _row(conn, provider, name, 1) == (90, 5)
    assert stmt.execute(cur, [85], [1], 5)  # equal: the same hold writes again
    assert _row(conn, provider, name, 1) == (85, 5)
    assert stmt.execute(cur, [70], [1], 6)
    assert _row(conn, provider, name, 1) == (70, 6)
    assert not stmt.execute(cur, [80], [1], 5)  # the older token, after a newer one wrote
    assert _row(conn, provider, name, 2) == (100, 0)  # other rows untouched
    assert not stmt.execute(cur, [1], [3], 99)  # a missing row reads as rejected


def test_with_real_lock_tokens(
    provider: Provider, table: str, resource: tuple[Any, str, str]
) -> None:
    """The pattern from the docs: an earlier hold's token loses to a later one."""
    conn, dialect, name = resource
    stmt = dblock.fencing.fenced_update(dialect, name, ["balance"], ["id"])
    with provider.connect(table=table) as client:
        assert client.dialect == dialect
        first = client.lock("acct:2", ttl=0.2)
        assert first.acquire(timeout=5)
        old = first.token
        assert old is not None
        second = client.lock("acct:2", ttl=5, reentrant=False)
        assert second.acquire(timeout=10)  # after the first lease ran out
        new = second.token
        assert new is not None
        assert new > old
        cur = conn.cursor()
        assert stmt.execute(cur, [50], [2], new)
        assert not stmt.execute(cur, [999], [2], old)  # the paused first holder wakes up
        assert _row(conn, provider, name, 2) == (50, new)
        second.release()
        with pytest.raises(dblock.LockLost):
            first.release()


def test_one_hold_writes_many_times_and_a_stale_one_never(
    provider: Provider, table: str, resource: tuple[Any, str, str]
) -> None:
    """The documented pattern under one hold: each of its three writes is accepted (its token
    is the one recorded); the earlier holder, paused past its lease, is refused before and
    after them."""
    conn, dialect, name = resource
    stmt = dblock.fencing.fenced_update(dialect, name, ["balance"], ["id"])
    cur = conn.cursor()
    with provider.connect(table=table) as client:
        stale = client.lock("acct:1", ttl=0.2)
        assert stale.acquire(timeout=5)
        old = stale.token
        assert old is not None
        assert stmt.execute(cur, [95], [1], old)  # the first holder wrote once, in time
        with client.lock("acct:1", ttl=30, reentrant=False, timeout=10) as lock:
            token = lock.token
            assert token is not None and token > old
            for balance in (90, 80, 70):
                assert stmt.execute(cur, [balance], [1], token), balance
                assert not stmt.execute(cur, [999], [1], old)  # the paused holder wakes up
            assert _row(conn, provider, name, 1) == (70, token)
        with pytest.raises(dblock.LockLost):
            stale.release()
