"""A statement aborted past its deadline leaves nothing behind in the server.

PostgreSQL and MariaDB do not notice a client gone while its statement waits for a row lock:
once the lock is let go they run the statement to its end and commit it. An acquire that the
watchdog aborted (BackendError, "did not complete within 5 s") would then grant the lock to
an owner nobody knows of, and the key would stay taken until that phantom's lease ran out.
The store ends the statement's server session before it raises, and the acquire ends any
hold it may have committed first.

Each test keeps the key's row locked in a transaction of its own for longer than the
statement deadline (5 s), lets it go after the acquire has failed, and then finds the key
free at once.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import dblock
from tests._servers import MYSQL_URL, POSTGRESQL_URL, drop_tables, raw_connect, require_server

#: the servers' own row-lock waits, unbounded as a URL can ask: these tests stall a statement
#: in the server on a row lock, past its 5 s deadline (dblock's sessions otherwise give up a
#: row lock after 1 s and call the key busy: tests/contract/test_guard.py)
URLS = {
    "postgresql": POSTGRESQL_URL + "?options=-c%20lock_timeout%3D0",
    "mysql": MYSQL_URL + "?init_command=SET%20SESSION%20innodb_lock_wait_timeout%3D50",
}
#: after the row lock is let go, what a phantom grant would need to commit, at most
SETTLE = 1.0


@pytest.fixture(params=sorted(URLS))
def dialect(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def url(dialect: str) -> str:
    url = URLS[dialect]
    require_server(dialect, url)
    return url


@pytest.fixture
def table(url: str) -> Iterator[str]:
    name = "t_" + uuid.uuid4().hex[:16]
    dblock.connect(url, table=name, create_schema=True).close()
    yield name
    drop_tables(url, name)


def _lock_the_row(url: str, table: str, key: str) -> Any:
    """A raw connection whose open transaction holds ``key``'s row locked."""
    raw = raw_connect(url)
    quoted = f'"{table}"' if url.startswith("postgresql") else f"`{table}`"
    if url.startswith("postgresql"):
        raw.execute("BEGIN")
        raw.execute(f"SELECT 1 FROM {quoted} WHERE lock_key = %s FOR UPDATE", (key,))
    else:
        cur = raw.cursor()
        cur.execute("BEGIN")
        assert cur.execute(f"SELECT 1 FROM {quoted} WHERE lock_key = %s FOR UPDATE", (key,)) == 1
    return raw


def _let_go(raw: Any) -> None:
    raw.rollback()
    raw.close()


def _assert_nothing_granted(url: str, table: str, key: str) -> None:
    """After the row lock is let go: no phantom hold appears, and the key can be taken."""
    time.sleep(SETTLE)
    with dblock.connect(url, table=table) as client:
        assert client.info(key) is None, "the failed acquire was granted after all"
        lock = client.lock(key, ttl=60)
        assert lock.acquire(blocking=False)
        lock.release()


def _free_key(url: str, table: str) -> str:
    """A key whose row exists and is free (its hold released)."""
    key = "k-" + uuid.uuid4().hex
    with dblock.connect(url, table=table) as client, client.lock(key, ttl=30):
        pass
    return key


@pytest.mark.slow
def test_an_acquire_aborted_past_its_deadline_grants_nothing_later(url: str, table: str) -> None:
    key = _free_key(url, table)
    raw = _lock_the_row(url, table, key)
    try:
        with dblock.connect(url, table=table) as client:
            started = time.monotonic()
            with pytest.raises(dblock.BackendError, match="did not complete within 5 s"):
                client.lock(key, ttl=60).acquire(timeout=30)
            assert time.monotonic() - started < 15
    finally:
        _let_go(raw)
    _assert_nothing_granted(url, table, key)


@pytest.mark.slow
def test_an_async_acquire_aborted_past_its_deadline_grants_nothing_later(
    url: str, table: str
) -> None:
    key = _free_key(url, table)
    raw = _lock_the_row(url, table, key)

    async def aborted() -> None:
        async with await dblock.connect_async(url, table=table) as client:
            with pytest.raises(dblock.BackendError, match="did not complete within 5 s"):
                await asyncio.wait_for(client.lock(key, ttl=60).acquire(timeout=30), 20)

    try:
        asyncio.run(aborted())
    finally:
        _let_go(raw)
    time.sleep(SETTLE)

    async def after() -> None:
        async with await dblock.connect_async(url, table=table) as client:
            assert await client.info(key) is None, "the aborted acquire was granted after all"
            lock = client.lock(key, ttl=60)
            assert await lock.acquire(blocking=False)
            await lock.release()

    asyncio.run(after())


@pytest.fixture
def short_read_timeout(url: str) -> str:
    """MySQL's URL with a ``read_timeout`` shorter than the statement deadline: PyMySQL's
    socket timeout, not the watchdog, is what gives up on the statement."""
    return url + ("&" if "?" in url else "?") + "read_timeout=2"


@pytest.mark.slow
@pytest.mark.parametrize("dialect", ["mysql"])  # read_timeout is a MySQL URL option
@pytest.mark.parametrize("client_kind", ["sync", "async"])
def test_a_statement_past_the_urls_read_timeout_grants_nothing_later(
    short_read_timeout: str, table: str, client_kind: str
) -> None:
    url = short_read_timeout
    key = _free_key(url, table)
    raw = _lock_the_row(url, table, key)

    async def aborted_async() -> None:
        async with await dblock.connect_async(url, table=table) as client:
            await asyncio.wait_for(client.lock(key, ttl=60).acquire(timeout=30), 20)

    def aborted() -> None:
        if client_kind == "async":
            asyncio.run(aborted_async())
            return
        with dblock.connect(url, table=table) as client:
            client.lock(key, ttl=60).acquire(timeout=30)

    try:
        with pytest.raises(dblock.BackendError, match="timed out"):
            aborted()
    finally:
        _let_go(raw)
    _assert_nothing_granted(url, table, key)
