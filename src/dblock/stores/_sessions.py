"""What the SQL stores' session holds (``ttl=None``) share: a connection set aside per hold or
waiter (up to ``IDLE_KEPT`` idle ones kept for the next hold), the registry of holds, acquire's
one retry on a kept connection that died, statements on a hold's connection bound by
``CHECK_DEADLINE`` (its own watchdog), and closing. Each store's subclass says how to open a
connection, grant, check and release (stores/postgresql/session.py, stores/mysql/session.py).
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import Any

from .. import _forksafe
from ._pool import Failure
from ._watchdog import Watchdog

log = logging.getLogger("dblock")

#: idle session connections kept for the next hold
IDLE_KEPT = 4
#: a keep-alive check of a hold's connection that takes longer than this marks it lost
CHECK_DEADLINE = 2.0


class SessionConnections:
    """A store's session holds: its ``SessionHolds`` operations delegate here."""

    def __init__(self, store: Any) -> None:
        #: the store (typed loosely: importing it here would make a cycle); its pool lock,
        #: statements and error handling are used
        self.store = store
        self._pid = _forksafe.pid()
        # the store's watchdog gives every statement at least its 5 s: checks get their own
        self._watchdog = Watchdog(f"dblock-session-watchdog[{store.table}]", CHECK_DEADLINE)
        #: (connection, when it was put back)
        self._idle: list[tuple[Any, float]] = []
        #: (key, owner, token) -> the hold's connection, and what its checks compare
        self._conns: dict[tuple[str, str, int], tuple[Any, Any]] = {}

    # -- to implement -----------------------------------------------------------------------
    def _open(self) -> Any:
        """A new session connection (the store's errors wrapped)."""
        raise NotImplementedError

    def _grant(self, conn: Any, key: str, owner: str, timeout: float) -> tuple[int, Any] | None:
        """(token, what the hold's checks compare) if granted; None if not had in time, or a
        live lease holds the key (the lock given back)."""
        raise NotImplementedError

    def _answer(self, conn: Any, sql: str, params: dict[str, Any] | None) -> Any:
        """Run ``sql`` on ``conn``: what it answers (the store says what: the first row of its
        first result, or the number of rows it matched)."""
        raise NotImplementedError

    def _alive(self, conn: Any, key: str, seen: Any) -> bool | None:
        """Check a hold's connection (with _on_hold): True if it still holds the lock; None if
        the check failed (the connection is closed); False if it answers but no longer
        holds it (which the caller logs, and closes it)."""
        raise NotImplementedError

    def _release(self, conn: Any, key: str) -> bool | None:
        """End the hold on ``conn`` (with _on_hold): True if it was held; False if it answers
        but did not hold it; None if the statement failed (the connection is closed)."""
        raise NotImplementedError

    # -- hooks with a default -----------------------------------------------------------------
    def _fresh(self, since: float) -> bool:
        """An idle connection put back at ``since`` (monotonic) may still be used."""
        return True

    def _close(self, conn: Any) -> None:
        self.store._close_connection(conn)

    def _drop(self, conn: Any, interrupted: bool) -> None:
        """Close a connection whose state is unknown: the server frees its lock. A wait that
        may still run in the server is ended there first (the store's ``_interrupted``), so
        it cannot be granted later."""
        self.store._interrupted(conn)
        self._close(conn)

    def _timed_out(self, exc: Exception) -> bool:
        """``exc`` only says the lock was not had in time (the connection is dropped, which
        frees a lock granted as it came)."""
        return False

    # -- connections ----------------------------------------------------------------------
    def _checkout(self) -> tuple[Any, bool]:
        """(a connection for one hold or waiter, whether it was kept from an earlier one)."""
        stale = []
        kept = None
        with self.store._pool_lock:
            self.store._check_pool()
            if self._pid != _forksafe.pid():
                # forked: the parent's connections (and the locks they hold) are the parent's;
                # forget them without closing, as closing would end the parent's sessions
                self._idle.clear()
                self._conns.clear()
                self._pid = _forksafe.pid()
            while self._idle and kept is None:
                conn, since = self._idle.pop()
                if self._fresh(since):
                    kept = conn
                else:
                    stale.append(conn)  # the server may have closed it by now
        for conn in stale:
            self._close(conn)
        if kept is not None:
            return kept, True
        return self._open(), False

    def _checkin(self, conn: Any) -> None:
        with self.store._pool_lock:
            if not self.store._closed and len(self._idle) < IDLE_KEPT:
                self._idle.append((conn, time.monotonic()))
                return
        self._close(conn)

    # -- the capability -------------------------------------------------------------------
    def acquire_session(self, key: str, owner: str, timeout: float) -> int | None:
        for attempt in (1, 2):
            conn, kept = self._checkout()
            try:
                granted = self._grant(conn, key, owner, timeout)
            except BaseException as exc:
                self._drop(conn, interrupted=not isinstance(exc, Exception))
                if not isinstance(exc, Exception):
                    raise  # a cancellation: nothing is left held, the connection is gone
                if self._timed_out(exc):
                    return None
                failure = self.store._classify(exc)
                if failure is Failure.DISCONNECT and kept and attempt == 1:
                    continue  # a kept connection died meanwhile (a server restart): a fresh one
                if failure is None:
                    raise
                raise self.store._wrap(
                    exc, f"session acquire failed on {self.store.safe_url}", key
                ) from exc
            if granted is None:
                self._checkin(conn)
                return None
            token, seen = granted
            with self.store._pool_lock:
                self._conns[key, owner, token] = (conn, seen)
            return token
        raise AssertionError("unreachable")

    def check_session(self, key: str, owner: str, token: int) -> bool:
        with self.store._pool_lock:
            held = self._conns.get((key, owner, token))
        if held is None:
            return False
        conn, seen = held
        alive = self._alive(conn, key, seen)
        if alive:
            return True
        self._forget(key, owner, token)
        if alive is False:  # it answers, but the lock is not its own (a pooler moved it)
            self._close(conn)
            log.warning("lock %r (token %d): its server session changed", key, token)
        else:
            log.warning("the session of lock %r (token %d) ended", key, token)
        return False

    def release_session(self, key: str, owner: str, token: int) -> bool:
        held = self._forget(key, owner, token)
        if held is None:
            return False
        released = self._release(held[0], key)
        if released is None:
            return False
        self._checkin(held[0])
        return released

    def _on_hold(self, conn: Any, sql: str, params: dict[str, Any] | None = None) -> Any:
        """Run ``sql`` on a hold's connection within ``CHECK_DEADLINE``: its answer; None,
        the connection closed (which frees the server's lock if it still had it), if it
        failed or overran."""
        watchdog = self._watchdog
        ident, watch = watchdog.watch(CHECK_DEADLINE, partial(self.store._abort, conn))
        try:
            row = self._answer(conn, sql, params)
        except BaseException as exc:
            watchdog.done(ident)
            # nothing of this statement can grant anything later: just close (ending the
            # server's session first would wait for a server that may not answer)
            self._close(conn)
            if not isinstance(exc, Exception):
                raise
            log.debug("a session connection failed: %s", exc)
            return None
        watchdog.done(ident)
        if watch.aborted:
            self._close(conn)
            return None
        return row

    def _forget(self, key: str, owner: str, token: int) -> tuple[Any, Any] | None:
        with self.store._pool_lock:
            return self._conns.pop((key, owner, token), None)

    def close(self) -> None:
        """Close every session connection (the server frees their locks); in a forked child,
        forget the parent's instead."""
        with self.store._pool_lock:
            conns = [*(conn for conn, _ in self._idle), *(held[0] for held in self._conns.values())]
            self._idle.clear()
            self._conns.clear()
        self._watchdog.stop()
        if self._pid != _forksafe.pid():
            return
        for conn in conns:
            self._close(conn)


class DelegatedSessionHolds:
    """A store's ``SessionHolds`` operations, done by its ``_sessions``."""

    _sessions: SessionConnections

    def acquire_session(self, key: str, owner: str, timeout: float) -> int | None:
        return self._sessions.acquire_session(key, owner, timeout)

    def check_session(self, key: str, owner: str, token: int) -> bool:
        return self._sessions.check_session(key, owner, token)

    def release_session(self, key: str, owner: str, token: int) -> bool:
        return self._sessions.release_session(key, owner, token)
