"""The contract between the lock semantics (core) and a storage backend.

A backend is a handful of atomic operations on the lock table. Each is one statement (one
round trip) where the database allows it, measures time on the database server's clock only,
and checks owner and fencing token in the same statement that changes a hold. The core owns
everything else: waiting, backoff, reentrancy, renewal, validation.

Optional capabilities, which the core looks up by name: ``listening`` with
``acquire_or_enqueue`` (take or join the queue in one statement) and ``watch(key, owner,
heard)`` (a force-release of a hold is pushed to its holder's client; PostgreSQL).

Every method raises only :class:`dblock.BackendError` (driver errors wrapped, ``__cause__``
set) or :class:`dblock.ConfigurationError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .._types import LockInfo


@runtime_checkable
class Subscription(Protocol):
    """A registration for wake-ups about one key, live before the first try."""

    #: True if releases will be pushed to this subscription (else wait() only sleeps)
    live: bool
    #: True if a release wakes only the waiter whose turn it is (no need to probe first)
    targeted: bool
    #: True if a release that came before ``wait()`` still wakes it (no need to try again
    #: between subscribing and the first wait)
    latched: bool
    #: the fencing token of a lock its releaser handed to this waiter (backends that hand
    #: over); the waiter holds it from then on, and takes it by setting this back to None
    granted: int | None

    def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` s; return True early if the key was released."""

    def close(self) -> None:
        """Stop listening."""


@runtime_checkable
class Backend(Protocol):
    """Atomic operations on one lock table."""

    #: dialect name: "sqlite", "postgresql" or "mysql"
    dialect: str
    #: True if a waiter should probe (read-only) before each write attempt: where reads are
    #: nearly free and every write contends for one lock (SQLite's single writer)
    probe_first: bool
    #: longest sleep between two tries of a waiter when releases are not pushed, seconds
    max_poll: float
    #: the URL with its password replaced by ``***``, for messages
    safe_url: str
    #: the qualified table name, for messages
    table: str

    def ensure_schema(self, create: bool) -> None:
        """Create the tables if missing (``create``), else check that they exist."""

    def ddl(self) -> list[str]:
        """The statements ``ensure_schema(create=True)`` runs, for a DBA."""

    def acquire(self, key: str, owner: str, ttl: float, kind: str) -> int | None:
        """Insert or take over an expired hold; return its new fencing token, or None if held.

        A row already held by ``owner`` itself is taken again (so a retry after a lost reply is
        idempotent); the token still increases.
        """

    def release(self, key: str, owner: str, token: int) -> bool:
        """End a live hold of (owner, token); False if the lease was already gone."""

    def renew(self, key: str, owner: str, token: int, ttl: float) -> bool:
        """Set a live hold's lease to ``ttl`` s from now; False if it was already gone."""

    def acquire_fair(self, key: str, owner: str, ttl: float, queued: bool) -> int | None:
        """Like acquire, but only if no live waiter of the key is ahead of ``owner`` (any
        waiter, when ``owner`` is not ``queued``); success also removes its queue entry."""

    def probe(self, key: str, owner: str) -> tuple[bool, int]:
        """Read-only: (the key's lock is free, live waiters ahead of ``owner`` in its queue)."""

    def acquire_shared(
        self, key: str, owner: str, ttl: float, kind: str, permits: int | None
    ) -> int | None:
        """A read hold (``permits`` None) or a semaphore permit; its token, or None."""

    def release_shared(self, key: str, owner: str, token: int) -> bool:
        """End a live read hold or permit; False if its lease was already gone."""

    def renew_shared(self, key: str, owner: str, token: int, ttl: float) -> bool:
        """Extend a live read hold or permit; False if it was already gone."""

    def acquire_write(self, key: str, owner: str, ttl: float) -> int | None:
        """The write hold of a read-write lock, when no reader holds it; its token, or None."""

    def enqueue(
        self, key: str, owner: str, kind: str, ttl: float, lease: float | None = None
    ) -> None:
        """Make or refresh ``owner``'s queue entry (a refresh keeps its place).

        ``lease``: the ttl of the lock, where the backend may hand it to this waiter on
        release (then the waiter must be subscribed: it learns of it only by ``granted``).
        """

    def requeue(self, key: str, owner: str, kind: str, ttl: float) -> bool:
        """Refresh ``owner``'s queue entry; False if it is gone (expired and purged, or the
        lock was handed over to ``owner``): never re-made, so a hand-over is not undone."""

    def dequeue(self, key: str, owner: str) -> None:
        """Remove ``owner``'s queue entry."""

    def claim_once(self, key: str, owner: str, ttl: float, note: str | None) -> int | None:
        """Claim a once-record (absent, failed, or processing with an expired lease) as
        ``processing``; its token, or None if it is not claimable now."""

    def once_state(self, key: str) -> tuple[str, str | None, bool] | None:
        """(kind, state, lease live) of the key's row, or None if it has none."""

    def finish_once(self, key: str, owner: str, token: int, state: str) -> bool:
        """Record ``state`` and end the hold in one statement; False if no longer ours."""

    def finish_scheduled(self, key: str, owner: str, token: int, at_least: float) -> bool:
        """End the hold, or keep it until ``at_least`` s after it started; False if lost."""

    def info(self, key: str) -> LockInfo | None:
        """The current unexpired hold of ``key``."""

    def list(self, prefix: str) -> list[LockInfo]:
        """All current holds whose key starts with ``prefix``, sorted by key (code points)."""

    def force_release(self, key: str) -> bool:
        """End any live hold of ``key``; True if one was freed."""

    def purge(self, older_than: float, include_once: bool) -> int:
        """Delete rows not held now, released or expired more than ``older_than`` s ago.

        Fencing tokens stay monotonic: a key whose row is deleted later gets a larger token.
        """

    def subscribe(self, key: str, owner: str, queue: str | None = None) -> Subscription:
        """Register ``owner`` for release wake-ups of ``key`` (a plain sleeper if not pushed).
        ``queue``: the kind of queue entry the waiter keeps (``"lock"`` for a plain lock)."""

    def close(self) -> None:
        """Close every connection and background thread."""
