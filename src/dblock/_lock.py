"""Lock: the blocking client's lock object. It keeps which thread holds what, runs the
engine's steps (:mod:`dblock._engine`) on the calling thread, and renews in the background.

What "lost" means: the lease of a hold is gone (expired, taken over by another owner,
force-released, or could not be renewed before it ran out because the database was
unreachable). From that moment another owner may act on what the lock protects. dblock tells
you in three ways: ``held`` turns False, ``on_lost`` is called once (from the client's
background thread), and ``release()`` / ``renew()`` raise :class:`LockLost`. Stop the work, and
let the protected resource reject stale writes by their fencing token (``lock.token``).

When a lock object learns of it: a force-release is pushed where the store can (PostgreSQL
NOTIFY, for locks with ``on_lost`` or ``auto_renew``); otherwise at the next renewal (every
ttl/3 with ``auto_renew``, at the lease's end without), or at release, renew or re-entry.

A session hold (``ttl=None`` on a store with ``SessionHolds``) has no lease: it is lost when
its connection to the server ends, which a check every second notices (docs/session-locks.md).

Timeline of the race fencing protects against::

    A acquires (token 7) ... A pauses (GC, SIGSTOP) ...... A resumes, writes with token 7
                     lease expires | B acquires (token 8), writes with token 8
                                     the resource has seen 8, so it rejects A's 7
"""

from __future__ import annotations

import contextlib
import logging
import math
import shlex
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from . import _engine, _forksafe, _observe, _runtime
from ._contract import LossPush, SessionHolds, provides
from ._core import Core
from ._engine import Hold, Spec
from ._engine.lease import refuse_while_guarded
from ._errors import DBLockError, EventLoopError, LockLost, LockTimeout, NotHeld
from ._timing import DeadlinePassed
from ._validate import check_key, check_timeout, check_ttl

log = logging.getLogger("dblock")

#: ``ttl=None`` on a store without session holds: a lease of this length, renewed in the
#: background while the process lives (a crashed holder frees the key after it)
SESSION_FALLBACK_TTL = 15.0


class Lock:
    """A lease lock on one key. Create it with :meth:`Client.lock`.

    >>> with client.lock("invoice:42", ttl=30, timeout=5):
    ...     pay()
    """

    #: a ManyLock (lock_many): its hold covers several keys
    _many = False

    def __init__(
        self,
        core: Core,
        key: str,
        *,
        ttl: float | None = 30.0,
        timeout: float | None = None,
        reentrant: bool = True,
        auto_renew: bool = False,
        on_lost: Callable[[Lock], object] | None = None,
        kind: str = "lock",
        recheck: float | None = None,
    ) -> None:
        self._core = core
        self._key = check_key(key)
        self._session = False
        if ttl is None and kind == "lock":
            # a hold that lasts as long as the client's session: the server's own lock where
            # the store has one, else a lease kept alive while this process lives
            if provides(core.store, SessionHolds):
                self._session, kind, self._ttl = True, "session", math.inf
            else:
                self._ttl, auto_renew = SESSION_FALLBACK_TTL, True
        else:
            self._ttl = check_ttl(ttl)
        spec = Spec(self._key, self._ttl, kind, recheck=recheck)
        self._keep(
            core,
            spec,
            timeout=check_timeout(timeout),
            reentrant=reentrant,
            auto_renew=auto_renew,
            on_lost=on_lost,
        )
        spec.check(core.store)

    def _keep(
        self,
        core: Core,
        spec: Spec,
        *,
        timeout: float | None,
        reentrant: bool,
        auto_renew: bool,
        on_lost: Callable[[Any], object] | None,
    ) -> None:
        """What every lock object keeps: its client, what it asks for, its holds by owner."""
        if on_lost is not None and not callable(on_lost):
            raise TypeError("on_lost must be a callable taking the lock")
        self._core = core
        self._key = spec.key
        self._ttl = spec.ttl
        self._timeout = timeout
        self._reentrant = bool(reentrant)
        self._auto_renew = bool(auto_renew)
        self._on_lost = on_lost
        self._spec = spec
        self._holds: dict[int, list[Hold]] = {}
        self._mutex = _forksafe.lock()

    # -- properties -----------------------------------------------------------------------
    @property
    def key(self) -> str:
        return self._key

    @property
    def ttl(self) -> float:
        """The lease in seconds; ``math.inf`` for a session hold (it has no lease)."""
        return self._ttl

    def _current(self) -> Hold | None:
        with self._mutex:
            refs = self._holds.get(self._core.owner_serial())
            if refs:
                return refs[-1]
            for refs in self._holds.values():
                if refs:
                    return refs[-1]
        return None

    @property
    def held(self) -> bool:
        """True while this lock object holds the key and its lease is not known to be lost."""
        hold = self._current()
        return hold is not None and hold.live()

    @property
    def token(self) -> int | None:
        """The fencing token of the current hold, None when not held."""
        hold = self._current()
        return hold.token if hold is not None and not hold.lost and hold.ours() else None

    @property
    def owner(self) -> str:
        """``<host>:<pid>:<thread>:<random>``: the holder's identity (a fresh one per hold)."""
        hold = self._current()
        if hold is not None:
            return hold.owner
        return self._core.identity() + ":-"

    @property
    def lease_end(self) -> float | None:
        """The ``time.monotonic()`` moment from which the current hold's lease may have ended
        (the request that started or last renewed it was sent no earlier than its ttl before);
        None when nothing is held or the hold is known lost; ``math.inf`` for a session hold
        (no lease: it ends with its connection). Work that must not outlive the lease stops
        before it: ``dblock run`` stops its command ahead of it."""
        hold = self._current()
        if hold is None or hold.lost or not hold.ours():
            return None
        return hold.expires_by

    def locked(self) -> bool:
        """Ask the store: is the key held by anyone now?"""
        return self._core.store.info(self._key) is not None

    # -- acquire --------------------------------------------------------------------------
    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Take the lock; return False if it was not had in time.

        ``blocking=False`` tries once. ``timeout`` (seconds) bounds the wait; None uses the
        lock's own timeout, whose default None waits forever. A re-entrant acquisition asks
        the store whether the hold is still ours (and renews it); if it is not, the hold is
        lost and this acquire is a fresh one. On a thread that runs an asyncio event loop it
        raises a DBLockError that is also a RuntimeError: use ``connect_async``.
        """
        if _observe.HUB.active():
            return _observe.acquire(self, self._acquire, blocking, timeout)
        return self._acquire(blocking, timeout) is not None

    def _acquire(self, blocking: bool, timeout: float | None) -> Hold | None:
        """The hold had (a re-entered one, or a new one), or None if not had in time."""
        self._refuse_on_loop()
        wait = check_timeout(timeout) if timeout is not None else self._timeout
        tid = self._core.owner_serial()
        core = self._core
        if self._reentrant:
            shared = core.reentrant_hold(self._key, tid)
            handle = shared.handle if shared is not None else None
            if shared is not None and isinstance(handle, Lock) and handle._many and shared.live():
                raise ValueError(
                    f"lock {self._key!r} is held by this owner's lock_many over {handle.key}: "
                    "acquiring it again would wait for itself"
                )
            if shared is not None and isinstance(handle, Lock) and handle._reenter(shared):
                self._push(tid, shared)
                return shared
        if self._session:
            steps = _engine.acquire_session(
                self._spec, core.new_owner(), core.store.poll_cap, blocking=blocking, timeout=wait
            )
        else:
            steps = _engine.Acquisition(
                core.traits, self._spec, core.new_owner(), blocking=blocking, timeout=wait
            ).run()
        hold = self._run_acquisition(steps)
        if hold is None:
            return None
        hold.handle = self
        self._push(tid, hold)
        if self._reentrant:
            core.set_reentrant_hold(self._key, tid, hold)
        try:
            self._schedule(hold)
            self._watch(hold)  # I/O on some stores: a cancellation may land in it
        except BaseException:
            # the caller never gets this hold: end it rather than leave it held (and renewed)
            with contextlib.suppress(DBLockError):
                self._release(tid)
            raise
        return hold

    def _run_acquisition(self, steps: _engine.Steps[Hold | None]) -> Hold | None:
        """Run an acquisition's steps: the hold had, or None if not had in time."""
        core = self._core
        try:
            hold = core.run(steps)
        except DeadlinePassed:  # the database file or the pool stayed busy: not had in time
            hold = None
        if hold is not None and core.rt is not _runtime.THREADS:
            hold.mutex = core.rt.mutex()
        return hold

    def _refuse_on_loop(self) -> None:
        if self._core.rt.loop_running():
            raise EventLoopError(
                f"lock {self._key!r}: the blocking dblock API was called on a thread that is "
                "running an asyncio event loop. All coroutines share this thread, so the lock "
                "would let them all in at once, and waiting would freeze the loop. Use the "
                "async API (client = await dblock.connect_async(...); async with "
                "client.lock(key): ...), or run the whole critical section, acquire to release, "
                "in a worker thread, e.g. await asyncio.to_thread(work)",
                key=self._key,
            )

    def _reenter(self, hold: Hold) -> bool:
        """Count one more acquisition of ``hold`` if the store confirms it is still ours; if it
        is gone, report the loss (on the background thread, as documented) and return False,
        so the caller acquires afresh while the lost hold's own release raises LockLost."""
        with hold.mutex:
            confirmed = self._core.run(_engine.reenter(hold))
            if confirmed:
                self._schedule_locked(hold)
                return True
        if confirmed is False:
            self._core.scheduler.at(time.monotonic(), lambda: self._report_lost(hold))
        return False

    def _watch(self, hold: Hold) -> None:
        """Where the store pushes a force-release to the holder, learn of it at once instead
        of at the next renewal, for holds whose loss someone hears of."""
        store = self._core.store
        if (self._on_lost is None and not self._auto_renew) or self._session:
            return
        if not provides(store, LossPush):
            return
        scheduler = self._core.scheduler

        def heard() -> None:  # on the store's thread: hand the check to the renewer's
            scheduler.at(time.monotonic(), lambda: self._pushed_loss(hold))

        unwatch = store.watch(self._key, hold.owner, heard)
        with hold.mutex:
            if hold.count == 0 or hold.lost:
                unwatch()
            else:
                hold.unwatch = unwatch

    def _pushed_loss(self, hold: Hold) -> None:
        """Runs on the background thread after a force-release notice: confirm it in the
        store, then the hold is lost."""
        with hold.mutex:
            lost = self._core.run(_engine.confirm_loss(hold))
        if lost:
            self._report_lost(hold)

    def _push(self, tid: int, hold: Hold) -> None:
        with self._mutex:
            self._holds.setdefault(tid, []).append(hold)

    # -- release and renew ----------------------------------------------------------------
    def release(self) -> None:
        """Release one acquisition; the key is freed after as many releases as acquisitions.

        Raises NotHeld if this owner does not hold the lock, and LockLost if its lease was
        gone (the work ran partly unprotected). Never frees another owner's hold.
        """
        self._release(self._core.owner_serial())

    def _release(self, tid: int) -> None:
        """``release()`` of the hold that owner ``tid`` (a thread, a task) took."""
        with self._mutex:
            refs = self._holds.get(tid)
            hold = refs[-1] if refs else None
        if hold is None or refs is None:
            raise NotHeld(
                f"lock {self._key!r} is not held by this owner (table "
                f"{self._core.store.table}); release() only what acquire() returned True for",
                key=self._key,
            )
        if not hold.ours():
            # a child forked while the lock was held (leaving a `with` block, say): the hold
            # is its parent's, which still works under it; forget it here, touch nothing
            self._pop(tid)
            return
        if hold.count == 1:
            refuse_while_guarded(hold, "release()")  # before the mutex: see there
        with hold.mutex:
            if self._session and hold.count == 1:  # no more checks (the engine stops renewals)
                self._core.checks.discard(hold)
            released = self._core.run(_engine.release(hold, hold.renews(self._auto_renew)))
            if released.final:
                _observe.released(self, hold, released.lost)
                self._unwatch(hold)
                self._forget_reentrant(tid, hold)
            self._pop(tid)
            if released.lost:
                raise self._lost_error(hold)

    def _forget_reentrant(self, tid: int, hold: Hold) -> None:
        """The hold ended: this owner's next acquire of the key is a fresh one."""
        self._core.drop_reentrant_hold(self._key, tid, hold)

    def _release_quietly(self, tid: int) -> None:
        """Release ``tid``'s hold, if any, reporting nothing: its loss is known already."""
        with self._mutex:
            if not self._holds.get(tid):
                return
        with contextlib.suppress(DBLockError):  # lost, or unreachable: the lease ends anyway
            self._release(tid)

    def _pop(self, tid: int) -> None:
        with self._mutex:
            refs = self._holds[tid]
            refs.pop()
            if not refs:
                del self._holds[tid]

    def _lost_error(self, hold: Hold) -> LockLost:
        if self._session:
            return LockLost(
                f"the session hold of lock {self._key!r} (token {hold.token}, table "
                f"{self._core.store.table}) was lost before release: its connection to the "
                "server ended (killed, dropped, or the server restarted), so the work ran "
                "partly unprotected",
                key=self._key,
            )
        return LockLost(
            f"the lease of lock {self._key!r} (token {hold.token}, table "
            f"{self._core.store.table}) was lost before release: it expired or was taken "
            "over, so the work ran partly unprotected; use a longer ttl or auto_renew=True",
            key=self._key,
        )

    def renew(self, ttl: float | None = None) -> None:
        """Extend the lease to ``ttl`` seconds from now (default: the lock's ttl).

        Raises NotHeld if not held, LockLost if the lease is no longer this owner's.
        """
        new_ttl = self._ttl if ttl is None else check_ttl(ttl)
        hold = self._current_of_thread()
        refuse_while_guarded(hold, "renew()")  # before the mutex: see there
        with hold.mutex:
            if not self._core.run(_engine.renew(hold, new_ttl)):
                _observe.found_lost(self, hold)
                self._unwatch(hold)
                raise self._lost_error(hold)
            self._schedule_locked(hold)

    def guard(self, conn: object) -> None:
        """Inside the caller's open transaction on ``conn`` (its own connection to the
        database of the lock table: DB-API or SQLAlchemy), check in one statement that this
        hold is live and keep its row in the lock table from being taken over,
        force-released or purged until that transaction ends (docs/guarantees.md).

        Raises LockLost if the hold is gone (roll the transaction back: its writes would not
        be protected); ConfigurationError for a session hold, a connection to another
        database, or a store that is not SQL; NotHeld if not held. Until the transaction
        ends, ``release()`` and ``renew()`` raise instead of waiting for it, and the
        background renewal waits: end the transaction first.
        """
        from . import _guard  # loads greenlet (for asyncio connections): not at import dblock

        _guard.guard(self, self._current_of_thread(), conn)

    def _found_lost(self, hold: Hold) -> None:
        """The store said the hold is gone, to a call of its owner (which raises LockLost)."""
        _observe.found_lost(self, hold)
        self._unwatch(hold)

    def _current_of_thread(self) -> Hold:
        with self._mutex:
            refs = self._holds.get(self._core.owner_serial())
        if not refs or not refs[-1].ours():
            raise NotHeld(f"lock {self._key!r} is not held by this owner", key=self._key)
        return refs[-1]

    # -- background renewal and loss watch ------------------------------------------------
    def _schedule(self, hold: Hold) -> None:
        with hold.mutex:
            self._schedule_locked(hold)

    def _schedule_locked(self, hold: Hold) -> None:
        when = hold.next_check(self._auto_renew, self._on_lost is not None)
        if when is None:
            return
        if self._session:
            hold.due = when
            self._core.checks.add(hold, self._check_session)
        else:
            hold.job = self._core.scheduler.at(when, lambda: self._tick(hold))

    def _check_session(self, hold: Hold) -> None:
        """Runs on the client's background job: does the session hold's connection still
        hold the server's lock?"""
        with hold.mutex:
            checked = self._core.run(
                _engine.check(hold, self._auto_renew, self._on_lost is not None)
            )
            if checked.again is None:
                self._core.checks.discard(hold)
            else:
                hold.due = checked.again
        if checked.lost_now:
            self._report_lost(hold)

    def _tick(self, hold: Hold) -> None:
        """Runs on the client's background thread: renew, or notice the lease is gone."""
        with hold.mutex:
            job = hold.job
            if job is None or job.cancelled:
                return
            checked = self._core.run(
                _engine.check(hold, self._auto_renew, self._on_lost is not None)
            )
            if checked.again is not None:
                hold.job = self._core.scheduler.at(checked.again, lambda: self._tick(hold))
        if checked.lost_now:
            self._report_lost(hold)

    def _report_lost(self, hold: Hold) -> None:
        """Log the loss and call ``on_lost`` (once per hold: callers set ``hold.lost`` first,
        under its mutex, only if it was not set)."""
        self._unwatch(hold)
        _observe.found_lost(self, hold)
        if self._on_lost is not None:
            try:
                self._on_lost(self)
            except Exception:
                log.exception("on_lost callback of lock %r raised", self._key)

    @staticmethod
    def _unwatch(hold: Hold) -> None:
        unwatch, hold.unwatch = hold.unwatch, None
        if callable(unwatch):
            unwatch()

    # -- context manager ------------------------------------------------------------------
    def __enter__(self) -> Lock:
        if not self.acquire():
            raise self._timed_out()
        return self

    def _timed_out(self) -> LockTimeout:
        """The error of a ``with`` block whose acquire was not had in time."""
        store = self._core.store
        return LockTimeout(
            f"lock {self._key!r} was not acquired within {self._timeout:g} s (table "
            f"{store.table}); it is held by another owner — see "
            f"`{info_command(self._key, store.safe_url, store.table)}`",
            key=self._key,
        )

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        name = type(self).__name__
        return f"<dblock.{name} key={self._key!r} ttl={self._ttl:g} held={self.held}>"


Lock.__module__ = "dblock"


def info_command(key: str, safe_url: str, table: str) -> str:
    """The ``dblock info`` command line that looks where this lock is kept: the URL (each
    store of a quorum, parted as ``quorum_urls`` parts them) and table, shell-quoted.
    Without them it would look in ``DBLOCK_URL`` or the embedded default, another table."""
    parts = safe_url.split()
    urls = parts if len(parts) > 1 and all("://" in p for p in parts) else [safe_url]
    words = ["dblock"]
    for url in urls:
        words += ["--url", url]
    words += ["--table", table, "info", key]
    return shlex.join(words)
