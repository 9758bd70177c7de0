"""The contract suite's provider of the Redis store (collected by tests/providers.py)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import dblock
from tests._servers import REDIS_URL, raw_connect
from tests.stores._provider import SERVER, Entry, Provider, check_server


def _private_redis(root: Path) -> contextlib.AbstractContextManager[Any]:
    from tests._private_servers import private_redis

    return private_redis(root)


def _redis_kill_tagged(provider: Provider, client: dblock.Client, _tag: str) -> int:
    """Kills every connection of the client's store, its pub/sub listener's too (all carry
    the store's own client name)."""
    from tests._internals import store_of

    name = store_of(client)._options["client_name"]
    assert provider.url is not None
    conn = raw_connect(provider.url)
    try:
        ids = [c["id"] for c in conn.client_list() if c.get("name") == name]
        for sid in ids:
            conn.client_kill_filter(_id=sid)
        return len(ids)
    finally:
        conn.close()


PROVIDERS = (
    Entry(
        name="redis",
        store="dblock.stores.redis.store:RedisStore",
        # no SQL, no file, nothing durable: a Redis without persistence forgets on a restart
        markers=frozenset({"url", "processes", "cli", "pool", "handover", "demo"}) | SERVER,
        dialect="redis",
        url=lambda _tmp: REDIS_URL,
        default_port=6379,
        check=check_server("redis"),
        private=_private_redis,
        kill_tagged=_redis_kill_tagged,
    ),
)
