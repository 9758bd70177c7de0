"""The asyncio API: ``await connect_async(url)``, the same names as the blocking client.

Nothing here re-implements a lock. Each async call runs the blocking client's own code (the
same engine, locks, patterns and store) in a greenlet (:mod:`dblock._green`), on a runtime
whose waits await on the event loop (:mod:`dblock._loop_runtime`), over the driver's asyncio
connections. What is async-only lives here:

* the owner for re-entrancy is the asyncio task;
* the watchdog (``auto_renew``) and loss checks are tasks on the client's loop, and ``on_lost``
  may be a coroutine function (it is then run as a task);
* **waiting is shared per key**: the tasks of one client that wait for the same key line up
  in the client (first come, first served), and only the first of them waits in the store.
  1,000 tasks waiting on 10 keys cost the database what 10 waiting processes cost, and no
  more connections than the pool's bound (``max_connections``, default 10).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from ._async_election import AsyncElection, AsyncTerm
from ._client import Client, open_store
from ._green import spawn
from ._lock import Lock
from ._loop_runtime import LoopRuntime
from ._many import ManyLock
from ._patterns import OnceLock, key_template, scheduled_lock
from ._rwlock import RWLock
from ._types import LockInfo, State
from ._validate import check_timeout

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from ._client import Borrowed

log = logging.getLogger("dblock")
P = ParamSpec("P")
R = TypeVar("R")
OnLost = Callable[["AsyncLock"], object]


async def open_client(
    url: str | Sequence[str] | AsyncEngine | Borrowed | None,
    table: str,
    create_schema: bool,
    max_connections: int | None,
) -> AsyncClient:
    """What :func:`dblock.connect_async` does once greenlet is known to import: the store,
    opened on this loop's runtime, behind an async client."""
    runtime = LoopRuntime(asyncio.get_running_loop())
    store = await spawn(open_store, url, table, create_schema, max_connections, runtime)
    return AsyncClient(Client(store, runtime), runtime)


class _Gate:
    """The tasks of one client waiting for one key, served in arrival order.

    (Not ``asyncio.Lock`` under ``wait_for``: before Python 3.12 ``wait_for`` could swallow a
    cancellation that came as the lock was granted, and a cancelled task would go on to take
    the key.)
    """

    __slots__ = ("busy", "users", "waiters")

    def __init__(self) -> None:
        self.busy = False
        self.waiters: deque[asyncio.Future[None]] = deque()
        self.users = 0

    async def enter(self, timeout: float | None) -> bool:
        """Wait for our turn; False if ``timeout`` s passed first."""
        if not self.busy and not self.waiters:
            self.busy = True
            return True
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(turn)
        try:
            await asyncio.wait((turn,), timeout=timeout)
        except BaseException:
            self._give_up(turn)
            raise
        if turn.done():
            return True
        self._give_up(turn)
        return False

    def _give_up(self, turn: asyncio.Future[None]) -> None:
        if turn.done() and not turn.cancelled():
            self.leave()  # it was our turn already: pass it on
        else:
            turn.cancel()
            with contextlib.suppress(ValueError):
                self.waiters.remove(turn)

    def leave(self) -> None:
        """Hand the turn to the next waiting task, or free the gate."""
        while self.waiters:
            turn = self.waiters.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self.busy = False


class AsyncLock:
    """A lock of the async client: ``await acquire()``, ``await release()``, ``async with``.

    ``held``, ``token``, ``key``, ``owner`` and ``lease_end`` are plain attributes, read for
    the current task, as on the blocking :class:`dblock.Lock`.
    """

    def __init__(
        self,
        client: AsyncClient,
        make: Callable[[Callable[[Lock], object] | None], Lock],
        on_lost: OnLost | None,
    ) -> None:
        self._client = client
        self._on_lost = on_lost
        self._lock = make(None if on_lost is None else self._lost)

    # -- attributes, as on the blocking lock --------------------------------------------
    @property
    def key(self) -> str:
        return self._lock.key

    @property
    def ttl(self) -> float:
        return self._lock.ttl

    @property
    def held(self) -> bool:
        return self._lock.held

    @property
    def token(self) -> int | None:
        return self._lock.token

    @property
    def owner(self) -> str:
        return self._lock.owner

    @property
    def lease_end(self) -> float | None:
        return self._lock.lease_end

    # -- operations -----------------------------------------------------------------------
    async def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Take the lock; False if it was not had in time (see :meth:`dblock.Lock.acquire`).

        A cancellation (``task.cancel()``, ``asyncio.timeout``, ``wait_for``) leaves nothing
        behind: no hold (one granted as it came is released first), no queue entry.
        """
        lock = self._lock
        wait = check_timeout(timeout) if timeout is not None else lock._timeout
        if not blocking or wait == 0 or self._reentering():
            return await spawn(lock.acquire, blocking, wait)
        gates = self._client._gates
        name = (lock.key, lock._spec.kind)
        gate = gates.get(name)
        if gate is None:
            gate = gates[name] = _Gate()
        gate.users += 1
        try:
            deadline = None if wait is None else time.monotonic() + wait
            if not await gate.enter(wait):
                return False
            try:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                return await spawn(lock.acquire, True, left)
            finally:
                gate.leave()
        finally:
            gate.users -= 1
            if gate.users == 0 and gates.get(name) is gate:
                del gates[name]

    def _reentering(self) -> bool:
        """This task holds the key already (it must not queue behind those waiting for it)."""
        lock = self._lock
        core = lock._core
        return lock._reentrant and core.reentrant_hold(lock.key, core.owner_serial()) is not None

    async def release(self) -> None:
        """Release one acquisition (NotHeld, LockLost as :meth:`dblock.Lock.release`). A
        cancellation waits for the release to complete, then propagates."""
        await spawn(self._lock.release, shielded=True)

    async def renew(self, ttl: float | None = None) -> None:
        """Extend the lease (NotHeld, LockLost as :meth:`dblock.Lock.renew`)."""
        await spawn(self._lock.renew, ttl)

    async def locked(self) -> bool:
        """Ask the store: is the key held by anyone now?"""
        return await spawn(self._lock.locked)

    async def guard(self, conn: object) -> None:
        """Check this hold in ``conn``'s open transaction and keep its row still until that
        transaction ends (see :meth:`dblock.Lock.guard`); ``conn`` is an asyncio connection
        (psycopg ``AsyncConnection``, aiomysql, aiosqlite, SQLAlchemy ``AsyncConnection`` or
        ``AsyncSession``)."""
        await spawn(self._lock.guard, conn)

    def _lost(self, _lock: Lock) -> None:
        """``on_lost`` with this object; a coroutine function's call runs as a task."""
        on_lost = self._on_lost
        if on_lost is None:
            return
        result = on_lost(self)
        if inspect.isawaitable(result):
            self._client._background(result, f"on_lost of lock {self.key!r}")

    async def __aenter__(self) -> AsyncLock:
        if not await self.acquire():
            raise self._lock._timed_out()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.release()

    def __repr__(self) -> str:
        return f"<dblock.{type(self).__name__} key={self.key!r} ttl={self.ttl:g} held={self.held}>"


class AsyncManyLock(AsyncLock):
    """``client.lock_many(keys)`` of the async client (see :meth:`dblock.Client.lock_many`):
    ``await acquire()``, ``await release()``, ``async with``; ``tokens`` and ``keys`` as on
    the blocking lock. Its waiters wait in the store, each (no per-key line in the client)."""

    _lock: ManyLock

    @property
    def keys(self) -> tuple[str, ...]:
        return self._lock.keys

    @property
    def tokens(self) -> dict[str, int] | None:
        return self._lock.tokens

    async def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Take every key or none; False if not had in time. A cancellation leaves nothing
        behind (a grant that came as it landed is released, queue entries removed)."""
        wait = check_timeout(timeout) if timeout is not None else self._lock._timeout
        return await spawn(self._lock.acquire, blocking, wait)

    async def __aenter__(self) -> AsyncManyLock:
        await super().__aenter__()
        return self

    def __repr__(self) -> str:
        return f"<dblock.AsyncManyLock keys={self.keys!r} ttl={self.ttl:g} held={self.held}>"


class AsyncOnce(AsyncLock):
    """``async with client.once(key)``: the status lock (see :meth:`dblock.Client.once`)."""

    async def __aenter__(self) -> AsyncOnce:
        await spawn(self._lock.__enter__)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await spawn(self._lock.__exit__, exc_type, exc, tb, shielded=True)


class AsyncRWLock:
    """Many readers or one writer on one key: ``async with rw.read_lock()`` / ``write_lock()``."""

    def __init__(self, client: AsyncClient, rwlock: RWLock) -> None:
        self._client = client
        self._rwlock = rwlock
        self.key = rwlock.key

    def read_lock(self, *, on_lost: OnLost | None = None, auto_renew: bool = False) -> AsyncLock:
        return AsyncLock(
            self._client,
            lambda lost: self._rwlock.read_lock(on_lost=lost, auto_renew=auto_renew),
            on_lost,
        )

    def write_lock(self, *, on_lost: OnLost | None = None, auto_renew: bool = False) -> AsyncLock:
        return AsyncLock(
            self._client,
            lambda lost: self._rwlock.write_lock(on_lost=lost, auto_renew=auto_renew),
            on_lost,
        )

    def __repr__(self) -> str:
        return f"<dblock.AsyncRWLock key={self.key!r}>"


class AsyncClient:
    """The async client: every call that touches the database is awaited. Use it with
    ``async with`` or ``await close()``. It belongs to the event loop it was made on."""

    def __init__(self, client: Client, runtime: LoopRuntime) -> None:
        self._sync = client
        self._runtime = runtime
        self._gates: dict[tuple[str, str], _Gate] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def url(self) -> str:
        return self._sync.url

    @property
    def table(self) -> str:
        return self._sync.table

    @property
    def dialect(self) -> str:
        return self._sync.dialect

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
        on_lost: OnLost | None = None,
    ) -> AsyncLock:
        """A lease lock on ``key`` (not yet acquired; creating it does no I/O); ``ttl=None``: a
        session hold (see :meth:`dblock.Client.lock`)."""
        return AsyncLock(
            self,
            lambda lost: self._sync.lock(
                key,
                ttl=ttl,
                timeout=timeout,
                reentrant=reentrant,
                auto_renew=auto_renew,
                fair=fair,
                on_lost=lost,
            ),
            on_lost,
        )

    def lock_many(
        self,
        keys: Iterable[str],
        *,
        ttl: float | None = 30.0,
        timeout: float | None = None,
        auto_renew: bool = False,
        on_lost: Callable[[AsyncManyLock], object] | None = None,
    ) -> AsyncManyLock:
        """Every key or none (see :meth:`dblock.Client.lock_many`); creating it does no I/O."""
        return AsyncManyLock(
            self,
            lambda lost: self._sync.lock_many(
                keys, ttl=ttl, timeout=timeout, auto_renew=auto_renew, on_lost=lost
            ),
            on_lost,  # type: ignore[arg-type]
        )

    def election(
        self,
        name: str,
        *,
        ttl: float = 15.0,
        on_lost: Callable[[AsyncTerm], object] | None = None,
    ) -> AsyncElection:
        """Leader election (see :meth:`dblock.Client.election`); ``on_lost`` may be a
        coroutine function. Creating it does no I/O."""
        return AsyncElection(self._sync._core, self._background, name, ttl=ttl, on_lost=on_lost)

    def rwlock(self, key: str, *, ttl: float = 30.0, timeout: float | None = None) -> AsyncRWLock:
        return AsyncRWLock(self, self._sync.rwlock(key, ttl=ttl, timeout=timeout))

    def semaphore(
        self, key: str, permits: int, *, ttl: float = 30.0, timeout: float | None = None
    ) -> AsyncLock:
        return AsyncLock(
            self, lambda _: self._sync.semaphore(key, permits, ttl=ttl, timeout=timeout), None
        )

    # -- patterns -------------------------------------------------------------------------
    def once(
        self, key: str, *, ttl: float = 30.0, note: str | None = None, auto_renew: bool = True
    ) -> AsyncOnce:
        """``async with client.once(key)``: see :meth:`dblock.Client.once`."""
        made: OnceLock = self._sync.once(key, ttl=ttl, note=note, auto_renew=auto_renew)
        return AsyncOnce(self, lambda _: made, None)

    async def state(self, key: str) -> State | None:
        return await spawn(self._sync.state, key)

    def scheduled(
        self, name: str, at_most: float, at_least: float = 0.0
    ) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R | None]]]:
        """Decorator for an ``async def`` job fired on many hosts at once: exactly one runs
        it, the others get None (see :meth:`dblock.Client.scheduled`)."""
        new_lock = scheduled_lock(self._sync._core, name, at_most, at_least)

        def decorate(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R | None]]:
            _need_coroutine_function(fn, "scheduled")

            @functools.wraps(fn)
            async def run(*args: P.args, **kwargs: P.kwargs) -> R | None:
                lock = new_lock()
                if not await spawn(lock.acquire, False):
                    log.debug("scheduled job %r skipped: another host holds its lock", name)
                    return None
                try:
                    return await fn(*args, **kwargs)
                finally:
                    await spawn(lock.release, shielded=True)

            return run

        return decorate

    def locked(
        self,
        template: str,
        *,
        ttl: float = 30.0,
        timeout: float | None = None,
        reentrant: bool = True,
        auto_renew: bool = False,
    ) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
        """Decorator for an ``async def``: hold ``template.format(**arguments)`` during each
        call (see :meth:`dblock.Client.locked`)."""
        keys = key_template(template, ttl)

        def decorate(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
            _need_coroutine_function(fn, "locked")
            key_of = keys(fn)

            @functools.wraps(fn)
            async def call(*args: P.args, **kwargs: P.kwargs) -> R:
                lock = self.lock(
                    key_of(*args, **kwargs),
                    ttl=ttl,
                    timeout=timeout,
                    reentrant=reentrant,
                    auto_renew=auto_renew,
                )
                async with lock:
                    return await fn(*args, **kwargs)

            return call

        return decorate

    # -- inspection and maintenance -------------------------------------------------------
    async def info(self, key: str) -> LockInfo | None:
        return await spawn(self._sync.info, key)

    async def list(self, prefix: str = "") -> list[LockInfo]:
        return await spawn(self._sync.list, prefix)

    async def force_release(self, key: str) -> bool:
        return await spawn(self._sync.force_release, key)

    async def purge(self, older_than: float = 0.0, *, include_once: bool = False) -> int:
        return await spawn(
            functools.partial(self._sync.purge, include_once=include_once), older_than
        )

    # -- lifecycle ------------------------------------------------------------------------
    def _background(self, awaitable: Awaitable[Any], what: str) -> None:
        async def run() -> None:
            try:
                await awaitable
            except Exception:
                log.exception("dblock: %s raised", what)

        task = asyncio.ensure_future(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Stop background renewal and close every connection. Idempotent. Holds still open
        are left to expire with their leases, as with the blocking client."""
        await spawn(self._sync.close)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<dblock.AsyncClient {self.url} table={self.table}>"


def _need_coroutine_function(fn: Callable[..., Any], decorator: str) -> None:
    if not inspect.iscoroutinefunction(fn):
        raise TypeError(
            f"the async client's {decorator}() decorates `async def` functions; "
            f"{getattr(fn, '__qualname__', fn)!r} is not one (use dblock.connect() for it)"
        )


for _cls in (AsyncClient, AsyncLock, AsyncOnce, AsyncRWLock):
    _cls.__module__ = "dblock"

__all__ = ["AsyncClient", "AsyncLock", "AsyncOnce", "AsyncRWLock", "open_client"]
