"""Redis waiters of the blocking client that hear their own messages.

A waiter woken by the client's listener thread pays two thread wake-ups (an event, then the
GIL) between the hand-over's arrival and its own return: on a 2-core VM that was most of a
hand-off (bench/HISTORY.md, "Floors under the open targets"). Here the waiting thread reads a
pub/sub connection of its own, subscribed to the table's channel and to a channel of its
thread's, which its queue entry names: a hand-over wakes it through its own socket.

Each thread that waits keeps its connection (subscribed once) for its next waits, up to
``MAX_OWN`` threads per client; beyond them, and in the async client, waiters use the listener.
A connection that fails is dropped: the waiter looks again (a message may be lost) and the
next wait makes a new one. A forked child never reads its parent's connections.

A waiter for several keys (``lock_many``) hears a message about any of them the same way, or
through the listener (``ListenedMany``).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import weakref
from collections.abc import Callable, Collection, Sequence
from typing import Any

import redis

from ... import _forksafe
from ..._contract import Subscription
from ..._runtime import Runtime
from .._listener import Listener, PushedSubscription, parse

#: threads per client that keep a pub/sub connection of their own while they wait
MAX_OWN = 16
#: the longest a new connection may take to confirm its subscriptions
_SUBSCRIBE_WAIT = 2.0
#: what a failed connection raises
_FAILED = (redis.RedisError, OSError)


class OwnChannel:
    """One thread's pub/sub connection: the table's channel and ``name``."""

    def __init__(self, pubsub: Any, name: str) -> None:
        self.pubsub = pubsub
        self.name = name
        self.pid = _forksafe.pid()

    def close(self) -> None:
        if self.pid == _forksafe.pid():  # a parent's socket is the parent's to close
            with contextlib.suppress(*_FAILED):
                self.pubsub.close()


class _Keeper:
    """Lives in a thread's locals only: collected when the thread ends."""


class OwnChannels:
    """A client's ``OwnChannel`` per waiting thread."""

    def __init__(
        self, rt: Runtime, connect: Callable[[], Any], table_channel: str, base: str
    ) -> None:
        #: the blocking client's runtime (only its waiters have connections of their own)
        self.rt = rt
        self._connect = connect
        self._table_channel = table_channel
        self._base = base
        self._local = threading.local()
        self._all: list[OwnChannel] = []
        self._serial = itertools.count(1)
        self._lock = _forksafe.lock()
        self._closed = False
        self._pid = _forksafe.pid()
        #: connections being opened (each counts against MAX_OWN)
        self._opening = 0

    def mine(self) -> OwnChannel | None:
        """This thread's connection, subscribed; None if it cannot have one (too many
        threads, or it cannot connect: the listener serves it).

        Messages of its earlier waits may still be unread: a wait skips them as it reads (each
        names an owner of an earlier acquire, owners are never reused; a ring for everyone
        only makes the waiter look once more). Draining them here cost every contended acquire
        a poll of the socket and some 25 calls into redis-py."""
        own: OwnChannel | None = getattr(self._local, "own", None)
        if own is not None and own.pid != _forksafe.pid():
            own = self._local.own = None  # a forked child: the parent's connection
        if own is None:
            own = self._open()
            if own is None:
                return None
            self._local.own = own
            # the thread's locals go when it ends: its connection and its place with them
            self._local.keeper = keeper = _Keeper()
            weakref.finalize(keeper, self.drop, own)
        return own

    def _open(self) -> OwnChannel | None:
        with self._lock:
            if self._pid != _forksafe.pid():  # a forked child: those are its parent's
                self._all, self._opening, self._pid = [], 0, _forksafe.pid()
            if self._closed or len(self._all) + self._opening >= MAX_OWN:
                return None
            self._opening += 1  # its place is taken while it connects
            name = f"{self._base}:{next(self._serial)}"
        pubsub, own, kept = None, None, False
        try:
            pubsub = self._connect()
            if self._subscribed(pubsub, name):
                own = OwnChannel(pubsub, name)
        except _FAILED:
            pass
        finally:  # an interrupt too: the place is given back, the connection closed
            with self._lock:
                self._opening -= 1
                if own is not None and not self._closed:
                    self._all.append(own)
                    kept = True
            if pubsub is not None and not kept:
                with contextlib.suppress(*_FAILED):
                    pubsub.close()
        return own if kept else None

    def _subscribed(self, pubsub: Any, name: str) -> bool:
        """Subscribe to the table's channel and ``name``: True once the server confirmed both
        (a message sent before that would not reach this connection)."""
        pubsub.subscribe(self._table_channel, name)
        confirmed, deadline = 0, time.monotonic() + _SUBSCRIBE_WAIT
        while confirmed < 2 and time.monotonic() < deadline:
            message = pubsub.get_message(timeout=deadline - time.monotonic())
            if message is not None and message["type"] == "subscribe":
                confirmed += 1
        return confirmed == 2

    def drop(self, own: OwnChannel) -> None:
        """Close a connection that failed, or whose thread ended; the thread's next wait makes
        another."""
        if getattr(self._local, "own", None) is own:
            self._local.own = None
        with self._lock:
            if own in self._all:
                self._all.remove(own)
        own.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            every, self._all = self._all, []
        for own in every:
            own.close()


class OwnSubscription(Subscription):
    """A waiter's registration for ``keys`` (one, or a many-waiter's), read on its own
    thread's connection."""

    live = True
    targeted = True
    latched = False

    def __init__(
        self,
        channels: OwnChannels,
        own: OwnChannel,
        keys: Collection[str],
        owner: str,
        done: Callable[[], None] = lambda: None,
    ) -> None:
        self._channels = channels
        self._own = own
        self._done = done
        self.keys = frozenset(keys)
        self.owner = owner
        self.granted: int | None = None

    def wait(self, timeout: float) -> bool:
        """Read this thread's connection up to ``timeout`` s: True at a message about one of
        its keys for this waiter or everyone (a hand-over sets ``granted``: never one to a
        many-waiter, whose entries take none), or when the connection failed (look again:
        a message may be lost; the rest of this acquire polls, as with no listener)."""
        if not self.live:
            self._channels.rt.sleep(timeout)
            return False
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                message = self._own.pubsub.get_message(timeout=left)
            except BaseException as exc:
                # whatever broke the read (an interrupt too) may have left a reply half read;
                # a connection closed under it (the client closed) fails with whatever the
                # parser meets, not only a connection error
                self._channels.drop(self._own)
                self.live = False
                if not isinstance(exc, Exception):
                    raise
                return True
            if message is None or message["type"] != "message":
                continue
            parsed = parse(message["data"])
            if parsed is None:
                continue
            lost, owner, key, granted = parsed
            if lost or key not in self.keys or (owner and owner != self.owner):
                continue
            if granted is not None:
                self.granted = granted
            return True

    def close(self) -> None:
        self._done()


class ListenedMany(Subscription):
    """A many-waiter's registration with its client's listener (the async client's waiters,
    threads beyond ``MAX_OWN``): one per key, all setting one event."""

    live = True
    targeted = True
    latched = False

    def __init__(self, parts: list[PushedSubscription]) -> None:
        self._parts = parts
        self._event = parts[0].event
        for part in parts[1:]:
            if part.event.is_set():  # woken before it was joined to the others
                self._event.set()
            part.event = self._event

    @classmethod
    def of(cls, listener: Listener, keys: Sequence[str], owner: str) -> ListenedMany | None:
        """Registered for every key; None while the listener is not listening (the waiter
        polls), found without waiting for it once per key."""
        parts: list[PushedSubscription] = []
        for key in keys:
            parts.append(listener.subscribe(key, owner))
            if not (parts[-1].live and listener.ready()):
                for part in parts:
                    part.close()
                return None
        return cls(parts)

    def wait(self, timeout: float) -> bool:
        woken = self._event.wait(timeout)
        self._event.clear()
        return woken

    def close(self) -> None:
        for part in self._parts:
            part.close()
