"""What the SQL stores (and Redis) share: connection pool, retry policy, error wrapping.

Retry policy: a statement that fails because its pooled connection was
dropped (server restart, ``pg_terminate_backend``, MariaDB ``KILL``) is run once more on a
fresh connection (the idle pool is emptied too: a restart kills every pooled connection); a
deadlock or serialization failure is retried with jittered backoff for up to ``STATEMENT_DEADLINE``
(within the caller's deadline): InnoDB reports deadlocks between transactions that insert new
keys even when every transaction takes its rows in the same order. Both are safe because
every lock operation is idempotent for the same owner (see the backend SQL). Anything else
becomes :class:`BackendError` at once.

No statement may hang: a watchdog aborts one that has not finished within its deadline (a
frozen server or a network partition that drops packets without a reset), by shutting its
connection's socket down, and the caller gets BackendError. A server that is only slow does
not notice a client gone while its statement waits (for a row lock, say): it would run the
statement to its end, and a grant would commit that nobody knows of. So the statement's
server session is ended from another connection first, within ``ABANDONED_WAIT`` (a frozen
server is not waited for), and the error says whether it was: an acquire then ends any hold
the statement left (see the engine's ``_granting``).

The pool holds at most ``max_connections`` connections, idle or in use (``connect()``'s option;
all of them stay open for reuse). A connection is held only while one statement (or one
transaction) runs, never while a thread waits for another connection, so a thread that finds
them all in use waits for one, and is always served: within its caller's deadline (an
acquire's timeout), else within ``MAINTENANCE_DEADLINE``.
"""

from __future__ import annotations

import contextlib
import random
import time
from abc import abstractmethod
from collections import deque
from collections.abc import Callable
from enum import Enum
from functools import partial
from typing import Generic, TypeVar

from .. import _forksafe
from .._contract import Store, Subscription
from .._errors import BackendError, ConfigurationError, DBLockError
from .._runtime import Event
from .._timing import DeadlinePassed, bounded_wait, time_left
from .._url import DatabaseURL, scrub, scrub_exception
from ._watchdog import Watchdog, run_aside

C = TypeVar("C")
T = TypeVar("T")

_TRANSIENT_ATTEMPTS = 5
#: connections (idle or in use) a client's pool holds at most, unless connect() says otherwise
DEFAULT_MAX_CONNECTIONS = 10
#: how long one lock statement may take before it is aborted, seconds
STATEMENT_DEADLINE = 5.0
#: the longest a statement waits for a row lock (the server's lock timeout on the pool's
#: sessions), well inside STATEMENT_DEADLINE: a row held longer is held by a transaction that
#: may last any time (a holder's guard), so its try answers "busy" instead of being aborted
ROW_LOCK_WAIT = 1.0
#: the same for maintenance over many rows (list, purge, creating the schema)
MAINTENANCE_DEADLINE = 120.0
#: how long an aborted statement's caller waits for its server session to be ended: past it
#: the caller cannot end what the statement may still commit (2 s was overrun on a machine
#: three times slower than usual, and the statement then committed a grant: CI)
ABANDONED_WAIT = 5.0
#: the connect timeout of the connection that ends it, whole seconds
ABANDONED_CONNECT_TIMEOUT = 2


class Failure(Enum):
    """How a driver error affects the retry decision."""

    DISCONNECT = "disconnect"  # the connection is dead: discard it, retry on a new one
    TRANSIENT = "transient"  # deadlock / serialization failure: retry the statement
    #: waited ROW_LOCK_WAIT for a row an open transaction holds (a holder's guard): the
    #: engine's tries count it as busy; anyone else gets a BackendError that says so
    ROW_LOCKED = "row locked"
    FATAL = "fatal"  # anything else: wrap and raise


class Sleeper(Subscription):
    """A Subscription that only sleeps: for backends that cannot push releases."""

    live = False
    targeted = False
    latched = False
    granted: int | None = None

    def __init__(self, event: Event) -> None:
        self._event = event

    def wait(self, timeout: float) -> bool:
        self._event.wait(timeout)
        return False

    def close(self) -> None:
        self._event.set()


class _Turn(Generic[C]):
    """A thread (or task) waiting for a pooled connection: given one, or room to open one."""

    __slots__ = ("conn", "ready", "room")

    def __init__(self, ready: Event) -> None:
        self.conn: C | None = None
        self.room = False
        self.ready = ready  # set when served (or the client is closed)


class PooledStore(Store, Generic[C]):
    """Pool, retries and error wrapping around a DB-API driver. Subclasses supply SQL."""

    dialect: str
    #: the driver has no asyncio connections: the async client runs each operation (one
    #: function of a connection) on a worker thread
    asyncio_io = "driver"

    def __init__(self, url: DatabaseURL, table: str) -> None:
        self.safe_url = url.safe
        self.table = table
        self._secrets = url.secrets
        #: the pool's bound: connections idle or in use
        self.max_connections = url.max_connections or DEFAULT_MAX_CONNECTIONS
        self._idle: list[C] = []
        self._open = 0  # connections of the pool, idle or in use (or being opened)
        self._turns: deque[_Turn[C]] = deque()  # threads waiting for a connection, in order
        self._pool_lock = _forksafe.lock()
        self._pid = _forksafe.pid()
        self._closed = False
        self._watchdog = Watchdog(f"dblock-watchdog[{table}]", STATEMENT_DEADLINE)

    # -- to implement -------------------------------------------------------------------
    @abstractmethod
    def _connect(self) -> C:
        """Open a new connection in autocommit mode."""

    @abstractmethod
    def _close_connection(self, conn: C) -> None:
        """Close a connection, ignoring errors."""

    def _end_abandoned(self, conn: C) -> Callable[[], None] | None:
        """For a statement on ``conn`` aborted past its deadline: what ends its server
        session from a new connection of the blocking driver, waiting until it has ended
        (run on a thread of its own). None where the abort itself ended the statement."""
        return None

    def _settle_abandoned(self, conn: C) -> bool:
        """Run :meth:`_end_abandoned`'s task; whether it finished within ``ABANDONED_WAIT``
        (True: the statement no longer runs, whatever it did is committed or undone)."""
        task = self._end_abandoned(conn)
        if task is None:
            return False
        what = f"end an abandoned statement on {self.safe_url}"
        wait = run_aside(task, "dblock-end-abandoned", what)
        return self.rt.offload(wait, ABANDONED_WAIT)

    def _read_timed_out(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the driver giving up on a statement that took longer than the
        connection's read timeout (the server may still be running it)."""
        return False

    @abstractmethod
    def _classify(self, exc: BaseException) -> Failure | None:
        """Classify a driver exception; None if it is not the driver's."""

    def _reset(self, conn: C) -> None:
        """Bring a connection back to a clean state after a failed statement."""

    def _interrupted(self, conn: C) -> None:
        """A statement on ``conn`` was interrupted (a cancellation, Ctrl-C) and ``conn`` is
        about to be closed: make sure the statement is not still running in the server,
        where it could commit later (a grant nobody would know of). Nothing to do where the
        interruption waited for the statement to end."""

    @abstractmethod
    def _abort(self, conn: C) -> None:
        """Make a statement blocked on ``conn`` fail now (called from the watchdog thread)."""

    # -- pool ---------------------------------------------------------------------------
    def _checkout(self) -> C:
        """An idle connection, else a new one while fewer than ``max_connections`` are open,
        else the next one put back (first come, first served): waited for within the caller's
        deadline (DeadlinePassed, nothing done), or ``MAINTENANCE_DEADLINE`` without one
        (BackendError)."""
        turn: _Turn[C] | None = None
        with self._pool_lock:
            self._check_pool()
            if self._idle:
                return self._idle.pop()
            if self._open < self.max_connections:
                self._open += 1
            else:
                turn = _Turn(self.rt.event())
                self._turns.append(turn)
        if turn is not None:
            wait, cut = bounded_wait(MAINTENANCE_DEADLINE)
            try:
                turn.ready.wait(wait)
            except BaseException:  # a cancellation, Ctrl-C: what it was given goes on
                self._leave_line(turn)
                raise
            with self._pool_lock:
                if turn.conn is not None:
                    return turn.conn
                if not turn.room:  # not served in time, or the client was closed
                    with contextlib.suppress(ValueError):
                        self._turns.remove(turn)
                    self._check_pool()
                    if cut:
                        raise DeadlinePassed(
                            f"all {self.max_connections} connections of the dblock client for "
                            f"{self.safe_url} stayed in use until the caller's deadline"
                        )
                    raise BackendError(
                        f"all {self.max_connections} connections of the dblock client for "
                        f"{self.safe_url} (table {self.table}) stayed in use for {wait:g} s; "
                        "raise max_connections"
                    )
        try:
            if self.offloads:
                return self.rt.offload(self._connect, discard=self._close_connection)
            return self._connect()
        except BaseException:
            self._forget(1)
            raise

    def _leave_line(self, turn: _Turn[C]) -> None:
        """``turn``'s waiter was interrupted: out of the line, and a connection or room it
        was given passes to the next one, or it would be lost to the pool for good."""
        with self._pool_lock:
            conn, room = turn.conn, turn.room
            turn.conn, turn.room = None, False
            if conn is None and not room:
                with contextlib.suppress(ValueError):
                    self._turns.remove(turn)
        if conn is not None:
            self._checkin(conn)
        elif room:
            self._forget(1)

    def _check_pool(self) -> None:
        """Raise if the client is closed; after a fork, forget the parent's connections."""
        if self._closed:
            raise BackendError(f"the dblock client for {self.safe_url} is closed")
        if self._pid != _forksafe.pid():
            # Forked: the parent's sockets are not ours. Forget them without closing, as
            # closing would send a goodbye on the parent's connection.
            self._idle.clear()
            self._turns.clear()
            self._open = 0
            self._pid = _forksafe.pid()

    def _forget(self, count: int) -> None:
        """``count`` connections of the pool were closed: room for as many new ones, given
        to the threads waiting first."""
        with self._pool_lock:
            self._open = max(0, self._open - count)
            while self._turns and self._open < self.max_connections:
                turn = self._turns.popleft()
                turn.room = True
                self._open += 1
                turn.ready.set()

    def _checkin(self, conn: C) -> None:
        with self._pool_lock:
            if not self._closed and self._pid == _forksafe.pid():
                if self._turns:  # straight to the thread waiting first
                    turn = self._turns.popleft()
                    turn.conn = conn
                    turn.ready.set()
                else:
                    self._idle.append(conn)
                return
        self._discard(conn)

    def _discard(self, conn: C) -> None:
        """Close a connection of the pool (dead, aborted, or the client closed)."""
        self._close_connection(conn)
        if self._pid == _forksafe.pid():
            self._forget(1)

    def close(self) -> None:
        with self._pool_lock:
            self._closed = True
            turns, self._turns = self._turns, deque()
        for turn in turns:  # they find the client closed
            turn.ready.set()
        self._drain()
        self._watchdog.stop()

    def _drain(self) -> None:
        """Close every idle connection (after a disconnect they are likely dead too)."""
        with self._pool_lock:
            idle, self._idle = self._idle, []
        if self._pid == _forksafe.pid():
            for conn in idle:
                self._close_connection(conn)
            self._forget(len(idle))

    # -- running ------------------------------------------------------------------------
    def run(  # noqa: PLR0912, PLR0915 - the retry policy, in one place
        self,
        what: str,
        fn: Callable[[C], T],
        *,
        key: str | None = None,
        deadline: float = STATEMENT_DEADLINE,
    ) -> T:
        """Run ``fn(conn)`` with the retry policy; wrap driver errors in BackendError.

        ``fn`` is aborted if it has not finished ``deadline`` seconds after it started.
        """
        reconnected = False
        attempt = 0
        started = time.monotonic()
        # a statement of the cleanup after a cancellation (leaving a queue) carries that
        # cancellation on its errors, but is no interrupted statement: it is retried as usual
        # (asked before the statement: a cancellation thrown into it is its interruption)
        earlier = self.rt.cleaning_up()
        busy: tuple[float, bool] | None = None
        offloads = self.offloads
        while True:
            attempt += 1
            try:
                conn = self._checkout()
            except DBLockError:  # dblock's own (a deadline, a refused file): pass it on
                raise
            except Exception as exc:
                raise self._connect_error(exc, key) from exc
            ident, watch = self._watchdog.watch(deadline, partial(self._abort, conn))
            try:
                result = self.rt.offload(fn, conn) if offloads else fn(conn)
            except BaseException as exc:
                self._watchdog.done(ident)
                interruption = _interruption(exc)
                failure = self._classify(exc)
                if interruption is not None and (interruption is not earlier or failure is None):
                    # a cancellation or Ctrl-C, maybe followed by a driver error in the
                    # statement's own cleanup (a rollback on the interrupted connection):
                    # never retried, and the interruption is what propagates
                    self._interrupted(conn)
                    self._discard(conn)
                    if interruption is exc:
                        raise
                    raise interruption from exc
                if watch.aborted:
                    settled = self._settle_abandoned(conn)
                    self._discard(conn)
                    error = BackendError(
                        f"{what} on {self.safe_url} did not complete within {deadline:g} s "
                        f"(table {self.table}): the server or the network is not answering",
                        key=key,
                    )
                    error._settled = settled
                    raise error from exc
                if failure is None:
                    self._discard(conn)
                    raise
                if failure is Failure.DISCONNECT:
                    # a statement the driver gave up on may still run in the server (waiting
                    # for a row lock) and commit later: it is ended before anything is retried
                    timed_out = self._read_timed_out(exc)
                    settled = timed_out and self._settle_abandoned(conn)
                    self._discard(conn)
                    self._drain()
                    if not reconnected and (settled or not timed_out):
                        reconnected = True
                        continue
                    error = self._wrap(exc, f"{what} failed on {self.safe_url}", key)
                    error._settled = settled
                    raise error from exc
                self._reset_or_discard(conn)
                if failure is Failure.ROW_LOCKED:
                    left = time_left()
                    if (left is None or left > ROW_LOCK_WAIT) and (
                        attempt * ROW_LOCK_WAIT < STATEMENT_DEADLINE
                    ):
                        # wait for the row again, as long as a statement may (counted in
                        # waits, not in time: a pause of the process is no wait)
                        continue
                    error = BackendError(
                        f"{what} on {self.safe_url} (table {self.table}"
                        + ("" if key is None else f", key {key!r}")
                        + ") waited for a row that an open transaction "
                        "holds: most likely its holder's lock.guard(conn) transaction, which "
                        "keeps takeovers, force-release and purge off the row until it ends; "
                        "try again once it has",
                        key=key,
                    )
                    error._row_locked = True
                    raise error from exc
                if failure is Failure.TRANSIENT:
                    if busy is None:
                        # a busy database is waited for no longer than the caller's deadline
                        # allows, counted from the call's start
                        busy = bounded_wait(self._transient_for, since=started)
                    busy_for, cut = busy
                    if attempt < _TRANSIENT_ATTEMPTS or time.monotonic() < started + busy_for:
                        self.rt.sleep(self._transient_pause(attempt))
                        continue
                    if cut:
                        # busy past the caller's deadline; the statement did nothing
                        raise DeadlinePassed(
                            f"{what} on {self.safe_url} (table {self.table}) found the database "
                            "busy until the caller's deadline",
                            key=key,
                        ) from None
                raise self._wrap(exc, f"{what} failed on {self.safe_url}", key) from exc
            self._watchdog.done(ident)
            if watch.aborted:  # it finished just as it was being aborted
                self._discard(conn)
            else:
                self._checkin(conn)
            return result

    #: keep retrying transient failures for this long (beyond the first few attempts): a
    #: deadlock victim did nothing, and InnoDB may choose the same transaction again and again
    _transient_for = STATEMENT_DEADLINE

    def _transient_pause(self, attempt: int) -> float:
        """Sleep before retrying a deadlock or serialization failure."""
        return random.uniform(0.001, min(0.01 * attempt, 0.1))

    def _reset_or_discard(self, conn: C) -> None:
        try:
            self._reset(conn)
        except Exception:  # noqa: BLE001 - a connection that cannot reset is dropped
            self._discard(conn)
        else:
            self._checkin(conn)

    def _refused(self, exc: BaseException) -> str | None:
        """What to change, if ``exc`` (from connecting) is the server refusing for good what
        the URL gave (a password, a role, a database, a parameter): retrying cannot help."""
        return None

    def _connect_error(self, exc: BaseException, key: str | None) -> DBLockError:
        """The error for a connection that could not be made: ``ConfigurationError`` for
        what the server refuses for good (the CLI's exit 2), else ``BackendError`` (69)."""
        fix = self._refused(exc)
        if fix is None:
            return self._wrap(exc, f"cannot connect to {self.safe_url}", key)
        scrub_exception(exc, self._secrets)  # it travels on as the __cause__
        detail = scrub((str(exc).strip().splitlines() or [type(exc).__name__])[0], self._secrets)
        return ConfigurationError(f"{self.safe_url} refused the connection: {detail} ({fix})")

    def _wrap(self, exc: BaseException, doing: str, key: str | None) -> BackendError:
        scrub_exception(exc, self._secrets)  # it travels on as the __cause__
        detail = scrub((str(exc).strip().splitlines() or [type(exc).__name__])[0], self._secrets)
        where = f" (table {self.table})" if key is None else f" (key {key!r}, table {self.table})"
        return BackendError(f"{doing}{where}: {detail}", key=key)

    def subscribe(self, key: str, owner: str, queue: str | None = None) -> Subscription:
        return Sleeper(self.rt.event())


def _interruption(exc: BaseException) -> BaseException | None:
    """The cancellation or Ctrl-C (a BaseException that is not an Exception) that ``exc`` is,
    or that it was raised while handling; None if there is none."""
    seen: BaseException | None = exc
    for _ in range(8):  # a cleanup's error chain is short
        if seen is None:
            return None
        if not isinstance(seen, Exception):
            return seen
        seen = seen.__context__
    return None
