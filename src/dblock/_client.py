"""connect() and Client: URL -> backend, owner identity, shared state of its locks."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from types import TracebackType
from typing import TYPE_CHECKING, Any, ParamSpec, TypeAlias, TypeVar

from ._contract import OnceRecords, Store, lacking, provides
from ._core import Core
from ._lock import Lock
from ._many import ManyLock
from ._patterns import OnceLock, locked, scheduled
from ._runtime import THREADS, Runtime
from ._rwlock import RWLock, Semaphore
from ._types import LockInfo, State
from ._url import quorum_urls
from ._validate import MAX_PURGE_AGE, check_key, check_max_connections, check_table
from .stores import is_engine, open_url, parse_url

if TYPE_CHECKING:
    from kazoo.client import KazooClient
    from psycopg_pool import AsyncConnectionPool, ConnectionPool
    from redis import Redis
    from sqlalchemy.engine import Engine
    from sqlalchemy.ext.asyncio import AsyncEngine

    from ._election import Election, Term

    #: what stands for a store besides its URL (docs/configuration.md)
    Borrowed: TypeAlias = Redis | KazooClient | ConnectionPool[Any] | AsyncConnectionPool[Any]

log = logging.getLogger("dblock")
P = ParamSpec("P")
R = TypeVar("R")


def connect(
    url: str | Sequence[str] | Engine | Borrowed | None = None,
    *,
    table: str = "dblock_locks",
    create_schema: bool = True,
    max_connections: int | None = None,
) -> Client:
    """Open a client on the lock table ``table`` of the database at ``url``.

    ``url=None`` means the ``DBLOCK_URL`` environment variable, else an embedded SQLite file in
    the user's state directory (shared by the processes of this host). With
    ``create_schema=True`` missing tables are created (idempotent, safe under concurrency)
    and those of an earlier dblock upgraded; with False nothing is created or altered, and a
    missing or outdated table raises ConfigurationError. A table of that name that is not
    dblock's (it lacks dblock's columns) raises ConfigurationError either way, untouched.

    ``max_connections`` bounds the client's pool of statement connections (default: the URL's
    ``?max_connections=``, else 10); a thread that finds them all in use waits for one, within
    its acquire's timeout. Waiting threads may use a few more (docs/configuration.md,
    "Connections").

    A list of at least three URLs (or a string of them separated by spaces, as in
    ``DBLOCK_URL``) opens a quorum client: a hold exists while a majority of these
    independent stores grant it, with tokens that still strictly increase. It offers
    ``lock``, ``locked``, ``scheduled``, ``info``, ``list`` and ``force_release``
    (docs/stores/quorum.md).

    A SQLAlchemy ``Engine`` in place of ``url`` uses that engine's pool and dialect: its
    statements run on connections borrowed from the engine's pool (docs/sqlalchemy.md).

    A client the application already holds may stand in for ``url`` the same way: a
    ``redis.Redis``, a started kazoo ``KazooClient``, a ``psycopg_pool.ConnectionPool``.
    dblock runs its statements on it and never closes it (docs/configuration.md, "A client
    you already have"). Anything else raises TypeError naming what is accepted.

    >>> with dblock.connect("postgresql://app@db/app") as client:
    ...     with client.lock("nightly-report", ttl=60):
    ...         run_report()
    """
    return Client(open_store(url, table, create_schema, max_connections))


def open_store(
    url: str | Sequence[str] | Engine | AsyncEngine | Borrowed | None,
    table: str,
    create_schema: bool,
    max_connections: int | None,
    runtime: Runtime | None = None,
) -> Store:
    """The store for a client: URL (or SQLAlchemy engine) and options checked, its tables made
    or checked."""
    schema, name = check_table(table)
    urls = quorum_urls(url)  # a list of URLs, or several in one string: a quorum
    if urls is not None:
        from .stores.quorum.store import open_quorum  # its thread pool only where it is used

        return open_quorum(
            urls,
            lambda one: open_store(one, table, create_schema, max_connections, runtime),
            table,
            runtime,
        )
    pool = None if max_connections is None else check_max_connections(max_connections)
    if is_engine(url):
        from .stores._sqla import engine_store

        backend = engine_store(url, schema, name, pool, runtime)
    elif url is not None and not isinstance(url, str):
        from .stores._clients import client_store

        backend = client_store(url, schema, name, pool, runtime)  # else a TypeError
    else:
        parsed = parse_url(url)
        if pool is not None:
            parsed = replace(parsed, max_connections=pool)
        backend = open_url(parsed, schema, name, runtime)
    try:
        backend.ensure_schema(create=bool(create_schema))
    except BaseException:
        backend.close()
        raise
    return backend


class Client:
    """A thread-safe handle on one lock table. Use it as a context manager or ``close()`` it."""

    def __init__(self, store: Store, runtime: Runtime = THREADS) -> None:
        self._core = Core(store, runtime)
        self._store = store
        self._closed = False

    @property
    def url(self) -> str:
        """The database URL, password hidden."""
        return self._store.safe_url

    @property
    def table(self) -> str:
        return self._store.table

    @property
    def dialect(self) -> str:
        """The store's name: "sqlite", "postgresql", "mysql", ..."""
        return self._store.name

    # -- locks ----------------------------------------------------------------------------
    def lock(
        self,
        key: str,
        *,
        ttl: float | None = 30.0,
        timeout: float | None = None,
        reentrant: bool = True,
        auto_renew: bool = False,
        fair: bool = False,
        on_lost: Callable[[Lock], object] | None = None,
    ) -> Lock:
        """A lease lock on ``key`` (not yet acquired). See :class:`Lock`.

        ``ttl=None``: a session hold, with no lease, that lasts as long as the client's
        connection to the server: the server's own lock and wait queue where the store has
        one (PostgreSQL advisory locks), else a lease renewed in the background while the
        process lives. See docs/session-locks.md.
        """
        # Every lock hands over in the order waiters arrived (see Lock._queue_kind), so
        # fair=True asks for what the default already gives.
        return Lock(
            self._core,
            key,
            ttl=ttl,
            timeout=timeout,
            reentrant=reentrant,
            auto_renew=auto_renew,
            on_lost=on_lost,
        )

    def lock_many(
        self,
        keys: Iterable[str],
        *,
        ttl: float | None = 30.0,
        timeout: float | None = None,
        auto_renew: bool = False,
        on_lost: Callable[[ManyLock], object] | None = None,
    ) -> ManyLock:
        """Every key of ``keys`` or none, in one atomic step of the store, each with its own
        fencing token (``tokens``). A waiter holds none of the keys while it waits, so
        overlapping ``lock_many`` calls never deadlock, in whatever order their keys are
        given; on stores that queue waiters, later newcomers queue behind it. Not re-entrant.
        ``ttl=None``: a lease renewed in the background while the process lives. See
        docs/lock-many.md.

        >>> with client.lock_many(["sku-1", "sku-7"], ttl=30, timeout=5) as m:
        ...     ship(order, fences=m.tokens)
        """
        return ManyLock(
            self._core, keys, ttl=ttl, timeout=timeout, auto_renew=auto_renew, on_lost=on_lost
        )

    def election(
        self, name: str, *, ttl: float = 15.0, on_lost: Callable[[Term], object] | None = None
    ) -> Election:
        """Leader election among the clients that campaign for ``name``: one leader at a
        time, each term with its own fencing token; ``ttl`` is the term's lease, renewed in
        the background (a dead leader is replaced within it). See docs/election.md.

        >>> with client.election("scheduler").campaign(value="10.0.0.7:8080") as term:
        ...     run_scheduler(until=term.lost, fence=term.token)
        """
        from ._election import Election  # imported by what campaigns (a cold start's cost)

        return Election(self._core, name, ttl=ttl, on_lost=on_lost)

    def rwlock(self, key: str, *, ttl: float = 30.0, timeout: float | None = None) -> RWLock:
        """A read-write lock: many readers at once, or one writer; writers are not starved."""
        return RWLock(self._core, key, ttl=ttl, timeout=timeout)

    def semaphore(
        self, key: str, permits: int, *, ttl: float = 30.0, timeout: float | None = None
    ) -> Semaphore:
        """At most ``permits`` holders of ``key`` at once; a crashed holder's permit comes back
        when its lease ends."""
        return Semaphore(self._core, key, permits, ttl=ttl, timeout=timeout)

    # -- patterns -------------------------------------------------------------------------
    def once(
        self, key: str, *, ttl: float = 30.0, note: str | None = None, auto_renew: bool = True
    ) -> OnceLock:
        """Run a block at most once successfully per key (the status lock).

        Claims the key when it has no record, when its record is ``failed``, or when a
        ``processing`` record's lease has expired. Normal exit records ``succeeded``; an
        exception records ``failed`` and propagates. Otherwise raises InProgress or
        AlreadyDone. The lease is renewed in the background while the block runs
        (``auto_renew``), so ``ttl`` is how long a crashed holder blocks a retry.

        >>> with client.once("payout:" + request_no, ttl=300, note="payout"):
        ...     pay(request_no)
        """
        return OnceLock(self._core, key, ttl=ttl, note=note, auto_renew=auto_renew)

    def state(self, key: str) -> State | None:
        """The once-record of ``key``: "processing", "failed", "succeeded", or None."""
        key = check_key(key)
        if not provides(self._store, OnceRecords):
            raise lacking(self._store, OnceRecords, "state()")
        row = self._store.once_state(key)
        if row is None or row[0] != "once":
            return None
        value: State | None = row[1]  # type: ignore[assignment]
        return value

    def scheduled(
        self, name: str, at_most: float, at_least: float = 0.0
    ) -> Callable[[Callable[P, R]], Callable[P, R | None]]:
        """Decorator for a job fired on many hosts at once: exactly one runs it.

        A host that cannot take the lock skips the run and returns None. The lease lasts at
        most ``at_most`` s; a job that ends early keeps the lock until ``at_least`` s after its
        start, so schedulers whose clocks differ a little do not run it twice.
        """
        return scheduled(self._core, name, at_most, at_least)

    def locked(
        self,
        template: str,
        *,
        ttl: float = 30.0,
        timeout: float | None = None,
        reentrant: bool = True,
        auto_renew: bool = False,
    ) -> Callable[[Callable[P, R]], Callable[P, R]]:
        """Decorator: hold the lock ``template.format(**call arguments)`` during each call.

        >>> @client.locked("settle:{request_no}", ttl=60, timeout=0)
        ... def settle(request_no, amount): ...   # busy -> LockTimeout
        """
        return locked(
            self.lock,
            template,
            ttl=ttl,
            timeout=timeout,
            reentrant=reentrant,
            auto_renew=auto_renew,
        )

    # -- inspection and maintenance -------------------------------------------------------
    def info(self, key: str) -> LockInfo | None:
        """The current, unexpired hold of ``key``, or None."""
        return self._store.info(check_key(key))

    def list(self, prefix: str = "") -> list[LockInfo]:
        """All current holds whose key starts with ``prefix``, sorted by key (code points)."""
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
        if prefix:
            check_key(prefix)  # the same rules as a key: no NUL, valid Unicode
        return self._store.list_holds(prefix)

    def force_release(self, key: str) -> bool:
        """Operator's override: end whatever live hold ``key`` has. True if one was freed.

        On PostgreSQL the holder's client hears of it at once (``on_lost``, for locks that have
        one or ``auto_renew``); elsewhere at its next renewal, release (``LockLost``), renew or
        re-entrant acquire.
        """
        return self._store.force_release(check_key(key))

    def purge(self, older_than: float = 0.0, *, include_once: bool = False) -> int:
        """Delete rows of locks not held now, released or expired more than ``older_than`` s ago.

        ``once`` records are kept unless ``include_once=True`` (then finished ones go too).
        Fencing tokens stay monotonic across a purge. Returns how many rows were deleted.
        """
        if isinstance(older_than, bool) or not isinstance(older_than, (int, float)):
            raise TypeError("older_than must be a number of seconds")
        if not math.isfinite(older_than) or older_than < 0:
            raise ValueError(f"older_than must be a finite number >= 0, got {older_than!r}")
        # no row is older than that: a larger age means the same, and overflows the
        # database's date arithmetic (or Python's int conversion)
        return self._store.purge(min(float(older_than), MAX_PURGE_AGE), bool(include_once))

    # -- lifecycle ------------------------------------------------------------------------
    def close(self) -> None:
        """Stop background renewal and close every connection. Idempotent.

        Holds still open are left to expire with their leases (they are not released for
        you: a lock you forgot to release should not silently protect nothing).
        """
        if self._closed:
            return
        self._closed = True
        self._core.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<dblock.Client {self.url} table={self.table}>"


Client.__module__ = "dblock"
connect.__module__ = "dblock"

__all__ = ["Client", "connect"]
