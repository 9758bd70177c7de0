"""Read-write locks and semaphores: Lock variants over the holders table.

Each hold has its own lease and fencing token (taken from the key's counter, so tokens of one
key increase across reads, writes and permits alike). Waiters that must keep their place — a
fair lock's waiters, a waiting writer — keep a queue entry with a lease of its own
(``QUEUE_TTL``), refreshed while they wait, so a waiter that died or gave up does not block
the queue for longer than that.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from ._lock import Hold, Lock

if TYPE_CHECKING:
    from ._client import Client

L = TypeVar("L", bound=Lock)


class _SharedHold(Lock):
    """A hold stored in the holders table (a read hold or a semaphore permit)."""

    _permits: int | None = None
    _queue_kind = None

    def _try_acquire(self, owner: str, queued: bool) -> int | None:
        return self._client._backend.acquire_shared(
            self.key, owner, self.ttl, self._kind, self._permits
        )

    def _end_hold(self, hold: Hold) -> bool:
        return self._client._backend.release_shared(self.key, hold.owner, hold.token)

    def _renew_hold(self, hold: Hold, ttl: float) -> bool:
        return self._client._backend.renew_shared(self.key, hold.owner, hold.token, ttl)


class ReadLock(_SharedHold):
    """A read hold of an RWLock: many at once, none while a writer holds or waits."""


class WriteLock(Lock):
    """The write hold of an RWLock: alone, and waiting writers block new readers."""

    _queue_kind = "write"
    _dequeues_itself = True

    def _try_acquire(self, owner: str, queued: bool) -> int | None:
        return self._client._backend.acquire_write(self.key, owner, self.ttl)


class RWLock:
    """Many readers or one writer on one key. Create it with :meth:`Client.rwlock`.

    >>> rw = client.rwlock("catalog")
    >>> with rw.read_lock(): ...     # many readers at once
    >>> with rw.write_lock(): ...    # one writer, no readers
    """

    def __init__(
        self, client: Client, key: str, *, ttl: float = 30.0, timeout: float | None = None
    ) -> None:
        self._client = client
        # validate now, with the same rules as a Lock
        self._probe = Lock(client, key, ttl=ttl, timeout=timeout)
        self.key, self.ttl, self.timeout = key, ttl, timeout

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
            self._client,
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


class Semaphore(_SharedHold):
    """At most ``permits`` holders of a key at once; each permit has its own lease.

    ``acquire``/``release``/``with`` work as on a Lock; every acquisition takes one permit.
    The limit is checked by each acquirer against its own ``permits``: callers that disagree
    admit themselves only while fewer holds than their own ``permits`` exist, and no existing
    holder is ever evicted, so lowering ``permits`` takes effect as holders leave.
    """

    def __init__(
        self,
        client: Client,
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
        super().__init__(client, key, ttl=ttl, timeout=timeout, reentrant=False, kind="semaphore")
        self._permits = permits

    @property
    def permits(self) -> int:
        return self._permits or 0
