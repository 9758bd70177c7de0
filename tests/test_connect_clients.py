"""``dblock.connect(client)`` / ``connect_async(client)`` with a client the application already
holds (a redis.Redis, a started KazooClient, a psycopg_pool pool), on the real servers: a
lock, contention with a URL client on the same table, tokens, the client left open and usable
by close(), no secret shown, and a TypeError naming what is accepted for anything else."""

from __future__ import annotations

import asyncio
import re
import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import dblock
from tests._servers import POSTGRESQL_URL, REDIS_URL, ZOOKEEPER_URL, require_server

ACCEPTED = (
    "a psycopg_pool.ConnectionPool (AsyncConnectionPool for connect_async), a redis.Redis, or a "
    "kazoo.client.KazooClient"
)


def _redis() -> tuple[Any, Callable[[Any], None], str]:
    redis = pytest.importorskip("redis")
    require_server("redis", REDIS_URL)
    client = redis.Redis.from_url(REDIS_URL)  # replies as bytes: dblock decodes them
    return client, lambda c: c.ping(), REDIS_URL


def _kazoo() -> tuple[Any, Callable[[Any], None], str]:
    kazoo = pytest.importorskip("kazoo.client")
    require_server("zookeeper", ZOOKEEPER_URL)
    hosts = ZOOKEEPER_URL.split("://", 1)[1]
    client = kazoo.KazooClient(hosts=hosts)
    client.start(timeout=10)
    client.ensure_path("/")
    return client, lambda c: c.get_children("/"), ZOOKEEPER_URL


def _pg_pool() -> tuple[Any, Callable[[Any], None], str]:
    pool_mod = pytest.importorskip("psycopg_pool")
    require_server("postgresql", POSTGRESQL_URL)
    pool = pool_mod.ConnectionPool(POSTGRESQL_URL, min_size=1, max_size=3, open=True)

    def use(p: Any) -> None:
        with p.connection() as conn:
            assert conn.execute("SHOW synchronous_commit").fetchone() is not None
            assert conn.autocommit is False  # what dblock pinned was restored

    return pool, use, POSTGRESQL_URL


def _close(client: Any) -> None:
    for name in ("stop", "close"):
        getattr(client, name, lambda: None)()


CLIENTS = {"redis": _redis, "zookeeper": _kazoo, "postgresql": _pg_pool}


@pytest.fixture(params=sorted(CLIENTS))
def held(request: pytest.FixtureRequest) -> Iterator[tuple[Any, Callable[[Any], None], str]]:
    client, use, url = CLIENTS[request.param]()
    try:
        yield client, use, url
    finally:
        _close(client)


def test_a_borrowed_client_locks_against_a_url_client_and_stays_open(
    held: tuple[Any, Callable[[Any], None], str],
) -> None:
    client, use, url = held
    table = f"clients_{secrets.token_hex(4)}"
    borrowed = dblock.connect(client, table=table)
    other = dblock.connect(url, table=table)
    try:
        assert borrowed.dialect == other.dialect
        with borrowed.lock("k", ttl=10) as first:
            token = first.token
            assert token is not None
            assert not other.lock("k").acquire(blocking=False)  # same table, same key
            assert [i.key for i in other.list()] == ["k"]
        with other.lock("k", ttl=10, timeout=5) as second:
            assert second.token is not None and second.token > token
            assert not borrowed.lock("k").acquire(blocking=False)
            assert [i.key for i in borrowed.list()] == ["k"]  # str keys, decoded
        assert borrowed.purge(0) >= 1
    finally:
        borrowed.close()
        other.close()
    use(client)  # the application's client still works after dblock's close()


def test_connect_async_takes_the_same_clients(
    held: tuple[Any, Callable[[Any], None], str],
) -> None:
    client, use, url = held
    if type(client).__module__.startswith("psycopg_pool"):
        pool_mod = pytest.importorskip("psycopg_pool")

        async def main() -> None:
            with pytest.raises(TypeError, match="AsyncConnectionPool"):
                await dblock.connect_async(client)
            async with pool_mod.AsyncConnectionPool(
                url, min_size=1, max_size=2, open=False
            ) as apool:
                await _lock_async(apool)
                async with apool.connection() as conn:
                    await conn.execute("SELECT 1")

    else:

        async def main() -> None:
            await _lock_async(client)

    asyncio.run(main())
    use(client)


async def _lock_async(client: Any) -> None:
    table = f"clients_{secrets.token_hex(4)}"
    async with await dblock.connect_async(client, table=table) as c:
        async with c.lock("k", ttl=10) as lock:
            assert lock.token is not None
            other = asyncio.create_task(c.lock("k").acquire(blocking=False))
            assert not await other  # another task's try
            assert [i.key for i in await c.list()] == ["k"]


def test_no_secret_of_the_pool_is_shown() -> None:
    pool_mod = pytest.importorskip("psycopg_pool")
    require_server("postgresql", POSTGRESQL_URL)
    # trust auth: the password is sent and ignored; dblock must not show it anywhere
    pool = pool_mod.ConnectionPool(POSTGRESQL_URL, kwargs={"password": "S3cretPw"}, open=True)
    try:
        with dblock.connect(pool, table="clients_secret") as c:
            assert "S3cretPw" not in c.url + repr(c) and "***" in c.url
    finally:
        pool.close()


@pytest.mark.parametrize(
    "make",
    [
        object,
        lambda: b"redis://127.0.0.1",
        lambda: pytest.importorskip("redis").RedisCluster.__new__(
            pytest.importorskip("redis").RedisCluster
        ),
        lambda: pytest.importorskip("redis.asyncio").Redis(),
    ],
    ids=["object", "bytes", "RedisCluster", "redis.asyncio.Redis"],
)
def test_anything_else_is_a_type_error_naming_what_is_accepted(make: Callable[[], Any]) -> None:
    with pytest.raises(TypeError, match=re.escape(ACCEPTED)):
        dblock.connect(make())


def test_a_client_dblock_cannot_honour_is_refused_saying_why() -> None:
    redis = pytest.importorskip("redis")
    with pytest.raises(dblock.ConfigurationError, match="protocol=2"):
        dblock.connect(redis.Redis(protocol=3))
    with pytest.raises(dblock.ConfigurationError, match="not connected"):
        dblock.connect(pytest.importorskip("kazoo.client").KazooClient(hosts="127.0.0.1:1"))


def test_import_dblock_still_loads_no_driver() -> None:
    code = (
        "import sys, dblock; bad = [m for m in ('redis', 'kazoo', 'psycopg', 'psycopg_pool') "
        "if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
