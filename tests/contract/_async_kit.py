"""What the async cancellation tests share: locks of each waiting kind, and a view of one lock
table from outside the client under test (a fresh blocking client, raw SQL where the provider
has it)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import dblock
from dblock.stores._names import aux_name
from tests._internals import ConnectionTracker, pool_busy, store_of
from tests.providers import Provider

#: the kinds of acquire that wait, and the capabilities each needs
KINDS: dict[str, tuple[str, ...]] = {
    "lock": (),
    "fair": ("FairQueue",),
    "write": ("SharedHolds",),
    "semaphore": ("SharedHolds",),
    "session": ("SessionHolds",),  # ttl=None: the server's own lock
}


def kinds_of(provider: Provider) -> list[str]:
    """The waiting kinds ``provider`` has the capabilities for."""
    return [kind for kind, needs in KINDS.items() if provider.has(*needs)]


def make_lock(client: Any, kind: str, key: str, ttl: float = 30.0) -> Any:
    """A lock of ``kind`` on ``key``, of a blocking or an async client (the same names)."""
    if kind == "lock":
        return client.lock(key, ttl=ttl)
    if kind == "fair":
        return client.lock(key, ttl=ttl, fair=True)
    if kind == "write":
        return client.rwlock(key, ttl=ttl).write_lock()
    if kind == "session":
        return client.lock(key, ttl=None)
    return client.semaphore(key, 1, ttl=ttl)


class Outside:
    """One lock table seen from outside the client under test."""

    def __init__(self, provider: Provider, table: str) -> None:
        self.provider = provider
        self.table = table
        self.client = provider.connect(table=table)

    def holds(self, key: str) -> list[dblock.LockInfo]:
        found = [info for info in self.client.list(key) if info.key == key]
        session = self.client.info(key)  # list() does not show session holds
        if session is not None and session.kind == "session":
            found.append(session)
        return found

    def queued(self, key: str) -> list[Any]:
        """The key's wait-queue entries: every one where the provider has raw SQL (expired
        ones too: a waiter that left must have removed its own), else the live entries of
        its lock queue, as the store reports them."""
        provider = self.provider
        if not provider.has("FairQueue"):
            return []  # the store keeps no wait queue
        if not provider.has("sql"):
            _free, ahead = store_of(self.client).probe(key, "nobody")
            return [None] * ahead
        q, mark = provider.q, provider.mark
        holders = q + aux_name(self.table, "_holders") + q
        conn = provider.raw()
        try:
            cur = conn.cursor()
            cur.execute(
                f"SELECT holder, kind FROM {holders} WHERE lock_key = {mark} AND waiting = 1",
                (key,),
            )
            return list(cur.fetchall())
        finally:
            conn.close()

    def assert_clean(self, key: str, *, but: tuple[str, ...] = ()) -> None:
        """Nobody but the owners ``but`` holds ``key``, and nobody waits for it."""
        holds = [(info.owner, info.kind) for info in self.holds(key) if info.owner not in but]
        assert holds == [], f"holds left on {key!r}"
        assert self.queued(key) == [], f"queue entries left on {key!r}"

    def next_gets(self, kind: str, key: str) -> None:
        """A newcomer gets ``key`` at once (a blocking try), then lets it go."""
        lock = make_lock(self.client, kind, key)
        assert lock.acquire(blocking=False), f"{key!r} is not free for a newcomer"
        lock.release()

    def close(self) -> None:
        self.client.close()


@contextlib.contextmanager
def outside(provider: Provider, table: str) -> Iterator[Outside]:
    view = Outside(provider, table)
    try:
        yield view
    finally:
        view.close()


def assert_quiet(client: Any, tracker: ConnectionTracker) -> None:
    """The async client has nothing in flight: no pooled connection checked out or waited
    for, no connection left open beside its pool and listener, no task lined up."""
    assert pool_busy(client) == (0, 0)
    assert tracker.stray() == []
    assert client._gates == {}


async def cancel_at(task: asyncio.Task[Any], point: float | int) -> None:
    """Cancel ``task`` after ``point``: a float is seconds, an int that many turns of the
    event loop (which land at chosen steps of the acquire, whatever the machine's speed)."""
    if isinstance(point, int):
        for _ in range(point):
            await asyncio.sleep(0)
    else:
        await asyncio.sleep(point)
    task.cancel()
