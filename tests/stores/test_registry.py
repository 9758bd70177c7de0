"""The registry (dblock.stores._registry): URL schemes, opening, and a store another
distribution adds under the ``dblock.stores`` entry-point group (here a fake one: the
entry points that importlib.metadata reports are replaced by the test's own)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import dblock
from dblock._url import DatabaseURL, server_url
from dblock.stores import _registry, ddl_for
from dblock.stores._entry import StoreEntry
from dblock.tools import parse_url
from tests.contract._memory_store import MemoryStore, Tables

_TABLES = Tables()


class PluggedStore(MemoryStore):
    """A store of another distribution: the in-memory one, opened by URL as the registry does."""

    name = "memory"

    def __init__(self, url: DatabaseURL, schema: str | None, table: str) -> None:
        super().__init__(_TABLES, table)
        self.safe_url = url.safe


PLUGGED = StoreEntry(
    name="memory",
    title="Memory",
    schemes=("memory", "mem"),
    usage="memory://name",
    store=f"{__name__}:PluggedStore",
    parse=server_url,
)


class FakeEntryPoint:
    group = _registry.GROUP

    def __init__(self, name: str, value: object) -> None:
        self.name, self.value, self._loaded = name, f"fake:{name}", value

    def load(self) -> object:
        return self._loaded


@pytest.fixture
def plug(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``plug(name, object)``: an entry point of the dblock.stores group that loads ``object``."""
    points: list[FakeEntryPoint] = []

    def entry_points(*, group: str) -> list[FakeEntryPoint]:
        return points if group == _registry.GROUP else []

    monkeypatch.setattr("importlib.metadata.entry_points", entry_points)
    _registry.plugged.cache_clear()
    yield lambda name, value: points.append(FakeEntryPoint(name, value))
    _registry.plugged.cache_clear()


#: the refusal as before the registry (ZooKeeper's form with the user info it gained since)
ORIGINAL_REFUSAL = (
    "unsupported database URL 'nosuch://x': use sqlite:///path.db, "
    "postgresql://user:password@host:port/db, mysql://user:password@host:port/db, "
    "redis://user:password@host:port/0, "
    "zookeeper://[user:password@]host:port[,host:port...]/chroot or "
    "etcd://host:port[,host:port...]"
)


def test_every_built_in_scheme_reaches_its_store() -> None:
    for entry in _registry.BUILT_IN:
        for scheme in entry.schemes:
            assert _registry.by_scheme(scheme) is entry
            assert _registry.by_scheme(scheme.upper()) is entry
        assert _registry.entry(entry.name) is entry


def test_an_unknown_scheme_is_refused_with_every_stores_url(plug: Any) -> None:
    with pytest.raises(dblock.ConfigurationError) as caught:
        parse_url("nosuch://x")
    assert str(caught.value) == ORIGINAL_REFUSAL


def test_a_plugged_store_is_parsed_opened_and_locks(plug: Any) -> None:
    plug("memory", PLUGGED)
    url = parse_url("mem://host:1/app")
    assert (url.dialect, url.host, url.port, url.database) == ("memory", "host", 1, "app")
    assert _registry.entries()[-1] is PLUGGED
    with pytest.raises(dblock.ConfigurationError, match=r"or memory://name$"):
        parse_url("nosuch://x")
    tokens = []
    with dblock.connect("memory://host/app", table="plugged") as client:
        for _ in range(2):
            with client.lock("k", ttl=10) as lock:
                assert [i.key for i in client.list()] == ["k"]
                tokens.append(lock.token)
    assert None not in tokens and tokens == sorted(set(tokens)), tokens
    with pytest.raises(dblock.ConfigurationError, match="unknown dialect 'memory'"):
        ddl_for("memory")  # it has no DDL


def test_without_entry_points_the_plugged_scheme_is_unknown(plug: Any) -> None:
    with pytest.raises(dblock.ConfigurationError, match="unsupported database URL"):
        parse_url("memory://host/app")


def test_a_plugged_store_may_not_take_a_built_in_scheme(plug: Any) -> None:
    plug("thief", StoreEntry(**{**PLUGGED.__dict__, "name": "thief", "schemes": ("redis",)}))
    with pytest.raises(dblock.ConfigurationError, match="takes what a built-in store has: redis"):
        parse_url("nosuch://x")


def test_an_entry_point_that_is_no_store_entry_is_refused(plug: Any) -> None:
    plug("odd", object())
    with pytest.raises(dblock.ConfigurationError, match="is not a dblock StoreEntry"):
        parse_url("nosuch://x")


def test_a_missing_driver_names_the_extra() -> None:
    entry = StoreEntry(**{**PLUGGED.__dict__, "store": "no_such_driver_mod:X", "extra": "x"})
    with pytest.raises(dblock.ConfigurationError, match=r"pip install 'dblock\[x\]'"):
        entry.load()
