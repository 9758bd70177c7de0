"""The etcd store's wake-ups: watches, never polling.

A waiter's subscription is one watch on its key's range, for deletions only, kept for the
whole wait. A plain waiter wakes on any deletion (a release, an expiry), and its watch starts
just after its failed try, so a release in between still wakes it. A waiter with a place in
the fair queue wakes only for what can make it next: the entry just ahead of its own (its
predecessor) leaving, and once it is at the head the holds ending. So a release makes one
waiter try, not all of them (etcd's own lock recipe); the others hear it and sleep on.

One watch, not a new one per predecessor: etcd serves a watch that starts at a past revision
from its "unsynced" group, which it catches up only every 100 ms, and a new watch can land
there even when it asks for no past revision (the server picks the current revision, and a
write just before the watch is registered makes that revision past). A waiter that re-made
its watch each time its predecessor left would hear of its turn up to 100 ms late now and
then. A watch whose stream broke (its node died) is made again through another endpoint, and
the waiter looks again meanwhile.

But a watch on the range hears every deletion in it, and with hundreds of waiters each
hand-off woke every waiting process (512 waiters in 64 processes: hand-offs 3 times slower than
with 8). So a waiter with more than ``NEAR`` entries ahead of it (a far waiter) watches one
key instead: the entry ``NEAR`` places ahead of its predecessor (its sentinel), whose leaving
means at most ``NEAR`` are left ahead. It then watches the range again, from the revision of
the look that chose the sentinel, so that a predecessor that left meanwhile is heard too; by
the time its predecessor leaves, ``NEAR - 1`` hand-offs later, that watch has been caught up.
A hand-off thus wakes the ``NEAR`` nearest waiters' processes and one far one, however many
wait.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from pyetcd import etcdrpc

from ..._contract import Subscription
from ..._errors import BackendError

_NOPUT = [etcdrpc.WatchCreateRequest.NOPUT]
#: a queued waiter with more entries than this ahead of it watches only its sentinel's entry
NEAR = 8
log = logging.getLogger("dblock")


class EtcdSubscription(Subscription):
    """A watch on deletions that may end a waiter's wait (see the module)."""

    def __init__(self, store: Any, key: str, queued_owner: str | None, since: int | None) -> None:
        """``store``: the EtcdStore whose key layout, reads and queue entries it uses."""
        self._store = store
        self._key = key
        self._base = store._base(key)
        #: the owner whose place in the lock queue narrows the wake-ups (None: a plain waiter)
        self._owner = queued_owner
        self._event = store.rt.event()
        self._watch: int | None = None
        #: what a queued waiter waits for: the key suffix of its predecessor's entry (a far
        #: waiter: its sentinel's), or None (it is at the head: the holds ending); and the
        #: revision it was last looked up at
        self._target: bytes | None = None
        self._looked_at = 0
        #: a far waiter's predecessor as of its last look (None: a near waiter); its watch
        #: is then on its sentinel's entry alone
        self._predecessor: bytes | None = None
        #: the entry (key suffix) the watch covers alone, or None (the key's range)
        self._watched: bytes | None = None
        #: (key suffix, revision) of deletions heard and not yet looked at (a queued waiter)
        self._heard_deletions: deque[tuple[bytes, int]] = deque()
        self.latched = since is not None
        self.targeted = queued_owner is not None
        # A queued waiter looks before it waits, so its watch need not start in the past: it
        # is made now (from the current revision, so etcd rarely puts it among its unsynced
        # watchers, which hear of a release up to 100 ms late), unless this client's last
        # waiter at this key was far back: then after the first look, which says what to
        # watch (a watch made and cancelled saved)
        far = self.targeted and store._far_back(key)
        self.live = far or self._start(None if self.targeted else since)

    # -- the watch -------------------------------------------------------------------------
    def _start(self, since: int | None) -> bool:
        """Watch the key's range (after revision ``since``); False if no node answers now."""
        self._watch, self._watched = self._add(since, None), None
        return self._watch is not None

    def _add(self, since: int | None, entry: bytes | None) -> int | None:
        """A new watch of the key's range, or of its ``entry`` alone (a key suffix), for the
        deletions after revision ``since``; None if no node answers now."""
        callback: Callable[[Any], None] = self._heard
        extra: dict[str, Any] = {"filters": _NOPUT}
        if since is not None:
            extra["start_revision"] = since + 1

        def add(client: Any, _a: tuple[Any, ...]) -> int:
            if entry is not None:
                return int(client.add_watch_callback(self._base + entry, callback, **extra))
            return int(client.add_watch_prefix_callback(self._base, callback, **extra))

        try:
            return int(self._store.rpc.call("subscribing", add, self._key))
        except BackendError:
            return None

    def _cancel(self, watch: int | None) -> None:
        if watch is not None:
            with contextlib.suppress(Exception):
                self._store.rpc.call("unsubscribing", lambda c, _a: c.cancel_watch(watch))

    def _stop(self) -> None:
        watch, self._watch = self._watch, None
        self._cancel(watch)

    def _swap(self, since: int, entry: bytes | None) -> bool:
        """Watch ``entry`` alone (a far waiter's sentinel), or the range (None), instead of
        what the watch covers now, from after revision ``since``; False (the old watch
        kept) if no node answers now."""
        watch = self._add(since, entry)
        if watch is None:
            return False
        old, self._watch, self._watched = self._watch, watch, entry
        self._cancel(old)
        return True

    def _heard(self, response: Any) -> None:
        """pyetcd's watch thread: a response, or the stream's end (None or an exception)."""
        if response is None or isinstance(response, BaseException):
            self._watch = None  # the stream ended (a node lost): look again, watch again
        elif self._owner is not None:
            # kept for the waiter to judge after its next look; it is woken only for what
            # can make it next as it stands now (the others sleep on through a hand-off)
            revision = int(response.header.revision)  # no event of it is later than this
            cut = len(self._base)
            parts = [bytes(e.key)[cut:] for e in response.events]
            self._heard_deletions.extend((part, revision) for part in parts)
            if not any(self._matters(part, revision) for part in parts):
                return
        self._event.set()

    # -- a queued waiter -------------------------------------------------------------------
    def _look(self) -> bool:
        """Find what can make this waiter next; True if it may try now (it is at the head
        and the lock is free)."""
        with self._store._mutex:
            entry = self._store._entries.get((self._key, self._owner or ""))
        if entry is None:
            return False
        mine = entry[2]
        hold, _, shared, queue = self._store._parts(self._key)
        line = queue + b"lock/"
        revision, kvs = self._store._read("waiting", self._key)
        ahead = [kv for kv in kvs if bytes(kv.key).startswith(line) and kv.create_revision < mine]
        if not self._looked_at:  # where it joined the queue: where the next will, likely
            self._store._joined_far(self._key, len(ahead) > NEAR)
        self._looked_at = revision
        if ahead:
            cut = len(self._base)
            parts = [bytes(kv.key)[cut:] for kv in sorted(ahead, key=lambda kv: kv.create_revision)]
            far = len(parts) > NEAR
            self._target = parts[-NEAR - 1] if far else parts[-1]
            self._predecessor = parts[-1] if far else None
            return False
        self._target = self._predecessor = None
        return not any(bytes(kv.key) == hold or bytes(kv.key).startswith(shared) for kv in kvs)

    def _fit_watch(self) -> None:
        """After a look: watch the far waiter's sentinel alone, or a near waiter's range,
        from the look on. If no node answers now, a range watch is kept (it hears every
        deletion); any other is given up, and the range watched again, then looked at."""
        wanted = self._target if self._predecessor is not None else None
        fits = self._watch is not None and wanted == self._watched
        if not fits and not self._swap(self._looked_at, wanted) and self._watched is not None:
            self._stop()

    def _come_near(self) -> bool:
        """A far waiter's sentinel left: wait for its predecessor on a watch of the range
        from the look that found them (it hears the predecessor if that left since); False
        (a look is due) if no node answers now."""
        predecessor, self._predecessor = self._predecessor, None
        self._target = predecessor  # before the watch: its first deletions are judged by it
        if self._swap(self._looked_at, None):
            return True
        self._predecessor = predecessor
        return False

    def _matters(self, part: bytes, revision: int) -> bool:
        """Whether the deletion of ``part`` (a key suffix) at ``revision`` can make this
        waiter next, as of its last look."""
        if revision <= self._looked_at:
            return False  # the look already saw it
        target = self._target
        return (part == b"l" or part.startswith(b"s/")) if target is None else part == target

    def _concerns_us(self) -> bool:
        """Whether a deletion heard since the last look can make this waiter next."""
        relevant = False
        while self._heard_deletions:
            part, revision = self._heard_deletions.popleft()
            relevant = self._matters(part, revision) or relevant
        return relevant

    def _unwatchable(self, end: float) -> bool:
        """Make the watch again if its stream ended; True (after a pause, so the waiter looks
        again without a watch) if it cannot be made now."""
        if self._watch is None and not self._start(None):
            self._store.rt.sleep(min(max(0.0, end - time.monotonic()), self._store.poll_cap))
            return True
        return False

    def _wait_queued(self, end: float) -> bool:
        look = True
        while True:
            # (a far waiter has no watch before its first look: _fit_watch makes it)
            if self._looked_at and self._unwatchable(end):
                return True
            if look:
                self._event.clear()
                self._heard_deletions.clear()  # the look below sees what they did
                if self._look():
                    return True
                self._fit_watch()
            look = True
            # what was heard during the look is judged against what it found
            while not self._concerns_us():
                if self._watch is None:
                    break  # watch again, then look
                if not self._event.wait(max(0.0, end - time.monotonic())):
                    return False
                self._event.clear()
            else:
                if self._target is None:
                    return True  # a hold ended: our turn
                if self._watched is not None and self._come_near():
                    look = False  # the sentinel left: wait for the predecessor
                # else our predecessor left: look who is next

    # -- Subscription ----------------------------------------------------------------------
    def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` s; True early on a release. A queued waiter returns only
        when it is at the head and the holds are gone (its predecessor leaving just makes it
        look again), so it need not probe before it tries."""
        end = time.monotonic() + timeout
        if self._owner is not None:
            with self._store._mutex:
                queued = (self._key, self._owner) in self._store._entries
            if queued:
                return self._wait_queued(end)
        self._heard_deletions.clear()  # (a queued waiter's, between its places in the queue)
        if self._owner is not None and (self._watch is None or self._watched is not None):
            # a queued waiter out of the queue, without a watch of the range: it makes one,
            # then tries (a release before it was not heard)
            self._stop()
            self._unwatchable(end)
            return True
        if self._event.is_set():
            self._event.clear()
            return True
        if self._unwatchable(end):
            return True
        woken = bool(self._event.wait(max(0.0, end - time.monotonic())))
        self._event.clear()
        return woken

    def close(self) -> None:
        self._stop()
        self._store._unsubscribed(self)


class EtcdManySubscription(Subscription):
    """A many-waiter's wake-ups: one watch on each of its keys' ranges (deletions, with the
    deleted key's last version), all setting one event. It wakes at a hold of any key
    ending, and at an entry in a key's lock queue ahead of its own leaving (before it has
    entries: any other's). An event set between two waits stays set, so a release during
    a try wakes the next wait. A watch whose stream broke is made again at the next wait,
    which returns at once so that the waiter tries (what happened meanwhile was not
    heard)."""

    latched = True

    def __init__(self, store: Any, keys: Sequence[str], owner: str) -> None:
        """``store``: the EtcdStore whose key layout and many-entries it uses."""
        self._store = store
        self._owner = owner
        self._event = store.rt.event()
        self._watches: dict[str, int | None] = dict.fromkeys(keys)
        self.live = self._start()

    def _start(self) -> bool:
        """Make the watches that are not there; False if one cannot be made now."""
        for key, watch in self._watches.items():
            if watch is not None:
                continue
            base = self._store._base(key)
            heard = partial(self._heard, key, len(base))

            def add(client: Any, _a: tuple[Any, ...], b: bytes = base, h: Any = heard) -> int:
                return int(client.add_watch_prefix_callback(b, h, filters=_NOPUT, prev_kv=True))

            try:
                self._watches[key] = self._store.rpc.call("subscribing", add, key)
            except BackendError:
                return False
        return True

    def _heard(self, key: str, cut: int, response: Any) -> None:
        """pyetcd's watch thread: a response for ``key``, or the stream's end."""
        if response is None or isinstance(response, BaseException):
            self._watches[key] = None
            self._event.set()
            return
        place = self._store._many_place(self._owner)
        mine = b"q/lock/" + self._owner.encode()
        for event in response.events:
            part = bytes(event.key)[cut:]
            ended = part == b"l" or part.startswith(b"s/")
            # (an entry whose previous version is compacted away reads as revision 0: ahead)
            ahead = part.startswith(b"q/lock/") and part != mine
            if ended or (ahead and (place is None or int(event.prev_create_revision) < place)):
                self._event.set()

    def wait(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        if None in self._watches.values():
            if not self._start():  # no node answers now: a pause instead
                self._store.rt.sleep(min(max(0.0, end - time.monotonic()), self._store.poll_cap))
            self._event.clear()
            return True  # the waiter tries again, now that it hears releases
        woken = bool(self._event.wait(max(0.0, end - time.monotonic())))
        self._event.clear()
        return woken

    def close(self) -> None:
        watches = [w for w in self._watches.values() if w is not None]
        self._watches = {}
        for watch in watches:
            with contextlib.suppress(Exception):
                self._store.rpc.call("unsubscribing", lambda c, _a, w=watch: c.cancel_watch(w))
        self._store._unsubscribed(self)


class EtcdLeaderWatch:
    """An observer's watch of one key (LeaderPush): its hold key ``l`` (put by a grant,
    deleted by a release, a force-release or its lease's end) and its value key ``v`` (put
    by a proclaim), one watch on the key's range over the client's multiplexed watch stream;
    the rest of the range (queue entries, records) is not told. A watch whose stream broke
    tells the observer, which reads the leader; that read sets the watch again
    (``EtcdStore.leader``)."""

    def __init__(self, store: Any, key: str, heard: Callable[[], None]) -> None:
        """``store``: the EtcdStore whose key layout and connection it uses."""
        self._store = store
        self.key = key
        self._base = store._base(key)
        self._heard = heard
        self._watch: int | None = None
        self.broken = False
        self.stopped = False

    def start(self) -> None:
        """Set the watch (BackendError if no node answers now)."""
        self.broken = False

        def add(client: Any, _a: tuple[Any, ...]) -> int:
            return int(client.add_watch_prefix_callback(self._base, self._told))

        try:
            self._watch = self._store.rpc.call("watching the leader", add, self.key)
        except BaseException:
            self.broken = True
            raise

    def _told(self, response: Any) -> None:
        """pyetcd's watch thread: a response, or the stream's end (None or an exception)."""
        if self.stopped:
            return
        if response is None or isinstance(response, BaseException):
            self._watch, self.broken = None, True
        else:
            cut = len(self._base)
            if not any(bytes(e.key)[cut:] in (b"l", b"v") for e in response.events):
                return
        try:
            self._heard()
        except Exception:  # an observer's failure must not stop the watch thread
            log.exception("dblock leader watch of %r failed", self.key)

    def stop(self) -> None:
        self.stopped = True
        self._store._leader_watches.discard(self)
        watch, self._watch = self._watch, None
        if watch is not None:
            with contextlib.suppress(Exception):
                self._store.rpc.call("unsubscribing", lambda c, _a: c.cancel_watch(watch))
