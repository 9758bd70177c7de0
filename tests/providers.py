"""The stores the contract suite (tests/contract) runs against: one entry per store.

A :class:`Provider` tells a test what it needs about a store: its ``url`` (None for a store
that has no URL), its declared ``capabilities``, how to ``connect`` a client, and hooks to
reach or break the store from outside (raw SQL, server-side session kills, a private server
to kill and restart). Store names appear here and nowhere in tests/contract: a test that needs
something declares it with ``@pytest.mark.needs(...)`` and is skipped, by capability, where
the provider lacks it.

Capabilities are of two sorts. The store-contract ones are the names of the optional
interfaces in ``dblock.backends._contract`` that the store declares: FairQueue, SharedHolds,
OnceRecords, Wakeups, QueueJoin, LossPush, SessionHolds, SchemaScript. The harness ones
describe the provider and what a test may do to it:

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

Adding a store: its module, one entry in PROVIDERS, a CI service line.
"""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import sqlite3
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

import dblock
from tests._servers import (
    ETCD_URL,
    MYSQL_URL,
    POSTGRESQL_URL,
    REDIS_URL,
    ZOOKEEPER_URL,
    columns,
    drop_tables,
    execute,
    raw_connect,
    require_server,
)

#: the optional interfaces of the store contract (dblock.backends._contract.CAPABILITIES)
STORE_CAPABILITIES = frozenset(
    {
        "FairQueue",
        "SharedHolds",
        "ScheduledRuns",
        "OnceRecords",
        "FencedGrants",
        "Wakeups",
        "QueueJoin",
        "LossPush",
        "SessionHolds",
        "SchemaScript",
    }
)
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
    }
)
#: the client modes of every contract test: ``provider.connect`` gives a blocking client, or
#: a blocking facade over the async client
CLIENT_MODES = ("sync", "async")
_SQL_STORE = frozenset({"url", "processes", "cli", "sql", "outage", "pool", "durable", "demo"})
_SERVER = frozenset({"server", "restart"})


@dataclass(frozen=True)
class Entry:
    """A store as the test suite knows it (static: no server is touched to build one)."""

    name: str
    capabilities: frozenset[str]
    #: the store's name for ``dblock schema --dialect`` (stores with SchemaScript)
    dialect: str | None
    #: a fresh directory of the test -> the store's URL (None: the store has no URL)
    url: Callable[[Path], str | None]
    #: checked before each test: the store is reachable, else skip (fail under
    #: DBLOCK_REQUIRE_SERVERS=1); or None
    check: Callable[[str | None], None] | None = None
    #: the server's port when the URL names none (capability "server")
    default_port: int | None = None
    #: the store serves the async client (harness capability "asyncio")
    serves_async: bool = True
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
        mode |= {"asyncio"} if self.entry.serves_async else set()
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
                drop_tables(url, table)
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
        return raw_connect(self.url)

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


# -- the stores ------------------------------------------------------------------------------


def _sqlite_url(tmp: Path) -> str:
    return f"sqlite:///{tmp}/locks.sqlite3"


def _sqlite_hold_up_writes(cursor: Any, table: str, key: str) -> None:
    cursor.execute("BEGIN IMMEDIATE")  # holds up every writer of the file


def _row_lock(q: str) -> Callable[[Any, str, str], None]:
    def hold_up(cursor: Any, table: str, key: str) -> None:
        cursor.execute("BEGIN")
        cursor.execute(f"SELECT token FROM {q}{table}{q} WHERE lock_key = %s FOR UPDATE", (key,))

    return hold_up


def _check(name: str) -> Callable[[str | None], None]:
    def check(url: str | None) -> None:
        assert url is not None
        require_server(name, url)

    return check


def _pg_kill_tagged(provider: Provider, client: dblock.Client, tag: str) -> int:
    conn = provider.raw()
    try:
        cur = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (tag,),
        )
        return len(cur.fetchall())
    finally:
        conn.close()


def _sqlite_apply(url: str, script: str, _tmp: Path) -> None:
    conn = sqlite3.connect(urlsplit(url).path[1:])
    try:
        conn.executescript(script)
    finally:
        conn.close()


def _run_client(argv: list[str], script: str) -> None:
    if shutil.which(argv[0]) is None:
        pytest.skip(f"{argv[0]} is not installed")
    done = subprocess.run(
        argv, input=script, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr


def _psql_apply(url: str, script: str, _tmp: Path) -> None:
    _run_client(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", url], script)


def _mariadb_apply(url: str, script: str, _tmp: Path) -> None:
    parts = urlsplit(url)
    argv = [
        "mariadb",
        f"--host={parts.hostname or '127.0.0.1'}",
        f"--port={parts.port or 3306}",
        f"--user={parts.username or 'root'}",
        *([f"--password={parts.password}"] if parts.password else []),
        parts.path.lstrip("/"),
    ]
    _run_client(argv, script)


@contextlib.contextmanager
def _same_store(url: str) -> Iterator[str]:
    yield url


@contextlib.contextmanager
def _pg_own_database(url: str) -> Iterator[str]:
    """A fresh database (dropped afterwards)."""
    name = "dblock_cli_" + uuid.uuid4().hex[:12]
    admin = raw_connect(url)
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(urlsplit(url)._replace(path="/" + name))
    finally:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@contextlib.contextmanager
def _pg_outage(admin_url: str, url: str, _table: str) -> Iterator[None]:
    """New connections to the test's own database are refused (``ALLOW_CONNECTIONS false``,
    which binds superusers too, unlike ``CONNECTION LIMIT``) and its sessions are ended."""
    name = urlsplit(url).path.lstrip("/")
    admin = raw_connect(admin_url)  # connected elsewhere: a database cannot lock itself out
    try:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )
        yield
    finally:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        admin.close()


def _locking_outage(begin: str, end: str) -> Callable[[str, str, str], Any]:
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


def _private_postgresql(_root: Path) -> contextlib.AbstractContextManager[Any]:
    from tests._private_servers import private_postgresql

    return private_postgresql()


def _private_mariadb(root: Path) -> contextlib.AbstractContextManager[Any]:
    from tests._private_servers import private_mariadb

    return private_mariadb(root)


def _private_redis(root: Path) -> contextlib.AbstractContextManager[Any]:
    from tests._private_servers import private_redis

    return private_redis(root)


def _private_zookeeper(root: Path) -> contextlib.AbstractContextManager[Any]:
    from tests._zk_ensemble import private_ensemble_process

    return private_ensemble_process(root)


def _private_etcd(root: Path) -> contextlib.AbstractContextManager[Any]:
    from tests.backends.etcd._cluster import private_member

    return private_member(root)


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


def _memory_unavailable() -> str | None:
    if importlib.util.find_spec("dblock.backends._contract") is None:
        return (
            "the memory store implements the store contract (dblock.backends._contract), "
            "which this dblock does not have yet"
        )
    return None


def _memory_client(state: dict[str, Any], table: str, kw: dict[str, Any]) -> dblock.Client:
    from tests.contract._memory_store import MemoryStore, Tables

    with _MEMORY_SETUP:
        tables = state.setdefault("tables", Tables())
    runtime = kw.pop("runtime", None)
    store = MemoryStore(tables, table, **kw)  # type: ignore[call-arg,arg-type]
    if runtime is None:
        return dblock.Client(store)
    store.rt = runtime
    return dblock.Client(store, runtime)


_MEMORY_SETUP = threading.Lock()


# -- quorums of three stores (docs/quorum.md): one URL string, its members separated by spaces


def quorum_members(url: str) -> list[str]:
    """The member URLs of a quorum provider's URL (``[url]`` for a single store)."""
    parts = url.split()
    return parts if len(parts) > 1 and all("://" in p for p in parts) else [url]


#: the three databases of the PostgreSQL quorum on the shared server (made if missing)
QUORUM_PG_DATABASES = ("q_a", "q_b", "q_c")
_QUORUM_SETUP = threading.Lock()
_REDIS_TRIO: list[Any] = []


def _quorum_sqlite_url(tmp: Path) -> str:
    return " ".join(f"sqlite:///{tmp}/quorum{i}.sqlite3" for i in range(3))


def _quorum_pg_url(_tmp: Path) -> str:
    base = urlsplit(POSTGRESQL_URL)
    return " ".join(urlunsplit(base._replace(path="/" + db)) for db in QUORUM_PG_DATABASES)


def quorum_pg_check(_url: str | None) -> None:
    require_server("postgresql", POSTGRESQL_URL)
    with _QUORUM_SETUP:
        conn = raw_connect(POSTGRESQL_URL)
        try:
            have = {r[0] for r in conn.execute("SELECT datname FROM pg_database").fetchall()}
            for db in QUORUM_PG_DATABASES:
                if db not in have:
                    with contextlib.suppress(Exception):  # another process made it meanwhile
                        conn.execute(f'CREATE DATABASE "{db}"')
        finally:
            conn.close()


def _quorum_redis_url(tmp: Path) -> str:
    """Three private Redis servers, started once for the test session (stopped at exit)."""
    return " ".join(server.url for server in redis_trio(tmp))


def redis_trio(tmp: Path) -> list[Any]:
    """The test session's three private Redis servers (started on first use)."""
    with _QUORUM_SETUP:
        if not _REDIS_TRIO:
            import atexit

            from tests._private_servers import private_redis

            stack = contextlib.ExitStack()
            atexit.register(stack.close)
            for i in range(3):
                root = tmp.parent / f"redis-trio-{uuid.uuid4().hex[:8]}-{i}"
                root.mkdir()
                _REDIS_TRIO.append(stack.enter_context(private_redis(root)))
        return list(_REDIS_TRIO)


#: what a quorum client is: lock, locked, scheduled, info, list, force_release, by URL
_QUORUM = frozenset({"ScheduledRuns", "FairQueue", "Wakeups", "url", "processes", "cli"})

PROVIDERS: tuple[Entry, ...] = (
    Entry(
        name="sqlite",
        capabilities=frozenset({"FairQueue", "SharedHolds", "OnceRecords", "Wakeups"})
        | {"ScheduledRuns", "FencedGrants", "SchemaScript", "file"}
        | _SQL_STORE,
        dialect="sqlite",
        url=_sqlite_url,
        q='"',
        mark="?",
        hold_up_writes=_sqlite_hold_up_writes,
        apply_script=_sqlite_apply,
        own_store=_same_store,
        # another process holds BEGIN EXCLUSIVE on the file, so renewals cannot write
        outage=_locking_outage("BEGIN EXCLUSIVE", "ROLLBACK"),
    ),
    Entry(
        name="postgresql",
        capabilities=STORE_CAPABILITIES | _SQL_STORE | _SERVER | {"handover", "advisory"},
        dialect="postgresql",
        url=lambda _tmp: POSTGRESQL_URL,
        default_port=5432,
        check=_check("postgresql"),
        q='"',
        hold_up_writes=_row_lock('"'),
        private=_private_postgresql,
        tag_query=lambda tag: f"application_name={tag}",
        kill_tagged=_pg_kill_tagged,
        apply_script=_psql_apply,
        own_store=_pg_own_database,
        outage=_pg_outage,
    ),
    Entry(
        name="mysql",
        # SessionHolds: the test server is MariaDB (MySQL 8 withholds them: no sequences)
        capabilities=frozenset({"FairQueue", "SharedHolds", "OnceRecords", "Wakeups"})
        | {"ScheduledRuns", "FencedGrants", "SchemaScript", "SessionHolds"}
        | _SQL_STORE
        | _SERVER
        | {"advisory"},
        dialect="mysql",
        url=lambda _tmp: MYSQL_URL,
        default_port=3306,
        check=_check("mysql"),
        q="`",
        hold_up_writes=_row_lock("`"),
        private=_private_mariadb,
        # every session of a MySQL client is in its pool (the doorbell is a pooled one too)
        kill_tagged=lambda provider, client, _tag: provider.kill_sessions(client),
        apply_script=_mariadb_apply,
        own_store=_same_store,
        # another session holds LOCK TABLES <table> WRITE, so renewals block
        outage=_locking_outage("LOCK TABLES `{table}` WRITE", "UNLOCK TABLES"),
    ),
    Entry(
        name="redis",
        # no SQL, no file, nothing durable: a Redis without persistence forgets on a restart
        capabilities=(STORE_CAPABILITIES - {"SchemaScript", "SessionHolds"})
        | {"url", "processes", "cli", "pool", "handover", "demo"}
        | _SERVER,
        dialect="redis",
        url=lambda _tmp: REDIS_URL,
        default_port=6379,
        check=_check("redis"),
        private=_private_redis,
        kill_tagged=_redis_kill_tagged,
    ),
    Entry(
        name="zookeeper",
        # no SQL, no file; the store is the shared server on 127.0.0.1:2181
        # restart: a private 3-server ensemble, SIGKILLed and started again as a whole
        capabilities=frozenset({"FairQueue", "SharedHolds", "OnceRecords", "Wakeups"})
        | {"ScheduledRuns", "QueueJoin", "LossPush", "url", "processes", "cli", "restart"}
        | {"demo"},
        dialect="zookeeper",
        url=lambda _tmp: ZOOKEEPER_URL,
        default_port=2181,
        check=_check("zookeeper"),
        private=_private_zookeeper,
    ),
    Entry(
        name="etcd",
        # no SQL, no file; leases are the cluster's (whole seconds); what a test may kill is
        # one node of a private 3-node cluster (tests/backends/etcd), never this shared node
        # no LossPush: a watch stream open while holding breaks gRPC in a forked child
        capabilities=frozenset({"FairQueue", "SharedHolds", "OnceRecords", "Wakeups"})
        | {"ScheduledRuns", "url", "processes", "cli", "durable", "restart", "demo"},
        dialect="etcd",
        url=lambda _tmp: ETCD_URL,
        default_port=2379,
        check=_check("etcd"),
        private=_private_etcd,
        exact_ttl=False,
    ),
    # a quorum's stores lease a little longer than the ttl (its clock-drift allowance)
    Entry(
        name="quorum-sqlite",
        capabilities=_QUORUM,
        dialect=None,
        url=_quorum_sqlite_url,
        exact_ttl=False,
    ),
    Entry(
        name="quorum-postgresql",
        capabilities=_QUORUM,
        dialect=None,
        url=_quorum_pg_url,
        check=quorum_pg_check,
        exact_ttl=False,
    ),
    Entry(
        name="quorum-redis",
        capabilities=_QUORUM,
        dialect=None,
        url=_quorum_redis_url,
        exact_ttl=False,
    ),
    Entry(
        name="memory",
        dialect=None,
        # what tests/contract/_memory_store.MemoryStore declares; none of the harness ones
        capabilities=frozenset({"FairQueue", "SharedHolds", "OnceRecords", "ScheduledRuns"}),
        url=lambda _tmp: None,
        make_client=_memory_client,
        unavailable=_memory_unavailable,
    ),
)


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
