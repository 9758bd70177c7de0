"""connect_async on Redis: redis.asyncio behind the blocking-looking adapter, the listener as
a task; an async client contends with a blocking one like another process."""

from __future__ import annotations

import asyncio
import threading

import pytest

import dblock
from tests._internals import store_of

pytest.importorskip("greenlet")


def test_async_waiters_are_woken_by_the_listener_task(url: str, table: str) -> None:
    async def main() -> tuple[list[int], bool, str]:
        async with await dblock.connect_async(url, table=table) as client:
            with dblock.connect(url, table=table) as blocking:
                holder = blocking.lock("k", ttl=30)
                await asyncio.to_thread(holder.acquire)

                async def wait() -> int:
                    async with client.lock("k", ttl=10, timeout=30) as lock:
                        assert lock.token is not None
                        return lock.token

                tasks = [asyncio.create_task(wait()) for _ in range(3)]
                await asyncio.sleep(0.3)  # they wait: the key is held
                assert not any(t.done() for t in tasks)
                first = holder.token
                await asyncio.to_thread(holder.release)
                tokens = await asyncio.gather(*tasks)
                listener = store_of(client._sync)._listener
                runtime = listener.rt.name if listener is not None else ""
                assert first is not None
                return [first, *tokens], listener is not None and listener.ready(), runtime

    tokens, ready, runtime = asyncio.run(main())
    assert tokens == sorted(set(tokens))  # each later holder has a larger token
    assert ready and runtime == "asyncio"


def test_a_cancelled_async_waiter_leaves_nothing_behind(url: str, table: str) -> None:
    async def main() -> None:
        async with await dblock.connect_async(url, table=table) as client:
            with dblock.connect(url, table=table) as blocking:
                holder = blocking.lock("k", ttl=30)
                await asyncio.to_thread(holder.acquire)
                task = asyncio.create_task(client.lock("k", ttl=10).acquire(timeout=30))
                await asyncio.sleep(0.3)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                await asyncio.to_thread(holder.release)

                # no queue entry of the cancelled waiter stands ahead of a newcomer
                def newcomer() -> bool:
                    lock = blocking.lock("k", ttl=10)
                    taken = lock.acquire(blocking=False)
                    if taken:
                        lock.release()
                    return taken

                assert await asyncio.to_thread(newcomer)
                assert await client.list() == []

    asyncio.run(main())


def test_async_and_blocking_clients_exclude_each_other(url: str, table: str) -> None:
    inside = 0
    worst = 0
    guard = threading.Lock()

    def enter() -> None:
        nonlocal inside, worst
        with guard:
            inside += 1
            worst = max(worst, inside)

    def leave() -> None:
        nonlocal inside
        with guard:
            inside -= 1

    def blocking_side() -> None:
        with dblock.connect(url, table=table) as client:
            for _ in range(20):
                with client.lock("k", ttl=10, timeout=30):
                    enter()
                    leave()

    async def main() -> None:
        async with await dblock.connect_async(url, table=table) as client:

            async def one() -> None:
                for _ in range(10):
                    async with client.lock("k", ttl=10, timeout=30):
                        enter()
                        await asyncio.sleep(0)
                        leave()

            thread = threading.Thread(target=blocking_side)
            thread.start()
            await asyncio.gather(one(), one())
            await asyncio.to_thread(thread.join)

    asyncio.run(main())
    assert worst == 1
