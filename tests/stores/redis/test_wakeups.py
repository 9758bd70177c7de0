"""Wake-ups by push: a release hands the lock to the head waiter and publishes it to the
waiter's client, whose listener wakes it; when the listener's connection drops it reconnects,
and meanwhile waiters look again and poll."""

from __future__ import annotations

import threading
import time
import uuid

import dblock
from tests._internals import store_of
from tests._private_servers import PrivateServer
from tests._servers import raw_redis


def test_a_release_wakes_the_waiter_through_its_subscription(url: str, table: str) -> None:
    """``wait(60)`` returns True only if woken: a poll timeout would return False. The token
    comes in the message: the waiter holds the lock without a try of its own."""
    with (
        dblock.connect(url, table=table) as holder_client,
        dblock.connect(url, table=table) as waiter_client,
    ):
        holder = holder_client.lock("k", ttl=30)
        holder.acquire()
        store = store_of(waiter_client)
        owner = "waiter-" + uuid.uuid4().hex
        sub = store.subscribe("k", owner, "lock")
        try:
            assert sub.live and sub.targeted
            store.enqueue("k", owner, "lock", 9.0, lease=30.0)
            holder.release()
            assert sub.wait(60) is True
            assert sub.granted is not None
            info = waiter_client.info("k")
            assert info is not None and (info.owner, info.token) == (owner, sub.granted)
            assert store.release("k", owner, sub.granted)
        finally:
            sub.close()


def test_waiters_wake_after_the_subscription_is_killed(server: PrivateServer) -> None:
    """CLIENT KILL TYPE pubsub from outside: the listener connects again, and a waiter that was
    waiting through it gets the lock when it is released."""
    with (
        dblock.connect(server.url, table="w") as holder_client,
        dblock.connect(server.url, table="w") as waiter_client,
    ):
        holder = holder_client.lock("k", ttl=30)
        holder.acquire()
        got: list[int | None] = []

        def wait() -> None:
            lock = waiter_client.lock("k", ttl=30)
            if lock.acquire(timeout=60):
                got.append(lock.token)
                lock.release()

        thread = threading.Thread(target=wait)
        thread.start()
        store = store_of(waiter_client)
        deadline = time.monotonic() + 30
        while not (store._listener and store._listener.ready()) and time.monotonic() < deadline:
            time.sleep(0.01)
        listener = store._listener
        assert listener is not None and listener.connections == 1
        raw = raw_redis(server.url)
        assert raw.client_kill_filter(_type="pubsub") >= 1
        while listener.connections < 2 or not listener.ready():
            assert time.monotonic() < deadline, "the listener did not connect again"
            time.sleep(0.01)
        raw.close()
        holder.release()
        thread.join(60)
        assert len(got) == 1 and got[0] is not None and holder.token is None
