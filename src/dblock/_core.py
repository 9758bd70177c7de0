"""What the primitives of one client share: its store, background jobs, owner identity and
re-entrant holds. Locks, patterns and the CLI reach the client only through this."""

from __future__ import annotations

import random
import socket
from collections.abc import Callable, Iterable
from typing import TypeVar

from . import _forksafe
from ._contract import Store
from ._drive import run
from ._engine import Hold, Steps, Traits
from ._runtime import THREADS, Runtime
from ._session_checks import SessionChecks

T = TypeVar("T")
_HOST = socket.gethostname()[:64] or "localhost"


class Core:
    """The shared state of one client (blocking, or async: ``runtime``)."""

    def __init__(self, store: Store, runtime: Runtime = THREADS) -> None:
        self.store = store
        #: how the client's code waits: on threads, or on an event loop
        self.rt = runtime
        #: what the store declares, read once
        self.traits = Traits.of(store)
        self.scheduler = runtime.jobs(f"dblock-renewer[{store.table}]")
        #: the checks of session holds' connections, run by the scheduler
        self.checks = SessionChecks(self.scheduler)
        self._reentrant: dict[tuple[str, int], Hold] = {}
        self._registry_lock = _forksafe.lock()
        #: the re-entrancy owner: the thread, or the asyncio task (the runtime's own call,
        #: bound once: it runs twice on every acquire and release)
        self.owner_serial: Callable[[], int] = runtime.owner_serial

    def run(self, steps: Steps[T]) -> T:
        """Run engine steps against the store (on the async runtime, inside its greenlet)."""
        return run(steps, self.store)

    # -- owner identity -------------------------------------------------------------------
    def identity(self) -> str:
        # <thread> names the thread (or task) for people; ownership is by the random part (in
        # the store) and by the runtime's owner serial (re-entrancy), neither ever reused
        return f"{_HOST}:{_forksafe.pid()}:{self.rt.owner_label()}"

    def new_owner(self) -> str:
        # 64 random bits tell holds apart; they are no secret (list() shows owners), so the
        # random module's generator serves (reseeded in a forked child) without the system
        # call per acquire that secrets makes
        return f"{self.identity()}:{random.getrandbits(64):016x}"

    # -- re-entrant holds, by key and thread ----------------------------------------------
    def reentrant_hold(self, key: str, tid: int) -> Hold | None:
        with self._registry_lock:
            return self._reentrant.get((key, tid))

    def set_reentrant_hold(self, key: str, tid: int, hold: Hold) -> None:
        with self._registry_lock:
            self._reentrant[(key, tid)] = hold

    def drop_reentrant_hold(self, key: str, tid: int, hold: Hold) -> None:
        with self._registry_lock:
            if self._reentrant.get((key, tid)) is hold:
                del self._reentrant[(key, tid)]

    # the same for every key of a lock_many hold, under one take of the registry's lock
    def reentrant_holds(self, keys: Iterable[str], tid: int) -> list[tuple[str, Hold]]:
        """(key, hold) of each of ``keys`` that owner ``tid`` has a hold of registered."""
        with self._registry_lock:
            found = [(key, self._reentrant.get((key, tid))) for key in keys]
        return [(key, hold) for key, hold in found if hold is not None]

    def set_reentrant_holds(self, keys: Iterable[str], tid: int, hold: Hold) -> None:
        with self._registry_lock:
            for key in keys:
                self._reentrant[(key, tid)] = hold

    def drop_reentrant_holds(self, keys: Iterable[str], tid: int, hold: Hold) -> None:
        with self._registry_lock:
            for key in keys:
                if self._reentrant.get((key, tid)) is hold:
                    del self._reentrant[(key, tid)]

    def close(self) -> None:
        self.scheduler.stop()
        self.store.close()
