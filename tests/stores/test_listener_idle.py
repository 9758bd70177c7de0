"""The wake-up listener of PostgreSQL and Redis closes once unused (issue 52): every LISTENing
backend of a database is signalled at each NOTIFY, so a fleet of clients that once waited
must not keep listening. A later wait makes a new listener and is still woken at once."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import dblock
from dblock.stores._listener import Listener
from tests import _pg_crowd
from tests._internals import store_of
from tests._servers import (
    POSTGRESQL_URL,
    REDIS_URL,
    drop_tables,
    raw_connect,
    raw_redis,
    require_server,
)

IDLE = 0.5
#: a waiter that is not woken polls after 3.75 s or more: well beyond this
PUSHED = 2.5


def _pg_listening(table: str) -> int:
    conn = raw_connect(POSTGRESQL_URL)
    try:
        cur = conn.cursor()
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE %s",
            (f'LISTEN "{table}_released"%',),
        )
        return int(cur.fetchone()[0])
    finally:
        conn.close()


def _redis_listening(table: str) -> int:
    r = raw_redis(REDIS_URL)
    try:
        channel = f"dblock:{{{table}}}:released"
        ((_, count),) = r.pubsub_numsub(channel)
        return int(count)
    finally:
        r.close()


STORES: dict[str, tuple[str, Callable[[str], int], Callable[[str], Any] | None]] = {
    "postgresql": (POSTGRESQL_URL, _pg_listening, None),
    "redis": (REDIS_URL, _redis_listening, raw_redis),
}


@pytest.fixture(params=sorted(STORES))
def store(request: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str, Any]]:
    url, listening, raw = STORES[request.param]
    require_server(request.param, url, raw)
    monkeypatch.setattr(Listener, "idle_close", IDLE, raising=False)
    _pg_crowd.dblocks_own(monkeypatch)  # a lone PostgreSQL waiter listens
    table = "t_" + uuid.uuid4().hex[:16]
    try:
        yield url, table, lambda: listening(table)
    finally:
        if request.param == "postgresql":
            drop_tables(url, table)


def _until(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_an_unused_listener_closes_and_the_next_wait_listens_again(
    store: tuple[str, str, Any],
) -> None:
    url, table, listening = store
    with dblock.connect(url, table=table) as holder, dblock.connect(url, table=table) as waiter:
        for _ in range(2):
            lock = holder.lock("job", ttl=30)
            lock.acquire()
            woken: list[float] = []

            def wait(woken: list[float] = woken) -> None:
                mine = waiter.lock("job", ttl=30)
                assert mine.acquire(timeout=20)
                woken.append(time.monotonic())
                mine.release()

            thread = threading.Thread(target=wait, daemon=True)
            thread.start()
            assert _until(lambda: listening() >= 1), "the waiter listens"
            time.sleep(0.2)  # queued behind the holder
            released = time.monotonic()
            lock.release()
            thread.join(20)
            assert woken and woken[0] - released < PUSHED, "woken by the release, not a poll"
            # unused now: it stops listening (PostgreSQL's at once, after a 0.1 s linger;
            # Redis's as it closes), and the listener closes
            assert _until(lambda: listening() == 0), "the idle listener stopped listening"
            assert _until(
                lambda: not store_of(waiter)._listener or not store_of(waiter)._listener.alive()
            ), "the idle listener closed"


def test_an_async_client_s_listener_closes_too(store: tuple[str, str, Any]) -> None:
    url, table, listening = store

    async def main() -> None:
        async with (
            await dblock.connect_async(url, table=table) as holder,
            await dblock.connect_async(url, table=table) as waiter,
        ):
            for _ in range(2):
                lock = holder.lock("job", ttl=30)
                await lock.acquire()
                mine = waiter.lock("job", ttl=30)

                async def take(mine: dblock.AsyncLock = mine) -> float:
                    assert await mine.acquire(timeout=20)
                    woken = time.monotonic()
                    await mine.release()  # a hold is its task's
                    return woken

                task = asyncio.create_task(take())
                for _ in range(200):
                    if await asyncio.to_thread(listening) >= 1:
                        break
                    await asyncio.sleep(0.05)
                await asyncio.sleep(0.2)
                released = time.monotonic()
                await lock.release()
                assert await task - released < PUSHED, "woken by the release, not a poll"
                for _ in range(200):
                    if await asyncio.to_thread(listening) == 0:
                        break
                    await asyncio.sleep(0.05)
                assert await asyncio.to_thread(listening) == 0, "the idle listener closed"

    asyncio.run(main())
