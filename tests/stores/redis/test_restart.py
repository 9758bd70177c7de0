"""A Redis that keeps nothing on disk, SIGKILLed and started again: every hold is gone, its
holders learn of it, and fencing tokens keep increasing (they come from the server's clock
once the stored counter is lost)."""

from __future__ import annotations

import threading

import pytest

import dblock
from tests._private_servers import PrivateServer
from tests._servers import raw_redis, redis_prefix

pytestmark = pytest.mark.slow


def test_tokens_keep_increasing_across_a_restart_that_lost_everything(
    server: PrivateServer,
) -> None:
    lost = threading.Event()
    with (
        dblock.connect(server.url, table="fence") as holder_client,
        dblock.connect(server.url, table="fence") as other,
    ):
        tokens = []
        lock = holder_client.lock("k", ttl=30)
        for _ in range(5):  # a few tokens issued in quick succession
            lock.acquire()
            tokens.append(lock.token)
            lock.release()
        held = holder_client.lock("k", ttl=1.5, auto_renew=True, on_lost=lambda _l: lost.set())
        held.acquire()
        assert held.token is not None
        tokens.append(held.token)
        server.kill()
        server.start()
        raw = raw_redis(server.url)
        assert raw.dbsize() == 0  # the restart forgot every key, the last token too
        raw.close()
        taker = other.lock("k", ttl=30)
        assert taker.acquire(timeout=10)  # free: the hold was forgotten
        assert taker.token is not None
        assert taker.token > max(tokens)
        assert lost.wait(30)  # the holder's renewal found its hold gone
        assert not held.held
        with pytest.raises(dblock.LockLost):
            held.release()
        taker.release()
    assert tokens == sorted(set(tokens))


def test_a_lost_counter_is_replaced_by_the_clock(url: str, table: str) -> None:
    """The token rule without a restart: the table's counter deleted (as a restart would),
    the next token is still larger."""
    raw = raw_redis(url)
    with dblock.connect(url, table=table) as client:
        lock = client.lock("k", ttl=30)
        lock.acquire()
        first = lock.token
        lock.release()
        assert client.purge(older_than=0) == 1
        raw.delete(redis_prefix(table) + "meta")
        lock.acquire()
        assert lock.token is not None and first is not None and lock.token > first
        lock.release()
    raw.close()
