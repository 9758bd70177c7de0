"""What the SQL backends share: connection pool, retry policy, error wrapping.

Retry policy (PITFALLS 6 and 10): a statement that fails because its pooled connection was
dropped (server restart, ``pg_terminate_backend``, MariaDB ``KILL``) is run once more on a
fresh connection (the idle pool is emptied too: a restart kills every pooled connection); a
deadlock or serialization failure is retried a few times with backoff. Both are safe because
every lock operation is idempotent for the same owner (see the backend SQL). Anything else
becomes :class:`BackendError` at once.

No statement may hang: a watchdog aborts one that has not finished within its deadline (a
frozen server or a network partition that drops packets without a reset), by shutting its
connection's socket down, and the caller gets BackendError.
"""

from __future__ import annotations

import random
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from enum import Enum
from functools import partial
from typing import Generic, TypeVar

from .. import _forksafe
from .._errors import BackendError, ConfigurationError
from ._protocol import Subscription
from ._watchdog import Watchdog

C = TypeVar("C")
T = TypeVar("T")

_TRANSIENT_ATTEMPTS = 5
#: idle connections a backend keeps for reuse
POOL_SIZE = 8
#: how long one lock statement may take before it is aborted, seconds
STATEMENT_DEADLINE = 5.0
#: the same for maintenance over many rows (list, purge, creating the schema)
MAINTENANCE_DEADLINE = 120.0


class Failure(Enum):
    """How a driver error affects the retry decision."""

    DISCONNECT = "disconnect"  # the connection is dead: discard it, retry on a new one
    TRANSIENT = "transient"  # deadlock / serialization failure: retry the statement
    FATAL = "fatal"  # anything else: wrap and raise


class Sleeper:
    """A Subscription that only sleeps: for backends that cannot push releases."""

    live = False
    targeted = False
    latched = False
    granted: int | None = None

    def __init__(self) -> None:
        self._event = threading.Event()

    def wait(self, timeout: float) -> bool:
        self._event.wait(timeout)
        return False

    def close(self) -> None:
        self._event.set()


class SqlBackend(ABC, Generic[C]):
    """Pool, retries and error wrapping around a DB-API driver. Subclasses supply SQL."""

    dialect: str
    probe_first = False
    max_poll = 0.25

    def __init__(self, safe_url: str, table: str, password: str | None) -> None:
        self.safe_url = safe_url
        self.table = table
        self._password = password
        self._idle: list[C] = []
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

    @abstractmethod
    def _classify(self, exc: BaseException) -> Failure | None:
        """Classify a driver exception; None if it is not the driver's."""

    def _reset(self, conn: C) -> None:
        """Bring a connection back to a clean state after a failed statement."""

    @abstractmethod
    def _abort(self, conn: C) -> None:
        """Make a statement blocked on ``conn`` fail now (called from the watchdog thread)."""

    # -- pool ---------------------------------------------------------------------------
    def _checkout(self) -> C:
        with self._pool_lock:
            if self._closed:
                raise BackendError(f"the dblock client for {self.safe_url} is closed")
            if self._pid != _forksafe.pid():
                # Forked: the parent's sockets are not ours. Forget them without closing, as
                # closing would send a goodbye on the parent's connection.
                self._idle.clear()
                self._pid = _forksafe.pid()
            if self._idle:
                return self._idle.pop()
        return self._connect()

    def _checkin(self, conn: C) -> None:
        with self._pool_lock:
            if not self._closed and self._pid == _forksafe.pid() and len(self._idle) < POOL_SIZE:
                self._idle.append(conn)
                return
        self._close_connection(conn)

    def close(self) -> None:
        with self._pool_lock:
            self._closed = True
        self._drain()
        self._watchdog.stop()

    def _drain(self) -> None:
        """Close every idle connection (after a disconnect they are likely dead too)."""
        with self._pool_lock:
            idle, self._idle = self._idle, []
        if self._pid == _forksafe.pid():
            for conn in idle:
                self._close_connection(conn)

    # -- running ------------------------------------------------------------------------
    def run(
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
        give_up = time.monotonic() + self._transient_for
        while True:
            attempt += 1
            try:
                conn = self._checkout()
            except (BackendError, ConfigurationError):  # a setting the driver refused: not 69
                raise
            except Exception as exc:
                raise self._wrap(exc, f"cannot connect to {self.safe_url}", key) from exc
            ident, watch = self._watchdog.watch(deadline, partial(self._abort, conn))
            try:
                result = fn(conn)
            except BaseException as exc:
                self._watchdog.done(ident)
                failure = self._classify(exc)
                if watch.aborted:
                    self._close_connection(conn)
                    raise BackendError(
                        f"{what} on {self.safe_url} did not complete within {deadline:g} s "
                        f"(table {self.table}): the server or the network is not answering",
                        key=key,
                    ) from exc
                if failure is None:
                    self._close_connection(conn)
                    raise
                if failure is Failure.DISCONNECT:
                    self._close_connection(conn)
                    self._drain()
                    if not reconnected:
                        reconnected = True
                        continue
                else:
                    self._reset_or_discard(conn)
                    if failure is Failure.TRANSIENT and (
                        attempt < _TRANSIENT_ATTEMPTS or time.monotonic() < give_up
                    ):
                        time.sleep(self._transient_pause(attempt))
                        continue
                raise self._wrap(exc, f"{what} failed on {self.safe_url}", key) from exc
            self._watchdog.done(ident)
            if watch.aborted:  # it finished just as it was being aborted
                self._close_connection(conn)
            else:
                self._checkin(conn)
            return result

    #: keep retrying transient failures for this long (beyond the first few attempts)
    _transient_for = 0.0

    def _transient_pause(self, attempt: int) -> float:
        """Sleep before retrying a deadlock or serialization failure."""
        return random.uniform(0.001, 0.01 * attempt)

    def _reset_or_discard(self, conn: C) -> None:
        try:
            self._reset(conn)
        except Exception:  # noqa: BLE001 - a connection that cannot reset is dropped
            self._close_connection(conn)
        else:
            self._checkin(conn)

    def _wrap(self, exc: BaseException, doing: str, key: str | None) -> BackendError:
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        if self._password:
            detail = detail.replace(self._password, "***")
        where = f" (table {self.table})" if key is None else f" (key {key!r}, table {self.table})"
        return BackendError(f"{doing}{where}: {detail}", key=key)

    def subscribe(self, key: str, owner: str, queue: str | None = None) -> Subscription:
        return Sleeper()
