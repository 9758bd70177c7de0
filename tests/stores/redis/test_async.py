"""The async client on Redis: redis-py's blocking connections on worker threads, so the event
loop never waits on a socket (the contract suite's ``[async]`` runs cover the semantics)."""

from __future__ import annotations

import asyncio

import pytest

import dblock
from tests._internals import store_of

pytest.importorskip("greenlet")


def test_a_waiter_is_woken_by_the_release_while_the_loop_keeps_running(
    url: str, table: str
) -> None:
    async def main() -> tuple[int, int]:
        client = await dblock.connect_async(url, table=table)
        try:
            ticks = 0
            lock = client.lock("k", ttl=30)
            await lock.acquire()

            async def waiter() -> int:
                async with client.lock("k", ttl=30, timeout=30) as held:
                    return held.token

            async def ticker() -> None:
                nonlocal ticks
                while True:
                    ticks += 1
                    await asyncio.sleep(0.01)

            tick = asyncio.create_task(ticker())
            waiting = asyncio.create_task(waiter())
            await asyncio.sleep(0.5)  # the waiter blocks in the store; the loop must not
            assert not waiting.done()
            first = lock.token
            await lock.release()
            token = await asyncio.wait_for(waiting, 10)
            tick.cancel()
            assert token > first
            return ticks, store_of(client)._listener.connections  # type: ignore[union-attr]
        finally:
            await client.close()

    ticks, connections = asyncio.run(main())
    # about 50 on an idle machine, a quarter of it under the suite's load; a frozen loop: 1
    assert ticks >= 5  # the loop ran while the listener and the waiter were blocked
    assert connections == 1
