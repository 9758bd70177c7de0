"""The exception tree of dblock.

::

    DBLockError                     base of everything below
    ├── LockTimeout                 also a TimeoutError
    ├── NotHeld                     also a RuntimeError
    │   └── LockLost                the lease was gone before release/renew
    ├── (EventLoopError)            also a RuntimeError: the sync API's acquire on a thread
    │                               that runs an asyncio event loop
    ├── InProgress                  once(): someone is processing the key now
    ├── AlreadyDone                 once(): the key has already succeeded
    ├── ConfigurationError          also a ValueError: bad URL, table name, option
    └── BackendError                the database failed or could not be reached;
                                    the driver's exception is its ``__cause__``

Every error that concerns one key carries it as ``.key``. Errors pickle, so they cross
process boundaries (multiprocessing, concurrent.futures) intact.
"""

from __future__ import annotations

from typing import Any


class DBLockError(Exception):
    """Base class of every error raised by dblock."""

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.key = key

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, self.key))

    def __str__(self) -> str:
        return self.message


def _rebuild(cls: type[DBLockError], message: str, key: str | None) -> DBLockError:
    return cls(message, key=key)


class LockTimeout(DBLockError, TimeoutError):
    """The lock was not acquired within the timeout."""


class NotHeld(DBLockError, RuntimeError):
    """release() or renew() of a lock this owner does not hold."""


class LockLost(NotHeld):
    """The lease expired or was taken over before release() or renew().

    The work done under the lock ran partly unprotected: another owner may have acted at the
    same time. Fencing tokens (``lock.token``) let the protected resource reject such writes.
    """


class EventLoopError(DBLockError, RuntimeError):
    """A blocking acquire was called on a thread that is running an asyncio event loop.

    All coroutines of a loop share its thread, so per-thread re-entrancy would let every one of
    them in at once, and a blocking wait would freeze the loop. Not exported by name (the
    public error tree is fixed): catch it as ``DBLockError`` or ``RuntimeError``.
    """


class GuardOpen(DBLockError, RuntimeError):
    """``release()`` or ``renew()`` of a hold while the transaction that ``lock.guard(conn)``
    guards is still open: its statement would wait for that transaction's own row lock
    (the file's write lock on SQLite), so it would never return. Not exported by name (the
    public error tree is fixed): catch it as ``DBLockError`` or ``RuntimeError``.
    """


class InProgress(DBLockError):
    """once(): another owner is processing the key right now."""


class AlreadyDone(DBLockError):
    """once(): the key has already succeeded; it will not run again."""


class ConfigurationError(DBLockError, ValueError):
    """A bad URL, table name or option. Raised before any SQL runs."""


class BackendError(DBLockError):
    """The database failed or could not be reached. ``__cause__`` is the driver's error."""

    #: set by a store: the failed statement overran its deadline, was aborted, and then its
    #: server session was ended, so what it did is settled (committed or undone) and can be
    #: looked for
    _settled: bool = False
    #: set by a store: the statement gave up waiting for a row that an open transaction
    #: holds (a holder's ``lock.guard(conn)``, most likely): a try that found the key busy
    _row_locked: bool = False


for _cls in (
    DBLockError,
    LockTimeout,
    NotHeld,
    LockLost,
    EventLoopError,
    InProgress,
    AlreadyDone,
    ConfigurationError,
    BackendError,
):
    _cls.__module__ = "dblock"
