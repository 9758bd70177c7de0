"""A waiting thread of the blocking client hears its hand-over on a pub/sub connection of its
own (stores/redis/waiter.py), not through the client's listener thread; the async client,
and threads beyond ``MAX_OWN``, wait through the listener."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import dblock
from dblock.stores.redis import waiter as _redis_waiter
from tests._internals import store_of
from tests._servers import raw_redis


def _entry_channel(raw: Any, store: Any, key: str, timeout: float = 30) -> str:
    """The channel named by the one queue entry of ``key``, once it exists."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        entries = raw.hgetall(f"{store.prefix}h:{key}")
        if entries:
            (value,) = entries.values()
            return str(value.split(" ", 6)[6])
        time.sleep(0.01)
    raise AssertionError(f"no queue entry of {key!r} appeared")


@contextlib.contextmanager
def _holder_and_waiter(url: str, table: str) -> Iterator[tuple[Any, Any, Any, dblock.Client]]:
    """(a plain client of the server, the waiting client's store, a holder's lock of "k", the
    waiting client)."""
    raw = raw_redis(url)
    try:
        with (
            dblock.connect(url, table=table) as holder_client,
            dblock.connect(url, table=table) as waiter_client,
        ):
            yield raw, store_of(waiter_client), holder_client.lock("k", ttl=30), waiter_client
    finally:
        raw.close()


def _take(client: dblock.Client, key: str, got: list[int]) -> None:
    """Take ``key`` (its token into ``got``) and release it."""
    lock = client.lock(key, ttl=30)
    assert lock.acquire(timeout=60)
    assert lock.token is not None
    got.append(lock.token)
    lock.release()


def _waiting(client: dblock.Client, key: str, got: list[int]) -> threading.Thread:
    thread = threading.Thread(target=_take, args=(client, key, got))
    thread.start()
    return thread


def _waiting_twice(
    client: dblock.Client, got: list[int], between: threading.Event, again: threading.Event
) -> threading.Thread:
    """A thread that takes "k" twice (each token into ``got``), setting ``between`` after
    the first and waiting for ``again`` before the second."""

    def twice() -> None:
        _take(client, "k", got)
        between.set()
        again.wait(60)
        _take(client, "k", got)

    thread = threading.Thread(target=twice)
    thread.start()
    return thread


def test_a_waiting_thread_takes_its_hand_over_on_its_own_connection(url: str, table: str) -> None:
    """The waiter's queue entry names a channel only its own connection listens to, and the
    hand-over reaches it there with the client's listener stopped. A second wait of the same
    thread uses the same connection (no subscribe per wait)."""
    with _holder_and_waiter(url, table) as (raw, store, holder, waiter_client):
        got: list[int] = []
        channels: list[str] = []
        between, held_again = threading.Event(), threading.Event()
        holder.acquire()
        thread = _waiting_twice(waiter_client, got, between, held_again)
        channel = _entry_channel(raw, store, "k")
        channels.append(channel)
        listener = store._listener
        assert listener is not None and channel != listener.channel
        assert raw.pubsub_numsub(channel) == [(channel, 1)]
        listener.stop()  # from here on, only the waiter's own connection can wake it
        first = holder.token
        holder.release()
        assert between.wait(30), "the waiter did not get the lock"
        holder.acquire()  # the second wait
        held_again.set()
        channels.append(_entry_channel(raw, store, "k"))
        holder.release()
        thread.join(60)
        assert not thread.is_alive()
        assert first is not None and len(got) == 2 and first < got[0] < got[1]
        assert channels[0] == channels[1]


def test_messages_left_from_an_earlier_wait_do_not_hand_over_the_next(url: str, table: str) -> None:
    """A thread's connection is not drained before its next wait: a hand-over to an owner of
    an earlier acquire and rings left unread on its channel make the next wait look again at
    most, never take the lock while another client holds it."""
    with _holder_and_waiter(url, table) as (raw, store, holder, waiter_client):
        got: list[int] = []
        between, held_again = threading.Event(), threading.Event()
        holder.acquire()
        thread = _waiting_twice(waiter_client, got, between, held_again)
        channel = _entry_channel(raw, store, "k")
        holder.release()
        assert between.wait(30), "the first wait did not get the lock"
        for stale in (f"={2**62} {store.prefix}earlier-owner k", " k", "earlier-owner k"):
            assert raw.publish(channel, stale) == 1  # the waiting thread's connection only
        holder.acquire()
        held_again.set()
        assert _entry_channel(raw, store, "k") == channel
        time.sleep(0.5)  # the stale messages are read by now
        assert len(got) == 1, "the second wait took the lock while the holder held it"
        second = holder.token
        holder.release()
        thread.join(60)
        assert not thread.is_alive()
        assert second is not None and len(got) == 2 and got[0] < second < got[1]


def test_threads_beyond_the_own_connections_wait_through_the_listener(
    url: str, table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With room for two own connections, five waiting threads all get the lock in turn: two
    hear their hand-overs on their own connections, three through the listener."""
    monkeypatch.setattr(_redis_waiter, "MAX_OWN", 2)
    with _holder_and_waiter(url, table) as (raw, store, holder, waiter_client):
        holder.acquire()
        got: list[int] = []
        threads = [_waiting(waiter_client, "k", got) for _ in range(5)]
        deadline = time.monotonic() + 30
        while raw.hlen(f"{store.prefix}h:k") < 5:
            assert time.monotonic() < deadline, "the five waiters did not queue"
            time.sleep(0.01)
        named = [v.split(" ", 6)[6] for v in raw.hgetall(f"{store.prefix}h:k").values()]
        listener = store._listener
        assert listener is not None
        assert sorted(c == listener.channel for c in named) == [False, False, True, True, True]
        holder.release()
        for thread in threads:
            thread.join(60)
            assert not thread.is_alive()
        assert len(got) == 5 and len(set(got)) == 5


def test_the_async_client_waits_through_the_listener(url: str, table: str) -> None:
    """Its waits run on the event loop's runtime: no connection of their own."""
    import asyncio

    async def scenario() -> None:
        raw = raw_redis(url)
        async with await dblock.connect_async(url, table=table) as client:
            holder = client.lock("k", ttl=30)
            await holder.acquire()
            waiter = client.lock("k", ttl=30)

            async def wait() -> bool:
                ok = await waiter.acquire(timeout=60)
                await waiter.release()
                return ok

            task = asyncio.ensure_future(wait())
            store = store_of(client)
            for _ in range(3000):
                if raw.hlen(f"{store.prefix}h:k"):
                    break
                await asyncio.sleep(0.01)
            (value,) = raw.hgetall(f"{store.prefix}h:k").values()
            assert value.split(" ", 6)[6] == store._listener.channel
            await holder.release()
            assert await task
        raw.close()

    asyncio.run(scenario())


def test_a_thread_that_ends_gives_its_connection_back(
    url: str, table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Threads that waited once and ended do not keep their connections: with room for one,
    a waiting thread after another that ended still gets a connection of its own."""
    import gc

    monkeypatch.setattr(_redis_waiter, "MAX_OWN", 1)
    with _holder_and_waiter(url, table) as (raw, store, holder, waiter_client):
        channels = []
        for _ in range(2):
            holder.acquire()
            got: list[int] = []
            thread = _waiting(waiter_client, "k", got)
            channels.append(_entry_channel(raw, store, "k"))
            holder.release()
            thread.join(60)
            assert got
            gc.collect()
        listener = store._listener
        assert listener is not None and listener.channel not in channels
        assert len(set(channels)) == 2
        assert raw.pubsub_numsub(channels[0]) == [(channels[0], 0)]  # closed with its thread
