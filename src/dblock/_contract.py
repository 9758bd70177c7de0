"""The store contract: what the lock engine asks of a store.

A store is a handful of atomic operations on its lock table. Each is one round trip where
the store allows it, measures time on the store's own clock only, and checks owner and
fencing token in the same step that changes a hold. The engine (:mod:`dblock._engine`) owns
everything else: waiting, backoff, re-entrancy, renewal, loss detection, validation.

:class:`Store` is the required part, which any store can do. Everything else is an optional
capability, a separate interface that a store *declares* by inheriting it (on its class
line: a mixin that implements one does not declare it); the engine checks
``provides(store, Capability)`` and falls back, or raises a ConfigurationError naming the
store and what it lacks (see :func:`require`). A store instance may withhold a capability its
class declares (``withheld``) when its server turns out to lack what it needs (the MySQL
store's session holds on MySQL 8, which has no sequences).

Every operation raises only :class:`dblock.BackendError` (driver errors wrapped, ``__cause__``
set) or :class:`dblock.ConfigurationError`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple, TypeVar, cast

from ._errors import ConfigurationError
from ._runtime import THREADS, Runtime

if TYPE_CHECKING:
    from typing_extensions import TypeIs

    from ._types import LockInfo

C = TypeVar("C")


class Store(ABC):
    """Required: the atomic operations on one lock table (8, plus ``close``)."""

    #: the store's name, for messages: "sqlite", "postgresql", "mysql", ...
    name: str
    #: the URL with its secrets replaced by ``***``, for messages
    safe_url: str
    #: the lock table's (qualified) name, for messages
    table: str
    #: longest pause between two tries of a waiter that is not woken by the store, seconds
    poll_cap: float = 0.25
    #: how the store's code waits (sleeps, events, background workers): blocking threads, or
    #: the async client's event loop (given by ``use_runtime`` before the store's first use)
    rt: Runtime = THREADS
    #: how the store does I/O for the async client: ``"driver"``, its driver's asyncio
    #: connections awaited on the loop (dblock._green); ``"threads"``, its blocking calls
    #: each on a worker thread
    asyncio_io: str = "threads"
    #: appended to a "does not provide" message: what a restricted store (the quorum) offers
    offers: str = ""
    #: capabilities this instance does not provide although its class declares them
    withheld: frozenset[type] = frozenset()

    def use_runtime(self, runtime: Runtime) -> None:
        """Serve the async client's ``runtime``: called once, before the store's first use
        (a store with more to set up, or a driver to check, extends it)."""
        self.rt = runtime

    @property
    def on_loop(self) -> bool:
        """Its connections are the driver's asyncio ones (the async client, ``"driver"``)."""
        return self.rt is not THREADS and self.asyncio_io == "driver"

    @property
    def offloads(self) -> bool:
        """Its blocking calls go to worker threads (the async client, ``"threads"``)."""
        return self.rt is not THREADS and self.asyncio_io == "threads"

    @abstractmethod
    def ensure_schema(self, create: bool) -> None:
        """Create the table if missing (``create``), else check that it exists."""

    @abstractmethod
    def acquire(self, key: str, owner: str, ttl: float, kind: str) -> int | None:
        """Take ``key`` if it is free or its lease expired; its new fencing token, or None.

        A hold of ``owner`` itself is taken again (a retry after a lost reply is idempotent);
        the token still increases. Tokens of a key never go backwards.
        """

    @abstractmethod
    def renew(self, key: str, owner: str, token: int, ttl: float) -> bool:
        """Set a live hold's lease to ``ttl`` s from now; False if it was already gone."""

    @abstractmethod
    def release(self, key: str, owner: str, token: int) -> bool:
        """End a live hold of (owner, token); False if its lease was already gone."""

    @abstractmethod
    def info(self, key: str) -> LockInfo | None:
        """The current unexpired hold of ``key`` (one of them, for shared holds)."""

    @abstractmethod
    def list_holds(self, prefix: str) -> list[LockInfo]:
        """All current holds whose key starts with ``prefix``, sorted by key (code points)."""

    @abstractmethod
    def force_release(self, key: str) -> bool:
        """End every live hold of ``key``; True if one was freed."""

    @abstractmethod
    def purge(self, older_than: float, include_once: bool) -> int:
        """Delete records not held now, released or expired more than ``older_than`` s ago;
        once-records only with ``include_once``. A key purged and taken again later still
        gets a larger token than before."""

    @abstractmethod
    def close(self) -> None:
        """Close every connection and background thread. Idempotent."""


# -- optional capabilities ------------------------------------------------------------------


class FairQueue(ABC):
    """Waiters keep an entry in the key's queue and are served in arrival order."""

    #: a waiter should read (``probe``) before each try: reads are nearly free and every try
    #: contends for one write lock (a single-writer file)
    probe_before_try: bool = False

    @abstractmethod
    def acquire_fair(self, key: str, owner: str, ttl: float, queued: bool) -> int | None:
        """Like ``acquire``, but only if no live waiter is ahead of ``owner`` (any live
        waiter, when ``owner`` is not ``queued``); success also removes its queue entry."""

    @abstractmethod
    def probe(self, key: str, owner: str) -> tuple[bool, int]:
        """Read-only: (the key's lock is free, live waiters ahead of ``owner``)."""

    @abstractmethod
    def enqueue(
        self, key: str, owner: str, kind: str, ttl: float, lease: float | None = None
    ) -> None:
        """Make or refresh ``owner``'s queue entry (a refresh keeps its place).

        ``lease``: the lock's ttl, where the store may hand the lock to this waiter on
        release (the waiter must then be subscribed: it learns of it by ``granted``).
        """

    @abstractmethod
    def requeue(self, key: str, owner: str, kind: str, ttl: float) -> bool:
        """Refresh ``owner``'s entry; False if it is gone (expired, or the lock was handed
        to ``owner``): never re-made, so a hand-over is not undone."""

    @abstractmethod
    def dequeue(self, key: str, owner: str) -> None:
        """Remove ``owner``'s entry (handing on a lock handed to it meanwhile)."""


class SharedHolds(ABC):
    """Several holds of one key at once: read holds, semaphore permits, a write hold."""

    @abstractmethod
    def acquire_shared(
        self, key: str, owner: str, ttl: float, kind: str, permits: int | None
    ) -> int | None:
        """A read hold (``permits`` None) or a semaphore permit; its token, or None."""

    @abstractmethod
    def release_shared(self, key: str, owner: str, token: int) -> bool:
        """End a live read hold or permit; False if its lease was already gone."""

    @abstractmethod
    def renew_shared(self, key: str, owner: str, token: int, ttl: float) -> bool:
        """Extend a live read hold or permit; False if it was already gone."""

    @abstractmethod
    def acquire_write(self, key: str, owner: str, ttl: float) -> int | None:
        """The write hold of a read-write lock, when no reader holds it; its token, or None."""


class ScheduledRuns(ABC):
    """Holds of ``scheduled`` jobs that may outlive the run (its ``at_least``)."""

    @abstractmethod
    def finish_scheduled(self, key: str, owner: str, token: int, at_least: float) -> bool:
        """End the hold, or keep it until ``at_least`` s after it started; False if lost."""


class OnceRecords(ScheduledRuns):
    """Records that outlive their hold: ``once`` (P/F/S) and ``scheduled``'s ``at_least``."""

    @abstractmethod
    def claim_once(self, key: str, owner: str, ttl: float, note: str | None) -> int | None:
        """Claim a once-record (absent, failed, or processing with an expired lease) as
        processing; its token, or None if it is not claimable now."""

    @abstractmethod
    def once_state(self, key: str) -> tuple[str, str | None, bool] | None:
        """(kind, state, lease live) of the key's record, or None if it has none."""

    @abstractmethod
    def finish_once(self, key: str, owner: str, token: int, state: str) -> bool:
        """Record ``state`` and end the hold in one step; False if no longer ours."""


class Subscription(ABC):
    """A registration for wake-ups about one key, live before the waiter's next try."""

    #: releases are pushed to it (else ``wait`` only sleeps)
    live: bool = False
    #: a release wakes only the waiter whose turn it is (no need to probe first)
    targeted: bool = False
    #: a release that came before ``wait()`` still wakes it
    latched: bool = False
    #: it wakes at every change to the store, not only at this key's releases (SQLite's
    #: file watch): waiters far back in the queue pace themselves instead of listening
    broadcast: bool = False
    #: the token of a lock its releaser handed to this waiter; the waiter takes it by
    #: setting this back to None
    granted: int | None = None
    #: that lock's lease (s) counted from the waiter's last write of its queue entry, where
    #: the store knows it; else the engine assumes the lock's ttl capped by the entry's lease
    granted_lease: float | None = None

    @abstractmethod
    def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` s; True early if the key was released."""

    @abstractmethod
    def close(self) -> None:
        """Stop listening."""


class Wakeups(ABC):
    """The store tells waiters of releases (instead of their polling)."""

    #: a release wakes waiters that keep no queue entry too (else only queued ones are told)
    wakes_unqueued: bool = True

    @abstractmethod
    def subscribe(self, key: str, owner: str, queue: str | None = None) -> Subscription:
        """Register ``owner`` for release wake-ups of ``key``; ``queue``: the kind of queue
        entry the waiter keeps. May return a subscription that is not ``live``."""


class QueueJoin(ABC):
    """Take the lock or join its queue in one step, while wake-ups already flow."""

    @abstractmethod
    def joining(self) -> bool:
        """True if ``acquire_or_enqueue`` can be used now (wake-ups are flowing)."""

    @abstractmethod
    def acquire_or_enqueue(self, key: str, owner: str, ttl: float, queue_ttl: float) -> int | None:
        """Take the lock like a newcomer (its token), or else join its queue (None)."""


class QueueView(ABC):
    """The store can list who waits (its wait queue's live entries), for the dashboard."""

    @abstractmethod
    def waiters(self, prefix: str) -> list[LockInfo]:
        """The live queue entries of the keys ``prefix`` starts (all, for ""), by key and
        place in the queue: ``owner`` is the waiter, ``acquired_at`` when it took its place,
        ``expires_at`` when the entry ends unless refreshed, ``kind`` what it waits to take
        (``token`` 0: it has none yet)."""


class LossPush(ABC):
    """The store tells a holder's client at once when its hold is force-released."""

    @abstractmethod
    def watch(self, key: str, owner: str, heard: Callable[[], None]) -> Callable[[], None]:
        """Call ``heard`` (quickly, from a store thread) when a force-release of ``owner``'s
        hold of ``key`` takes effect; returns the call that stops watching."""


class SessionHolds(ABC):
    """Holds that last as long as a connection set aside for them (``ttl=None``): the
    server's own lock and wait queue (PostgreSQL advisory locks), no lease, no row written.

    Each hold, and each waiter, has a connection of its own outside the pool. A session hold
    and a lease hold of one key exclude each other; its token comes from the same counter as
    the key's lease tokens, so tokens of a key increase whatever the mix of kinds.
    """

    @abstractmethod
    def acquire_session(self, key: str, owner: str, timeout: float) -> int | None:
        """Take the server's lock of ``key``, waiting in the server's queue up to ``timeout``
        s (0: try once); its token, or None if not had in time or a live lease holds the key
        (the caller waits and tries again). An interruption leaves nothing held."""

    @abstractmethod
    def check_session(self, key: str, owner: str, token: int) -> bool:
        """True if the hold's connection is alive (so the server still holds its lock);
        False, never an error, if it died (the hold is lost)."""

    @abstractmethod
    def release_session(self, key: str, owner: str, token: int) -> bool:
        """End the hold; False if its connection had died (the hold was already lost)."""


class FencedGrants(ABC):
    """Grants whose fencing token the caller chooses: what a quorum over several stores needs
    (docs/stores/quorum.md). Each operation is one atomic step on the store; the key's fence (the
    largest token it ever had here) survives whatever the store's data survives."""

    @abstractmethod
    def fence(self, key: str) -> int:
        """The key's fence here, floored by the store's clock: no token it was ever granted
        is larger, and neither is the store's clock (microseconds since the epoch) read in
        the same step, so a quorum's next token rises even where the fences were lost."""

    @abstractmethod
    def grant_fenced(self, key: str, owner: str, ttl: float, token: int, kind: str) -> bool:
        """Grant ``key`` to ``owner`` with the token ``token`` and a lease of ``ttl`` s on the
        store's clock, only if it is free or expired (or ``owner``'s own) **and** its fence
        is below ``token``; the fence becomes ``token``. True if granted (also when it is
        already ``owner``'s with ``token``: a retry after a lost reply)."""

    @abstractmethod
    def release_owned(self, key: str, owner: str) -> bool:
        """End ``owner``'s live hold of ``key`` whatever its token (a grant whose reply came
        too late); True if one was ended. The fence stays."""

    def identity(self) -> str | None:
        """What this store is, whatever URL reached it (a server's own id and the database,
        a file's inode): two members of a quorum with the same identity are one store. One
        cheap query, read once when a quorum opens it; None where the store cannot tell."""
        return None


class FencedManyGrants(ABC):
    """Fenced grants of several keys at once: what a quorum's ManyKeys needs of its stores
    (docs/stores/quorum.md). Each key is fenced, granted and ended as ``FencedGrants`` does
    it, at most ``ManyKeys.max_keys`` keys at once (a store that declares it declares
    FencedGrants and ManyKeys too). A grant or release of several keys is one atomic step on
    the store; a fence read need not be (fences only rise, and each key's token is its own)."""

    @abstractmethod
    def fence_many(self, keys: Sequence[str]) -> dict[str, int]:
        """Each key's fence here, floored by the store's clock, as ``fence`` reads it."""

    @abstractmethod
    def grant_fenced_many(self, tokens: Mapping[str, int], owner: str, ttl: float) -> bool:
        """Grant every key of ``tokens`` (key: its token) to ``owner`` as a ``lock`` hold with
        its token and a lease of ``ttl`` s on the store's clock, in one atomic step, if each
        is grantable as ``grant_fenced`` grants one key; else grant none. True if granted
        (also when each key is already ``owner``'s with its token: a retry)."""

    @abstractmethod
    def release_owned_many(self, keys: Sequence[str], owner: str) -> bool:
        """End ``owner``'s live holds of ``keys`` whatever their tokens, in one step; True if
        one was ended. The fences stay."""


class ManyKeys(ABC):
    """Several keys held together, each operation one atomic step over all of them: what
    ``lock_many`` builds on. A hold taken here is a ``lock`` hold of each key (it excludes,
    and is excluded by, every other hold of the key); each key's token follows the rules of
    ``acquire`` (above every token the key ever had)."""

    #: the most keys one step takes (what one script, transaction or multi may hold)
    max_keys: int = 64

    @abstractmethod
    def acquire_many(self, keys: Sequence[str], owner: str, ttl: float) -> dict[str, int] | None:
        """Take every key of ``keys`` (distinct, sorted, at most ``max_keys``) for ``owner``
        with a lease of ``ttl`` s on the store's clock, in one atomic step, if each is free
        or expired (or already ``owner``'s: a retry after a lost reply) and, where the store
        keeps a wait queue, has no live waiter; each key's new token, or None with nothing
        taken. No other client ever sees some of the keys taken and not the others."""

    @abstractmethod
    def renew_many(self, tokens: Mapping[str, int], owner: str, ttl: float) -> bool:
        """Extend each live hold (key: token) of ``owner`` to ``ttl`` s from now, in one
        step; False if any of them was gone (those still live are renewed all the same)."""

    @abstractmethod
    def release_many(self, tokens: Mapping[str, int], owner: str) -> bool:
        """End each live hold (key: token) of ``owner``, in one step; False if any of them
        was already gone (the others are ended all the same)."""

    def subscribe_many(self, keys: Sequence[str], owner: str) -> Subscription | None:
        """Register ``owner`` for wake-ups at a release of any of ``keys`` (a key freed for
        it, where it waits in the keys' queues), live before the waiter's next try; never
        ``granted`` a hold. None where the store cannot push them: the waiter polls."""
        return None


class FairManyKeys(ManyKeys):
    """A waiter for several keys keeps an entry in every key's lock queue, so a stream of
    newcomers and single-key waiters arriving after it cannot keep it waiting forever.

    Its entries hold one place in one order common to all keys: another waiter whose entry
    is ahead of it on one key is ahead of it on every key they share. So of any two waiters
    for overlapping sets one goes first on all of them, and waiting never deadlocks. Its
    entries take no hand-over: a release with one at the head of the queue frees the key
    and wakes that waiter (``subscribe_many``), which takes all its keys or none."""

    @abstractmethod
    def enqueue_many(self, keys: Sequence[str], owner: str, ttl: float) -> None:
        """Make ``owner``'s entry (kind ``lock``, no hand-over) in the lock queue of every
        key of ``keys`` (distinct, sorted) with a lease of ``ttl`` s, in one atomic step
        and at one place of the common order (a fresh arrival: entries it had are
        replaced)."""

    @abstractmethod
    def requeue_many(self, keys: Sequence[str], owner: str, ttl: float) -> bool:
        """Extend ``owner``'s entries to ``ttl`` s from now, keeping their place, if every one
        is still live; False if any is gone (the caller enqueues afresh)."""

    @abstractmethod
    def dequeue_many(self, keys: Sequence[str], owner: str) -> None:
        """Remove ``owner``'s entries from the queues of ``keys``, in one step."""

    @abstractmethod
    def acquire_many_in_turn(
        self, keys: Sequence[str], owner: str, ttl: float
    ) -> dict[str, int] | None:
        """``acquire_many`` for a waiter with entries: a key's queue blocks it only with a
        live entry ahead of ``owner``'s. Success removes ``owner``'s entries, in the same
        step."""


class CommitGuards(ABC):
    """A SQL store whose lock rows the caller's own transaction can hold still
    (``lock.guard(conn)``, docs/guarantees.md). The guard's statement runs on the caller's
    connection, not the store's: the store only writes it.

    The statement checks that ``owner``'s holds of ``n`` keys are live (owner, token, lease
    on the server's clock) and keeps their rows from changing until the caller's
    transaction ends: a shared row lock (PostgreSQL ``FOR SHARE``, MySQL/MariaDB ``LOCK IN
    SHARE MODE``), or, on SQLite, a write that makes the transaction the file's one writer.
    Its parameters are named ``owner``, ``k0``..``k{n-1}`` (the keys) and ``t0``..``t{n-1}``
    (their tokens), in the driver's style (``%(owner)s``; SQLite ``:owner``), with no ``::``
    casts (SQLAlchemy's ``text()`` would read ``:name`` as a parameter)."""

    #: how a connection's driver marks parameters in ``guard_sql``: "pyformat" or "named"
    guard_paramstyle: str = "pyformat"
    #: how the guard's statement tells a live hold: a row returned ("rows") or a row
    #: changed ("rowcount") per key
    guard_counts: str = "rows"

    @abstractmethod
    def guard_sql(self, n: int) -> str:
        """The guard's statement over ``n`` keys of one owner (see the class)."""

    @abstractmethod
    def guard_identity_sql(self) -> str:
        """A statement whose one row tells which database a connection is on, as
        ``guard_identity`` reads it (only run after a guard found no live hold, to tell a
        lost hold from a connection to another database)."""

    @abstractmethod
    def guard_identity(self, row: Sequence[object]) -> str | None:
        """What ``guard_identity_sql``'s ``row`` names, in the form of ``identity()``."""

    @abstractmethod
    def identity(self) -> str | None:
        """The store's own database, as ``guard_identity`` names one (None: cannot tell)."""

    @abstractmethod
    def renew_after_guard(self, tokens: Mapping[str, int], owner: str, ttl: float) -> bool:
        """Extend each of ``owner``'s holds (key: token) to ``ttl`` s from now if its row
        still names ``owner`` and the token, **even if its lease has run out**: a renewal
        that waited while a guarded transaction held the row (nobody could take the key
        then, and a key taken since has another owner or token). One statement; True if
        every hold was extended."""


class Leading(NamedTuple):
    """A key's live exclusive lease hold with the value its holder proclaimed in it."""

    info: LockInfo
    #: the holder has proclaimed a value (perhaps None) in this hold
    proclaimed: bool
    value: str | None


class LeaderValues(ABC):
    """A lease hold of a key carries a value that its holder sets and anyone reads together
    with the hold in one step: an election's leader and what it proclaims
    (``client.election``, docs/election.md).

    A value belongs to one hold (its token): a new hold of the key starts without one, so
    nobody ever reads an earlier term's value beside a later holder."""

    @abstractmethod
    def proclaim(self, key: str, owner: str, token: int, value: str | None) -> bool:
        """Set the value of ``owner``'s live hold ``token`` of ``key`` in one step; False,
        writing nothing, if that hold is not live (on the store's clock). Repeating it with
        the same value changes nothing more (a retried call is harmless)."""

    @abstractmethod
    def leader(self, key: str) -> Leading | None:
        """The live exclusive lease hold (kind "lock") of ``key`` and its value, or None if
        there is none; one round trip where the store allows it."""


class LeaderPush(ABC):
    """The store tells an observer when a key's leader may have changed (``observe()``
    then reads it at once, and otherwise only as a safety net)."""

    #: every grant and release is told; False where telling them would cost every lock's
    #: statements a message (PostgreSQL's NOTIFY): then what an election does is told (a
    #: proclaim, which follows each of its grants, and the release of a hold that proclaimed
    #: in this client), besides force-releases and the rings a release sends anyway
    tells_every_hold: bool = True

    @abstractmethod
    def watch_leader(self, key: str, heard: Callable[[], None]) -> Callable[[], None]:
        """Call ``heard`` (quickly, from a store thread; spurious calls are harmless) when the
        hold of ``key`` or its value may have changed: a grant, a release, a force-release, a
        proclaim. Returns the call that stops watching."""


class SchemaScript(ABC):
    """The store's schema is DDL an operator can run by hand."""

    @abstractmethod
    def ddl(self) -> list[str]:
        """The statements ``ensure_schema(create=True)`` runs."""

    def script(self) -> str:
        """The DDL as a script for the store's command-line client."""
        return "\n".join(f"{s.strip().rstrip(';').rstrip()};\n" for s in self.ddl())


CAPABILITIES: tuple[type, ...] = (
    FairQueue,
    SharedHolds,
    ScheduledRuns,
    OnceRecords,
    Wakeups,
    QueueJoin,
    LossPush,
    SessionHolds,
    FencedGrants,
    FencedManyGrants,
    SchemaScript,
    QueueView,
    ManyKeys,
    FairManyKeys,
    CommitGuards,
    LeaderValues,
    LeaderPush,
)


def lacking(store: Store, capability: type, feature: str) -> ConfigurationError:
    """The error for using ``feature`` on a store that does not declare ``capability``."""
    return ConfigurationError(
        f"{feature} needs a store with {capability.__name__}, which the {store.name} store "
        f"({store.safe_url}) does not provide{store.offers}"
    )


def provides(store: object, capability: type[C]) -> TypeIs[C]:
    """``store`` (a :class:`Store`) declares ``capability`` and does not withhold it: the one
    way to ask. It narrows ``store`` to the capability, as ``isinstance`` would."""
    return isinstance(store, capability) and capability not in cast("Store", store).withheld


def require(store: Store, capability: type, feature: str) -> None:
    """Raise a ConfigurationError naming the store and ``capability`` if it lacks it."""
    if not provides(store, capability):
        raise lacking(store, capability, feature)


def capabilities(store: Store) -> frozenset[str]:
    """The names of the capabilities ``store`` provides."""
    return frozenset(c.__name__ for c in CAPABILITIES if provides(store, c))
