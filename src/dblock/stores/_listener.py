"""Pushed wake-ups shared by the stores that have them: one listening connection per client,
on a thread (or, for the async client, a task), waking the waiters of a key.

It listens on the table's channel (releases that ring everyone, force-release notices) and on
a channel of its own, named in its waiters' queue entries, for what only they need to hear: a
hand-over to one of them, or their turn. Messages (as text):

- ``<owner> <key>``: a release rings ``owner``'s waiter of ``key`` (every waiter if empty);
- ``=<token> <owner> <key>``: the lock of ``key`` was handed to ``owner`` with ``token``;
- ``!<owner> <key>``: ``owner``'s hold of ``key`` was force-released (see ``watch``);
- ``~ <key>``: ``key`` was proclaimed in, or a hold that proclaimed released, for its
  observers (``watch_leader``; a listener that does not know it reads a ring of owner ``~``,
  which no waiter is). Every message about a key tells its observers too.

A store subclasses :class:`Listener` with its ``_run``: connect, listen on both channels, set
``_ready`` once they are live, pass each message to ``_heard``; on a lost connection clear
``_ready``, ``_wake(None)`` every waiter (a message may have been lost: they look again) and
reconnect; between messages (at least every half second) end if ``_idle_out()`` says so.

A listener that has had no waiter wait, and no watch or observer, for ``Listener.idle_close``
seconds closes its connection, and the client makes a new one when it next needs one. A
listening connection costs its server on every message of the table's channel, and
PostgreSQL signals every LISTENing backend of the database at every NOTIFY, whatever its
channel: a fleet of clients that once waited must not keep that cost.

Where listening is that dear (``Listener.dear``), a listener listens only while something is
registered with it, and ``Listener.linger`` seconds after: it stops listening then, and starts
again (``_ready`` set once it listens) when the next registration comes; ``_use_changed`` tells
``_run`` at once. A client that waited once is no longer signalled at every NOTIFY of its
database a moment later, not ``idle_close`` seconds later.
"""

from __future__ import annotations

import itertools
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from .. import _forksafe
from .._contract import Subscription
from .._runtime import Runtime

log = logging.getLogger("dblock")
T = TypeVar("T")


def parse(payload: str) -> tuple[bool, str, str, int | None] | None:
    """A message (see the module) as (a force-release notice, owner, key, the token of a
    hand-over), or None if it is not one."""
    if payload.startswith("!"):
        owner, _, key = payload[1:].partition(" ")
        return True, owner, key, None
    granted = None
    if payload.startswith("="):
        token, _, payload = payload[1:].partition(" ")
        if not token.isdigit():
            return None
        granted = int(token)
    owner, _, key = payload.partition(" ")
    if granted is not None and not owner:
        return None
    return False, owner, key, granted


class PushedSubscription(Subscription):
    """A waiter's registration with its client's listener: under its key, or under each of
    the keys of a waiter for several keys (woken by any of them, never handed a lock)."""

    targeted = True
    latched = False

    def __init__(
        self, listener: Listener, keys: tuple[str, ...], owner: str, live: bool, *, grants: bool
    ) -> None:
        self._listener = listener
        self.key = keys[0]
        self.keys = keys
        self.owner = owner
        self.live = live
        #: it takes the hand-overs told to its owner (a single-key waiter)
        self.grants = grants
        self.granted: int | None = None
        self.event = listener.rt.event()

    def wait(self, timeout: float) -> bool:
        self._listener.used()
        woken = self.event.wait(timeout)
        self.event.clear()
        return woken

    def close(self) -> None:
        self._listener.unsubscribe(self)


class Retired(Exception):
    """The listener closed for want of use: the caller makes another."""


class Listener(ABC):
    """One listening connection per client; subclasses supply ``_run`` (see the module)."""

    #: seconds without a waiter, watch or observer before the listener closes
    idle_close = 10.0
    #: listening costs the server at every notification, whoever it is for: listen only while
    #: something is registered (see the module)
    dear = False
    #: a dear listener listens on this long after its last registration went: a client that
    #: waits again at once (it took the lock, and wants it again) subscribes for free
    linger = 0.1

    def __init__(self, rt: Runtime, channel: str) -> None:
        #: a thread for the blocking client, a task for the async one
        self.rt = rt
        #: the client's own channel
        self.channel = channel
        self._subs: dict[str, set[PushedSubscription]] = {}
        self._watches: dict[tuple[str, str], Callable[[], None]] = {}
        #: observers (``watch_leader``): key -> {serial: heard}
        self._leaders: dict[str, dict[int, Callable[[], None]]] = {}
        self._serials = itertools.count()
        self._lock = _forksafe.lock()
        #: since when nothing has used it (None: in use); set under ``_lock``
        self._idle_since: float | None = None
        #: it closed for want of use: nothing registers with it any more (under ``_lock``)
        self._retired = False
        self._ready = rt.event()
        #: a dear listener listens until then with nothing registered (under ``_lock``)
        self._linger_until = 0.0
        #: where ``_run`` runs (it waits on ``_stopped`` there)
        self._worker_rt = self._runs_on()
        self._stopped = self._worker_rt.event()
        self._thread = self._worker_rt.start("dblock-listener", self._run)

    def _runs_on(self) -> Runtime:
        """The runtime ``_run`` runs on: the client's (a thread, or a loop task); a listener
        whose driver only blocks takes a thread whichever the client is (its wake-ups, and the
        ``watch`` calls, are then made from that thread: both are thread-safe)."""
        return self.rt

    @abstractmethod
    def _run(self) -> None:
        """Listen until stopped (see the module)."""

    def subscribe(self, key: str, owner: str) -> PushedSubscription:
        return self._register((key,), owner, grants=True)

    def subscribe_many(self, keys: Sequence[str], owner: str) -> PushedSubscription:
        """One subscription for a waiter for several keys, woken by a message for any."""
        return self._register(tuple(keys), owner, grants=False)

    def _register(self, keys: tuple[str, ...], owner: str, *, grants: bool) -> PushedSubscription:
        # Wait (briefly) until listening is live, so no release after our next try is missed.
        if self._retired:  # (checked again below, under the lock)
            raise Retired
        live = False if self.dear else self._ready.wait(2.0)
        sub = PushedSubscription(self, keys, owner, live, grants=grants)
        with self._lock:
            if self._retired:
                raise Retired
            first = not self._registered()
            for key in keys:
                self._subs.setdefault(key, set()).add(sub)
        if self.dear:  # registered first: _run listens for it (see _listen_wanted)
            self._first_came(first)
            sub.live = self._ready.wait(2.0)
        return sub

    def _registered(self) -> bool:
        """Under ``_lock``: a waiter, watch or observer is registered."""
        return bool(self._subs or self._watches or self._leaders)

    def _listen_wanted(self) -> tuple[bool, float]:
        """For a dear listener's ``_run``: whether to listen now, and for how long at most
        before it asks again (a linger's end). When not, ``_ready`` is cleared in the same step
        as the answer (under ``_lock``), so a registration that comes after it waits for the
        next LISTEN rather than trust the one about to end."""
        with self._lock:
            if self._registered():
                return True, 0.5
            left = self._linger_until - time.monotonic()
            if left > 0:
                return True, left
            self._ready.clear()
        return False, 0.5

    def _first_came(self, first: bool) -> None:
        """After a registration (``first``: nothing was registered before it): a dear
        listener that does not listen starts to."""
        if first and not self._ready.is_set():
            self._use_changed()

    def _went(self) -> None:
        """Under ``_lock``, after a registration went: if it was the last, the linger starts."""
        if not self._registered():
            self._linger_until = time.monotonic() + self.linger

    def _use_changed(self) -> None:  # noqa: B027 - only a dear listener needs to hear of it
        """The first registration came while it did not listen: a dear listener's ``_run``
        starts listening now, not at its next periodic wake-up. (It stops at a wake-up after
        the linger: a client that waits again within it costs no wake-up at all.)"""

    def watch(self, key: str, owner: str, heard: Callable[[], None]) -> Callable[[], None]:
        with self._lock:
            self._in_use()
            first = not self._registered()
            self._watches[key, owner] = heard
        self._first_came(first)

        def unwatch() -> None:
            with self._lock:
                if self._watches.get((key, owner)) is heard:
                    del self._watches[key, owner]
                self._went()

        return unwatch

    def watch_leader(self, key: str, heard: Callable[[], None]) -> Callable[[], None]:
        """Call ``heard`` at each message about ``key`` and whenever the listener (re)connects
        (a message may have been lost); returns the call that stops it."""
        if not self.dear:
            self._ready.wait(2.0)  # as a subscription does: what comes after it is heard
        serial = next(self._serials)
        with self._lock:
            self._in_use()
            used = self._registered()
            watchers = self._leaders.setdefault(key, {})
            watchers[serial] = heard
            first = len(watchers) == 1
        if self.dear:
            self._first_came(not used)
            self._ready.wait(2.0)
        if first:
            self._observed(key)

        def unwatch() -> None:
            with self._lock:
                watchers = self._leaders.get(key)
                last = watchers is not None and watchers.pop(serial, None) is not None
                last = last and not watchers
                if last:
                    del self._leaders[key]
                self._went()
            if last:
                self._unobserved(key)

        return unwatch

    def _in_use(self) -> None:
        """Under ``_lock``, before registering a watch: raise Retired if it has closed."""
        if self._retired:
            raise Retired
        self._idle_since = None

    def used(self) -> None:
        """A waiter waits for a message. (A subscription made only to take a free lock in
        the same statement that would queue for it is no use: a client that never waits
        lets its listener close.)"""
        with self._lock:
            self._idle_since = None

    def _idle_out(self) -> bool:
        """True, and the listener stops, once nothing has used it for ``idle_close`` s
        (``_run`` calls it between messages, and then ends)."""
        now = time.monotonic()
        with self._lock:
            if self._registered():
                self._idle_since = None
                return False
            if self._idle_since is None:
                self._idle_since = now
            if now - self._idle_since < self.idle_close:
                return False
            self._retired = True
            self._stopped.set()
        self._ready.clear()
        log.debug("dblock listener closing: unused for %.0f s", self.idle_close)
        return True

    def _observed(self, key: str) -> None:  # noqa: B027 - most listeners hear them already
        """``key`` has its first observer (a store whose observers need more than the table's
        channel listens for more)."""

    def _unobserved(self, key: str) -> None:  # noqa: B027 - see _observed
        """``key``'s last observer stopped."""

    def _tell_observers(self, key: str | None) -> None:
        """Call the observers of ``key`` (of every key if None)."""
        with self._lock:
            told = [
                heard
                for k, each in self._leaders.items()
                if key in (None, k)
                for heard in each.values()
            ]
        for heard in told:
            try:
                heard()
            except Exception:  # an observer's failure must not stop the wake-ups
                log.exception("dblock leader watch of %r failed", key)

    def unsubscribe(self, sub: PushedSubscription) -> None:
        with self._lock:
            had = self._registered()
            for key in sub.keys:
                subs = self._subs.get(key)
                if subs is not None:
                    subs.discard(sub)
                    if not subs:
                        del self._subs[key]
            if had:
                self._went()

    def _wake(self, key: str | None, owner: str = "", granted: int | None = None) -> None:
        """Wake ``owner``'s subscription to ``key`` (everyone's if no owner; all if no key),
        telling it the token of a lock ``granted`` to it."""
        if key is None:
            self._tell_observers(None)
        with self._lock:
            targets = {
                s
                for k, subs in self._subs.items()
                if key in (None, k)
                for s in subs
                if not owner or s.owner == owner
            }
        for sub in targets:
            if granted is not None and sub.grants:
                sub.granted = granted
            sub.event.set()

    def _heard(self, payload: str) -> None:
        """One message (see the module)."""
        if payload.startswith("~ "):
            self._tell_observers(payload[2:])
            return
        message = parse(payload)
        if message is None:
            return
        lost, owner, key, granted = message
        if self._leaders:
            self._tell_observers(key)
        if lost:
            with self._lock:
                heard = self._watches.get((key, owner))  # ends when the hold does
            if heard is not None:
                try:
                    heard()
                except Exception:  # a watcher's failure must not stop the wake-ups
                    log.exception("dblock loss watch of %r failed", key)
            return
        self._wake(key, owner, granted)

    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopped.is_set()

    def ready(self) -> bool:
        return self._ready.is_set()

    def stop(self) -> None:
        self._stopped.set()
        self._interrupt()
        # a thread of the async client's is not waited for: the loop would block; it ends
        # (and closes its connection) within its next wait
        if self._thread.is_alive() and self._worker_rt is self.rt:
            self._thread.join(timeout=2)

    def _interrupt(self) -> None:  # noqa: B027 - a listener whose wait cannot be cut short
        """Make ``_run``'s wait for a message return now, so that ``stop`` (a client's close,
        a command's exit) does not wait out that wait's timeout."""


class PushedWakeups:
    """A store's side of its listener, and the capabilities it gives (the store adds
    ``acquire_or_enqueue``). First among the store's bases: it overrides ``subscribe`` and
    ``close``. The listener is made on first use, and again in a forked child, whose
    parent's listener thread is not its own."""

    _listener: Listener | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._listener_lock = _forksafe.lock()

    @abstractmethod
    def _new_listener(self) -> Listener:
        """A listener for this store, started."""

    def _listening(self) -> Listener:
        with self._listener_lock:
            if self._listener is None or not self._listener.alive():
                self._listener = self._new_listener()
            return self._listener

    def _own_channel(self, none: str | None = None) -> str | None:
        """The channel this client's listener hears its own messages on (``none`` if it
        has no listener)."""
        listener = self._listener
        return listener.channel if listener is not None and listener.alive() else none

    def joining(self) -> bool:
        """True if this client's listener is up and listening (subscribing costs nothing
        then; a dear listener that stopped listening is not used to take a free lock)."""
        listener = self._listener
        return listener is not None and listener.alive() and listener.ready()

    def _with_listener(self, use: Callable[[Listener], T]) -> T:
        """``use`` the listener; one that closed for want of use just now is replaced."""
        while True:
            try:
                return use(self._listening())
            except Retired:
                continue

    def subscribe(self, key: str, owner: str, queue: str | None = None) -> Subscription:
        return self._with_listener(lambda listener: listener.subscribe(key, owner))

    def watch(self, key: str, owner: str, heard: Callable[[], None]) -> Callable[[], None]:
        """Call ``heard`` (on the listener's thread: it must return quickly) when a
        force-release of ``owner``'s hold of ``key`` takes effect; returns the call that
        stops it. One listening connection per client serves every watch and every waiter."""
        return self._with_listener(lambda listener: listener.watch(key, owner, heard))

    def watch_leader(self, key: str, heard: Callable[[], None]) -> Callable[[], None]:
        """LeaderPush, where the store declares it: ``heard`` at each message about ``key``
        (the listener's, as a waiter hears them; see the module)."""
        return self._with_listener(lambda listener: listener.watch_leader(key, heard))

    def close(self) -> None:
        with self._listener_lock:
            listener, self._listener = self._listener, None
        if listener is not None:
            listener.stop()
        super().close()  # type: ignore[misc]
