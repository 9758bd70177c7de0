"""ManyLock: ``client.lock_many(keys)``, every key or none, each with its own fencing token.

It is a :class:`~dblock.Lock` whose one hold covers several keys: the engine's
:mod:`~dblock._engine.many` takes them in one atomic step of the store, and the lock's
renewal, loss detection and release run on that hold as on any other (``renew_many``,
``release_many``). What differs is here: the keys, their tokens, no re-entrancy, and
``ttl=None``, which is a lease renewed in the background while the process lives on every
store: the servers' own session locks (advisory locks, ``GET_LOCK``) are taken one key at a
time, so a set of them could not be taken all or none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import cast

from ._contract import ManyKeys, lacking, provides
from ._core import Core
from ._engine import Hold
from ._engine.many import ManyAcquisition, ManySpec
from ._errors import LockLost, LockTimeout
from ._lock import SESSION_FALLBACK_TTL, Lock, info_command
from ._validate import check_keys, check_timeout, check_ttl


class ManyLock(Lock):
    """Several keys held together. Create it with :meth:`Client.lock_many`.

    >>> with client.lock_many(["sku-1", "sku-7", "sku-9"], ttl=30, timeout=5) as m:
    ...     confirm(order, m.tokens)
    """

    _many = True

    def __init__(
        self,
        core: Core,
        keys: Iterable[str],
        *,
        ttl: float | None = 30.0,
        timeout: float | None = None,
        auto_renew: bool = False,
        on_lost: Callable[[ManyLock], object] | None = None,
    ) -> None:
        store = core.store
        if not provides(store, ManyKeys):
            raise lacking(store, ManyKeys, "lock_many()")
        self._keys = check_keys(keys, store.max_keys, store.name)
        if ttl is None:  # held while the process lives (see the module)
            ttl, auto_renew = SESSION_FALLBACK_TTL, True
        spec = ManySpec.of(tuple(sorted(self._keys)), check_ttl(ttl))
        self._session = False
        self._many_spec = spec
        self._keep(
            core,
            spec,
            timeout=check_timeout(timeout),
            reentrant=False,
            auto_renew=auto_renew,
            on_lost=on_lost,
        )

    # -- properties -------------------------------------------------------------------------
    @property
    def keys(self) -> tuple[str, ...]:
        """The keys, as given."""
        return self._keys

    @property
    def tokens(self) -> dict[str, int] | None:
        """Each key's fencing token of the current hold; None when not held."""
        hold = self._current()
        if hold is None or hold.lost or not hold.ours():
            return None
        return dict(cast("ManySpec", hold.spec).tokens)

    def locked(self) -> bool:
        """Ask the store: is any of the keys held by anyone now?"""
        return any(self._core.store.info(k) is not None for k in self._keys)

    # -- acquire ----------------------------------------------------------------------------
    def _acquire(self, blocking: bool, timeout: float | None) -> Hold | None:
        self._refuse_on_loop()
        wait = check_timeout(timeout) if timeout is not None else self._timeout
        core = self._core
        tid = core.owner_serial()
        self._refuse_own_keys(tid)
        steps = ManyAcquisition(
            core.store,
            core.traits,
            self._many_spec,
            core.new_owner(),
            blocking=blocking,
            timeout=wait,
        ).run()
        hold = self._run_acquisition(steps)
        if hold is None:
            return None
        hold.handle = self
        self._push(tid, hold)
        # so that this owner's lock(key) refuses instead of waiting
        core.set_reentrant_holds(self._keys, tid, hold)
        self._schedule(hold)
        return hold

    def _refuse_own_keys(self, tid: int) -> None:
        """Not re-entrant: a key this owner (thread, task) holds would be waited for forever."""
        with self._mutex:
            if self._holds.get(tid):
                raise ValueError(
                    f"lock_many({list(self._keys)!r}) is already held by this owner; "
                    "lock_many is not re-entrant"
                )
        for key, hold in self._core.reentrant_holds(self._keys, tid):
            if hold.live():
                raise ValueError(
                    f"lock_many({list(self._keys)!r}): this owner already holds {key!r}; "
                    "lock_many is not re-entrant and would wait for itself"
                )

    def release(self) -> None:
        """Release every key (NotHeld if not held; LockLost if any key's hold was lost, the
        others are released all the same)."""
        self._current_of_thread()  # NotHeld also for a hold this process did not take
        super().release()

    def _forget_reentrant(self, tid: int, hold: Hold) -> None:
        self._core.drop_reentrant_holds(self._keys, tid, hold)

    def _watch(self, hold: Hold) -> None:
        """Force-releases are noticed at the next renewal (pushed notices are per key)."""

    def _lost_error(self, hold: Hold) -> LockLost:
        return LockLost(
            f"lock_many({list(self._keys)!r}) (table {self._core.store.table}) lost the hold "
            "of at least one key before release: a lease expired or was taken over, so the "
            "work ran partly unprotected; the keys still held were released. Use a longer ttl "
            "or auto_renew=True",
            key=self._keys[0],
        )

    def _timed_out(self) -> LockTimeout:
        store = self._core.store
        held = ", ".join(
            f"`{info_command(k, store.safe_url, store.table)}`" for k in self._keys[:3]
        )
        more = " ..." if len(self._keys) > 3 else ""
        return LockTimeout(
            f"lock_many({list(self._keys)!r}) was not acquired within {self._timeout:g} s "
            f"(table {store.table}); at least one key is held by another owner — see "
            f"{held}{more}",
            key=self._keys[0],
        )

    def __enter__(self) -> ManyLock:
        super().__enter__()
        return self

    def __repr__(self) -> str:
        return f"<dblock.ManyLock keys={self._keys!r} ttl={self._ttl:g} held={self.held}>"
