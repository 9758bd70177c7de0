"""Fixtures of the Redis store's own tests: the machine's Redis, and private ones."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import dblock
from tests._private_servers import PrivateServer, private_redis
from tests._servers import REDIS_URL, drop_tables, require_server
from tests.providers import fresh_table


@pytest.fixture(autouse=True, params=["functions", "scripts"])
def operations(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test runs the store's operations as the functions of its library (FCALL) and as
    scripts (EVALSHA), as they run on a server without functions or for a user who may not
    use them: one Lua text, two ways of calling it."""
    if request.param == "scripts":
        from dblock.stores.redis.store import RedisStore

        made = RedisStore.__init__

        def scripts_only(self: RedisStore, *args: Any, **kwargs: Any) -> None:
            made(self, *args, **kwargs)
            self._functions = False

        monkeypatch.setattr(RedisStore, "__init__", scripts_only)
    return str(request.param)


@pytest.fixture
def url() -> str:
    require_server("redis", REDIS_URL)
    return REDIS_URL


@pytest.fixture
def table(url: str) -> Iterator[str]:
    name = fresh_table()
    yield name
    drop_tables(url, name)


@pytest.fixture
def client(url: str, table: str) -> Iterator[dblock.Client]:
    """A client of the machine's Redis, on the test's table."""
    with dblock.connect(url, table=table) as c:
        yield c


@pytest.fixture
def other(url: str, table: str) -> Iterator[dblock.Client]:
    """Another client of the same table."""
    with dblock.connect(url, table=table) as c:
        yield c


@pytest.fixture
def server(tmp_path: Path) -> Iterator[PrivateServer]:
    """A private redis-server that keeps nothing on disk, for what it may do to it."""
    with private_redis(tmp_path) as db:
        yield db


def command_calls(raw: Any) -> dict[str, int]:
    """Commands the server ran since its statistics were last reset: name -> calls."""
    stats = raw.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}
