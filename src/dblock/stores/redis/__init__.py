"""The Redis store: one Lua script per operation, pub/sub wake-ups, on redis-py.

``store.py`` is the store, ``scripts.py`` its scripts, ``waiter.py`` the pub/sub connections
of the blocking client's waiters. This module holds only the registry's entry (no driver is
imported here)."""

from __future__ import annotations

from ..._url import server_url
from .._entry import StoreEntry

ENTRY = StoreEntry(
    name="redis",
    title="Redis",
    schemes=("redis", "rediss"),
    usage="redis://user:password@host:port/0",
    store="dblock.stores.redis.store:RedisStore",
    parse=server_url,
    extra="redis",
    clients=("redis.client.Redis",),
    borrow="dblock.stores.redis.borrowed:borrow",
    client_help="a redis.Redis",
    client_refusals=(
        (
            "redis.asyncio.client.Redis",
            "dblock's Redis store runs redis-py's blocking client (on worker threads under "
            "connect_async): pass a redis.Redis on the same server",
        ),
        (
            "redis.cluster.RedisCluster",
            "dblock keeps a table's keys on one Redis server; a Redis Cluster is not supported",
        ),
        (
            "redis.asyncio.cluster.RedisCluster",
            "dblock keeps a table's keys on one Redis server; a Redis Cluster is not supported",
        ),
    ),
    drivers=("redis", "hiredis"),
)
