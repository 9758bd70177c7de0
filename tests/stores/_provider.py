"""What a provider of the contract suite (tests/contract) is: a store as the tests know it.

A :class:`Provider` tells a test what it needs about a store: its ``url`` (None for a store
that has no URL), its declared ``capabilities``, how to ``connect`` a client, and hooks to
reach or break the store from outside (raw SQL, server-side session kills, a private server
to kill and restart). Store names appear here and nowhere in tests/contract: a test that needs
something declares it with ``@pytest.mark.needs(...)`` and is skipped, by capability, where
the provider lacks it.

Capabilities are of two sorts. The store-contract ones are the names of the optional
interfaces in ``dblock._contract`` that the store declares: FairQueue, SharedHolds,
ScheduledRuns, OnceRecords, FencedGrants, Wakeups, QueueJoin, LossPush, SessionHolds,
SchemaScript, QueueView. A provider does not declare them: they are read from its store's
class line (``Entry.store``). The harness ones (``Entry.markers``, declared by each
provider) describe the provider and what a test may do to it:

``url``        reached through a dblock URL (``dblock.connect(provider.url)``)
``processes``  other processes reach the same locks through ``url``
``cli``        the ``dblock`` command line reaches it through ``url``
``sql``        its tables can be read and locked with a raw SQL connection (``raw``,
               ``q``, ``mark``, ``hold_up_writes``)
``file``       the store is one file the URL names, made by the first write (``file()``)
``outage``     the store can be made unusable for everyone but the test (``own_store``,
               ``outage``)
``pool``       the client keeps a connection pool (fork tests reach its lock)
``server``     client-server: a client's connections can be killed from the server side
               (``kill_sessions``, ``tagged``/``kill_tagged``)
``restart``    a private server of its own can be started, SIGKILLed and started again
               (``private_server``)
``durable``    what was committed survives the store's process dying
``advisory``   the database has session advisory locks of its own (the demo's strategy 7)
``handover``   a release hands the lock straight to the head waiter (it holds the lock
               before it runs again)
``blocking``   the test's clients are blocking ``dblock.Client`` objects (the ``[sync]`` runs)
``asyncio``    the store serves the async client (``dblock.connect_async``): the ``[async]``
               runs, and the async-only tests, need it
``demo``       ``dblock demo`` runs on ``url`` (one store: not a quorum)
``exact_ttl``  a lease lasts its ttl to the millisecond, fractions of a second too (etcd's
               leases are whole seconds, at least one: a 0.3 s ttl holds for 1 s)

Every provider runs in two client modes (``mode``): ``[sync]``, where ``connect`` returns a
blocking ``dblock.Client``, and ``[async]``, where it returns a blocking facade over an
``AsyncClient`` (tests/_async_facade.py), each thread of the test being one asyncio task,
and the worker processes of tests/_worker.py use the async client too. The same test thus
proves each behaviour of both APIs. A test that only the blocking client can mean declares
``needs("blocking")`` and is skipped in the ``[async]`` runs: it forks, calls the blocking
API on a thread that runs an event loop, or has no client of its own in the test process
(the CLI, the demo, the chaos soak, inline scripts that use ``dblock.connect``), so an async
run would repeat the sync one.

Each store's provider lives in its test folder, ``tests/stores/<name>/provider.py`` (a
``PROVIDERS`` tuple of :class:`Entry`); ``tests/providers.py`` collects them.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

import dblock
from dblock._contract import CAPABILITIES
from tests._servers import (
    columns,
    drop_tables,
    execute,
    raw_connect,
    require_server,
)

#: the optional interfaces of the store contract (dblock._contract.CAPABILITIES)
STORE_CAPABILITIES = frozenset(c.__name__ for c in CAPABILITIES)
#: what a test may do to the provider (see the module docstring)
HARNESS_CAPABILITIES = frozenset(
    {
        "url",
        "processes",
        "cli",
        "sql",
        "file",
        "outage",
        "pool",
        "server",
        "restart",
        "durable",
        "handover",
        "advisory",
        "blocking",
        "asyncio",
        "exact_ttl",
        "demo",
        # its waiters wait in the server's own queue (MySQL's doorbell), which reorders them
        # when a loaded machine delays one past a wait's bound: their order is checked alone
        "bell",
    }
)
#: the client modes of every contract test: ``provider.connect`` gives a blocking client, or
#: a blocking facade over the async client
CLIENT_MODES = ("sync", "async")
SQL_STORE = frozenset({"url", "processes", "cli", "sql", "outage", "pool", "durable", "demo"})
SERVER = frozenset({"server", "restart"})


@dataclass(frozen=True)
class Entry:
    """A store as the test suite knows it (static: no server is touched to build one)."""

    name: str
    #: the store's class, "module:Class" (a store of the tests' own too): the provider's
    #: store-contract capabilities are those its class line declares (read, never copied)
    store: str
    #: what a test may do to the provider: harness capabilities only (HARNESS_CAPABILITIES)
    markers: frozenset[str]
    #: the store's name for ``dblock schema --dialect`` (stores with SchemaScript)
    dialect: str | None
    #: a fresh directory of the test -> the store's URL (None: the store has no URL)
    url: Callable[[Path], str | None]
    #: checked before each test: the store is reachable, else skip (fail under
    #: DBLOCK_REQUIRE_SERVERS=1); or None
    check: Callable[[str | None], None] | None = None
    #: the server's port when the URL names none (capability "server")
    default_port: int | None = None
    #: leases last their ttl exactly, fractions of a second too (harness capability)
    exact_ttl: bool = True
    #: the store's SQL identifier quote and parameter marker (capability "sql")
    q: str = '"'
    mark: str = "%s"
    #: holds up every write to ``key``'s row of ``table`` until the context ends (``sql``)
    hold_up_writes: Callable[[Any, str, str], None] | None = None
    #: a private server in a directory, running, whose ``url``/``kill()``/``start()``/
    #: ``command`` the test may use (capability "restart")
    private: Callable[[Path], contextlib.AbstractContextManager[Any]] | None = None
    #: a store-less client factory, for a store that has no URL: (state, table, kw) -> Client
    make_client: Callable[[dict[str, Any], str, dict[str, Any]], dblock.Client] | None = None
    #: why the provider cannot run at all here (e.g. the core lacks the store contract)
    unavailable: Callable[[], str | None] = lambda: None
    #: extra connection parameters to tag a client's sessions (server): tag -> URL query
    tag_query: Callable[[str], str] = lambda _tag: ""
    kill_tagged: Callable[[Provider, dblock.Client, str], int] | None = None
    #: applies a DDL script with the store's own client, as a DBA would: (url, script, tmp)
    apply_script: Callable[[str, str, Path], None] | None = None
    #: a URL of a store of the test's own that ``outage`` may break: (url) -> its URL
    own_store: Callable[[str], contextlib.AbstractContextManager[str]] | None = None
    #: makes ``table`` at ``url`` unusable for everyone else within: (admin url, url, table)
    outage: Callable[[str, str, str], contextlib.AbstractContextManager[None]] | None = None
    #: a store tests/_servers.py does not know: its plain client of a URL (``raw``; also what
    #: ``check_server(name, raw)`` reaches) and how a table is dropped: (url, table)
    raw: Callable[[str], Any] | None = None
    drop: Callable[[str, str], None] | None = None
    #: the client modes the contract suite runs it in: a mode whose code paths another
    #: provider already runs, store and client alike, is left out (the entry says why)
    modes: tuple[str, ...] = CLIENT_MODES
    #: sets what the contract suite's tests change in this test's process for the store
    #: (with pytest's monkeypatch, undone after the test); or None
    tune: Callable[[pytest.MonkeyPatch], None] | None = None

    @property
    def capabilities(self) -> frozenset[str]:
        """The store's capabilities (read from its class) and the provider's markers."""
        return store_capabilities(self.store) | self.markers


@functools.cache
def store_capabilities(store: str) -> frozenset[str]:
    """The names of the capabilities the class ``store`` ("module:Class") declares on its
    class line (imports the class, and so its driver)."""
    module_name, _, class_name = store.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    return frozenset(c.__name__ for c in CAPABILITIES if issubclass(cls, c))


@dataclass
class Provider:
    """One store, bound to one test: what the contract tests see."""

    entry: Entry
    url: str | None
    #: "sync": ``connect`` gives a ``dblock.Client``; "async": a facade over an AsyncClient
    mode: str = "sync"
    _state: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def capabilities(self) -> frozenset[str]:
        mode = {"blocking"} if self.mode == "sync" else set()
        mode.add("asyncio")  # every store serves the async client
        return self.entry.capabilities | mode | ({"exact_ttl"} if self.entry.exact_ttl else set())

    @property
    def dialect(self) -> str | None:
        """The store's name for ``dblock schema --dialect`` and ``client.dialect``."""
        return self.entry.dialect

    def __repr__(self) -> str:
        return f"Provider({self.name!r}, url={self.url!r})"

    def has(self, *capabilities: str) -> bool:
        return set(capabilities) <= self.capabilities

    def require(self, *capabilities: str) -> None:
        """Skip the test unless the provider has every one of ``capabilities``."""
        unknown = set(capabilities) - STORE_CAPABILITIES - HARNESS_CAPABILITIES
        assert not unknown, f"unknown capabilities {sorted(unknown)}"
        missing = sorted(set(capabilities) - self.capabilities)
        if missing:
            pytest.skip(f"provider {self.name} [{self.mode}] lacks {', '.join(missing)}")

    def connect(self, table: str, **kw: Any) -> dblock.Client:
        """A new client of the store's lock table ``table``; two clients of one provider
        contend like two processes. In the async mode, a blocking facade over an async
        client (tests/_async_facade.py) with the same surface."""
        if self.mode == "async":
            from tests._async_facade import Client as Facade

            return Facade(lambda: self.connect_async(table, **kw))  # type: ignore[return-value]
        return self.connect_blocking(table, **kw)

    def connect_blocking(self, table: str, **kw: Any) -> dblock.Client:
        """A new blocking client, whatever the mode."""
        if self.entry.make_client is not None:
            return self.entry.make_client(self._state, table, kw)
        assert self.url is not None
        url = kw.pop("url", self.url)
        return dblock.connect(url, table=table, **kw)

    async def connect_async(self, table: str, **kw: Any) -> Any:
        """A new async client (``dblock.connect_async``) of the store's lock table ``table``;
        it contends with the blocking clients of the same table like another process."""
        if self.entry.make_client is not None:
            import asyncio

            from dblock._async_client import AsyncClient
            from dblock._green import spawn
            from dblock._loop_runtime import LoopRuntime

            runtime = LoopRuntime(asyncio.get_running_loop())
            sync = await spawn(
                self.entry.make_client, self._state, table, {**kw, "runtime": runtime}
            )
            return AsyncClient(sync, runtime)
        assert self.url is not None
        url = kw.pop("url", self.url)
        return await dblock.connect_async(url, table=table, **kw)

    def drop(self, table: str) -> None:
        """Remove ``table`` and what lives beside it (after a test)."""
        if self.url is not None:
            for url in quorum_members(self.url):
                (self.entry.drop or drop_tables)(url, table)
        elif "tables" in self._state:  # a store of the test's own (memory)
            self._state["tables"].tables.pop(table, None)

    # -- sql ---------------------------------------------------------------------------------

    @property
    def q(self) -> str:
        return self.entry.q

    @property
    def mark(self) -> str:
        return self.entry.mark

    def raw(self) -> Any:
        """A plain driver connection in autocommit mode (capability ``sql``)."""
        assert "sql" in self.capabilities and self.url is not None
        return (self.entry.raw or raw_connect)(self.url)

    def hold_up_writes(self, cursor: Any, table: str, key: str) -> None:
        """In ``cursor``'s connection, start a transaction that holds up every write to
        ``key``'s lock row until it commits (capability ``sql``)."""
        assert self.entry.hold_up_writes is not None
        self.entry.hold_up_writes(cursor, table, key)

    def execute(self, *statements: str) -> None:
        """Run ``statements`` on a raw connection and commit (capability ``sql``)."""
        assert self.url is not None
        execute(self.url, *statements)

    def columns(self, name: str) -> list[str] | None:
        """The columns of table ``name`` (None if there is no such relation), read without
        dblock (capability ``sql``)."""
        assert self.url is not None
        return columns(self.url, name)

    def file(self) -> Path:
        """The store's file (capability ``file``)."""
        assert "file" in self.capabilities and self.url is not None
        return Path(urlsplit(self.url).path[1:])

    def apply_script(self, url: str, script: str, tmp: Path) -> None:
        """Apply the DDL ``script`` to ``url`` with the store's own client (SchemaScript)."""
        assert self.entry.apply_script is not None
        self.entry.apply_script(url, script, tmp)

    # -- outage ------------------------------------------------------------------------------

    def own_store(self) -> contextlib.AbstractContextManager[str]:
        """A URL of a store of the test's own, that ``outage`` may break for everyone."""
        assert self.entry.own_store is not None and self.url is not None
        return self.entry.own_store(self.url)

    def outage(self, url: str, table: str) -> contextlib.AbstractContextManager[None]:
        """Within: ``table`` at ``url`` (from ``own_store``) is unusable for everyone else."""
        assert self.entry.outage is not None and self.url is not None
        return self.entry.outage(self.url, url, table)

    # -- server ------------------------------------------------------------------------------

    def kill_sessions(self, client: dblock.Client) -> int:
        """Terminate every pooled connection of ``client`` from the server side."""
        assert "server" in self.capabilities and self.url is not None
        from tests._faults import kill_sessions

        return kill_sessions(client, self.url)

    def tagged(self, tag: str) -> str:
        """The URL of clients whose every session ``kill_tagged(tag)`` can find."""
        assert self.url is not None
        query = self.entry.tag_query(tag)
        return self.url + (f"?{query}" if query else "")

    def kill_tagged(self, client: dblock.Client, tag: str) -> int:
        """Terminate every session of ``client`` (connected by ``tagged(tag)``), a
        listening one too, from the server side."""
        assert self.entry.kill_tagged is not None
        return self.entry.kill_tagged(self, client, tag)

    # -- restart -----------------------------------------------------------------------------

    def private_server(self, root: Path) -> contextlib.AbstractContextManager[Any]:
        """A private server of this store (``url``, ``kill()``, ``start()``, ``command``)."""
        assert "restart" in self.capabilities and self.entry.private is not None
        return self.entry.private(root)


# -- what several providers use -------------------------------------------------------------


def row_lock(q: str) -> Callable[[Any, str, str], None]:
    def hold_up(cursor: Any, table: str, key: str) -> None:
        cursor.execute("BEGIN")
        cursor.execute(f"SELECT token FROM {q}{table}{q} WHERE lock_key = %s FOR UPDATE", (key,))

    return hold_up


def check_server(
    name: str, raw: Callable[[str], Any] | None = None
) -> Callable[[str | None], None]:
    def check(url: str | None) -> None:
        assert url is not None
        require_server(name, url, raw)

    return check


def run_client(argv: list[str], script: str) -> None:
    if shutil.which(argv[0]) is None:
        pytest.skip(f"{argv[0]} is not installed")
    done = subprocess.run(
        argv, input=script, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr


@contextlib.contextmanager
def same_store(url: str) -> Iterator[str]:
    yield url


def locking_outage(begin: str, end: str) -> Callable[[str, str, str], Any]:
    """Another session holds ``begin`` (the table's or file's write lock) until ``end``."""

    @contextlib.contextmanager
    def outage(_admin_url: str, url: str, table: str) -> Iterator[None]:
        conn = raw_connect(url)
        try:
            cur = conn.cursor()
            cur.execute(begin.format(table=table))
            try:
                yield
            finally:
                cur.execute(end)
        finally:
            conn.close()

    return outage


def quorum_members(url: str) -> list[str]:
    """The member URLs of a quorum provider's URL (``[url]`` for a single store)."""
    parts = url.split()
    return parts if len(parts) > 1 and all("://" in p for p in parts) else [url]


def bind(entry: Entry, tmp: Path, mode: str = "sync") -> Provider:
    """``entry`` for one test (``tmp``: a fresh directory of the test's) in client ``mode``:
    skips the test if the store is unreachable or unavailable here."""
    reason = entry.unavailable()
    if reason is not None:
        pytest.skip(f"provider {entry.name} unavailable: {reason}")
    url = entry.url(tmp)
    if entry.check is not None:
        entry.check(url)
    return Provider(entry, url, mode)


def fresh_table() -> str:
    return "t_" + uuid.uuid4().hex[:16]


@contextlib.contextmanager
def table_of(provider: Provider) -> Iterator[str]:
    """A fresh lock table name, dropped afterwards."""
    name = fresh_table()
    try:
        yield name
    finally:
        provider.drop(name)
