"""Read-write locks and semaphores: Lock objects of the shared kinds (``SharedHolds``).

Each hold has its own lease and fencing token (taken from the key's counter, so tokens of one
key increase across reads, writes and permits alike). Waiters that must keep their place — a
fair lock's waiters, a waiting writer — keep a queue entry with a lease of its own
(``QUEUE_TTL``), refreshed while they wait, so a waiter that died or gave up does not block
the queue for longer than that.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ._core import Core
from ._engine import Spec
from ._lock import Lock
from ._validate import check_key, check_timeout, check_ttl

L = TypeVar("L", bound=Lock)


class ReadLock(Lock):
    """A read hold of an RWLock: many at once, none while a writer holds or waits."""


class WriteLock(Lock):
    """The write hold of an RWLock: alone, and waiting writers block new readers."""


class RWLock:
    """Many readers or one writer on one key. Create it with :meth:`Client.rwlock`.

    >>> rw = client.rwlock("catalog")
    >>> with rw.read_lock(): ...     # many readers at once
    >>> with rw.write_lock(): ...    # one writer, no readers
    """

    def __init__(
        self, core: Core, key: str, *, ttl: float = 30.0, timeout: float | None = None
    ) -> None:
        self._core = core
        # validate now, with the same rules as a Lock
        self.key, self.ttl, self.timeout = check_key(key), check_ttl(ttl), check_timeout(timeout)
        Spec(self.key, self.ttl, "write").check(core.store)  # what its write holds need

    def read_lock(
        self, *, on_lost: Callable[[Lock], object] | None = None, auto_renew: bool = False
    ) -> ReadLock:
        """A new read hold (not yet acquired); use it with ``with``."""
        return self._hold(ReadLock, "read", on_lost, auto_renew)

    def write_lock(
        self, *, on_lost: Callable[[Lock], object] | None = None, auto_renew: bool = False
    ) -> WriteLock:
        """A new write hold (not yet acquired); use it with ``with``."""
        return self._hold(WriteLock, "write", on_lost, auto_renew)

    def _hold(
        self,
        cls: type[L],
        kind: str,
        on_lost: Callable[[Lock], object] | None,
        auto_renew: bool,
    ) -> L:
        return cls(
            self._core,
            self.key,
            ttl=self.ttl,
            timeout=self.timeout,
            reentrant=False,
            auto_renew=auto_renew,
            on_lost=on_lost,
            kind=kind,
        )

    def __repr__(self) -> str:
        return f"<dblock.RWLock key={self.key!r}>"


class Semaphore(Lock):
    """At most ``permits`` holders of a key at once; each permit has its own lease.

    ``acquire``/``release``/``with`` work as on a Lock; every acquisition takes one permit.
    The limit is checked by each acquirer against its own ``permits``: callers that disagree
    admit themselves only while fewer holds than their own ``permits`` exist, and no existing
    holder is ever evicted, so lowering ``permits`` takes effect as holders leave.
    """

    def __init__(
        self,
        core: Core,
        key: str,
        permits: int,
        *,
        ttl: float = 30.0,
        timeout: float | None = None,
    ) -> None:
        if isinstance(permits, bool) or not isinstance(permits, int):
            raise TypeError(f"permits must be an int, not {type(permits).__name__}")
        if permits < 1:
            raise ValueError(f"permits must be >= 1, got {permits}")
        super().__init__(core, key, ttl=ttl, timeout=timeout, reentrant=False, kind="semaphore")
        self._spec.permits = permits

    @property
    def permits(self) -> int:
        return self._spec.permits or 0
