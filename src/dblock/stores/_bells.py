"""What the SQL stores' doorbells keep track of (stores/mysql/doorbell.py,
stores/postgresql/doorbell.py): which of a client's waiters wait at a key's doorbell, which of
its holds keep one, and the idle connections kept for its next waiters. How a bell is rung,
waited for and let go of is each store's own."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from .. import _forksafe
from .._runtime import Event


class Bell(Protocol):
    """A waiter's doorbell, as the bookkeeping sees it."""

    key: str
    owner: str
    #: the waiter has the bell: it is next in line
    has_bell: bool


B = TypeVar("B", bound=Bell)


class BellBook(ABC, Generic[B]):
    """One client's doorbells of one store: who waits at one, which holds keep theirs, and
    idle connections for the next waiters. ``limit``: bells (waiting or held) at once;
    ``idle_kept``: idle connections kept; ``idle_for``: the server's limit on an idle
    connection (s), of which one idle for half is closed rather than used. A forked child
    forgets its parent's connections without touching them."""

    def __init__(self, *, limit: int, idle_kept: int, idle_for: float) -> None:
        self._limit = limit
        self._idle_kept = idle_kept
        self._idle_for = idle_for
        self._mutex = _forksafe.lock()
        self._idle: list[tuple[Any, float]] = []  # (connection, when it was put back)
        self._waiting: dict[tuple[str, str], B] = {}
        self._held: dict[tuple[str, str], Any] = {}  # (key, owner) of a hold -> its bell's conn
        self._count = 0
        self._pid = _forksafe.pid()
        self._closed = False

    # -- the store's own ----------------------------------------------------------------------
    @abstractmethod
    def _make(self, key: str, owner: str, sleep: Event) -> B:
        """A new doorbell for ``owner`` waiting on ``key``."""

    @abstractmethod
    def _open(self) -> Any:
        """A new connection for a doorbell."""

    @abstractmethod
    def _close(self, conn: Any) -> None:
        """Close ``conn``, which frees the bells it has."""

    @abstractmethod
    def let_go(self, conn: Any, bell: B | None) -> None:
        """Let go of ``bell`` on ``conn`` (None: it is not had) and check the connection in,
        or close it (which frees the bell too)."""

    def _dead(self, conn: Any) -> bool:
        """Whether ``conn`` is known to be closed (an idle one is then not used)."""
        return False

    def _forget(self) -> None:
        """In a forked child (under the mutex): forget what else was the parent's."""

    # -- bookkeeping --------------------------------------------------------------------------
    def _forked(self) -> None:
        """In a forked child: forget the parent's connections without touching them."""
        if self._pid != _forksafe.pid():
            self._idle.clear()
            self._waiting.clear()
            self._held.clear()
            self._forget()
            self._count = 0
            self._pid = _forksafe.pid()

    def doorbell(self, key: str, owner: str, sleep: Event) -> B | None:
        """A doorbell for ``owner`` waiting on ``key``, or None if this client has too many.
        ``sleep`` is the event its pauses wait on (the client's runtime makes it)."""
        with self._mutex:
            self._forked()
            if self._closed or self._count >= self._limit:
                return None
            self._count += 1
            bell = self._make(key, owner, sleep)
            self._waiting[(key, owner)] = bell
            return bell

    def waiting(self, key: str, owner: str) -> B | None:
        """``owner``'s doorbell for ``key``, if it waits at one."""
        with self._mutex:
            return self._waiting.get((key, owner))

    def ringing(self, key: str, owner: str) -> B | None:
        """``owner``'s doorbell for ``key`` if it has the bell (it is next in line)."""
        bell = self.waiting(key, owner)
        return bell if bell is not None and bell.has_bell else None

    def _stale(self) -> list[Any]:
        """Take out (under the mutex) the idle connections that are half ``idle_for`` old:
        the server may have ended them, or soon will. The caller closes them outside the
        mutex: under the async client a close awaits."""
        now = time.monotonic()
        stale = [c for c, since in self._idle if now - since >= self._idle_for / 2 or self._dead(c)]
        self._idle = [(c, since) for c, since in self._idle if c not in stale]
        return stale

    def checkout(self) -> Any:
        """An idle connection, or a new one."""
        with self._mutex:
            self._forked()
            stale = self._stale()
            conn = self._idle.pop()[0] if self._idle else None
        for old in stale:
            self._close(old)
        return conn if conn is not None else self._open()

    def checkin(self, conn: Any) -> None:
        """Keep ``conn`` for the next waiter, or close it."""
        with self._mutex:
            stale = self._stale()
            kept = not self._closed and self._pid == _forksafe.pid()
            if kept and len(self._idle) < self._idle_kept:
                self._idle.append((conn, time.monotonic()))
            else:
                stale.append(conn)
        for old in stale:
            self._close(old)

    def closed(self, bell: B, conn: Any | None, won: bool) -> None:
        """A waiter is done: keep its bell with its hold (``won``), else let go of it."""
        with self._mutex:
            if self._pid != _forksafe.pid():
                return
            if self._waiting.get((bell.key, bell.owner)) is bell:
                del self._waiting[(bell.key, bell.owner)]
            if won and conn is not None and not self._closed:
                self._held[(bell.key, bell.owner)] = conn
                return
            self._count -= 1
        if conn is not None:
            self.let_go(conn, bell if bell.has_bell else None)

    def _ending(
        self, key: str, owner: str, waiter: Callable[[B], Any | None] | None = None
    ) -> Any | None:
        """The connection of the bell that the hold (key, owner) keeps, taken out, for its
        release to let go of the bell there; else ``waiter(bell)`` of (key, owner)'s doorbell
        if it still waits (None: no bell to let go of)."""
        with self._mutex:
            if self._pid != _forksafe.pid():
                return None
            conn = self._held.pop((key, owner), None)
            if conn is not None:
                self._count -= 1
                return conn
            bell = self._waiting.get((key, owner))
            return waiter(bell) if waiter is not None and bell is not None else None

    def close(self) -> None:
        with self._mutex:
            self._closed = True
            if self._pid != _forksafe.pid():
                return
            conns = [conn for conn, _ in self._idle] + list(self._held.values())
            self._idle.clear()
            self._held.clear()
        for conn in conns:
            self._close(conn)  # ending the session frees its bells
