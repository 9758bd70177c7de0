"""The etcd store's wake-ups: watches, never polling.

A waiter's subscription watches its key's range for deletions from just after its failed try
(so a release in between still wakes it). Once it has a place in the fair queue it watches
only what can make it next: the entry just ahead of its own (its predecessor) while there is
one, else the hold and the shared holds. A release thus wakes one waiter, not all of them
(etcd's own lock recipe). A watch whose stream broke (its node died) is made again through
another endpoint, and the waiter looks again meanwhile.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from pyetcd import etcdrpc

from .._errors import BackendError
from ._contract import Subscription

_NOPUT = [etcdrpc.WatchCreateRequest.NOPUT]


class EtcdSubscription(Subscription):
    """A watch on deletions that may end a waiter's wait (see the module)."""

    def __init__(self, store: Any, key: str, queued_owner: str | None, since: int | None) -> None:
        """``store``: the EtcdBackend whose key layout, reads and queue entries it uses."""
        self._store = store
        self._key = key
        #: the owner whose place in the lock queue narrows the watch (None: a plain waiter)
        self._owner = queued_owner
        self._event = store.rt.event()
        self._watch: int | None = None
        #: what is watched: None (the key's whole range), or the key of one predecessor,
        #: or b"" (the holds: this waiter is at the head of the queue)
        self._target: bytes | None = None
        self._heads_only = False
        self.latched = since is not None
        self.targeted = queued_owner is not None
        self.live = self._start(since)

    # -- watches ---------------------------------------------------------------------------
    def _start(self, since: int | None, target: bytes | None = None) -> bool:
        base = self._store._base(self._key)
        callback: Callable[[Any], None] = self._heard
        extra: dict[str, Any] = {"filters": _NOPUT}
        if since is not None:
            extra["start_revision"] = since + 1

        def add(client: Any, _a: tuple[Any, ...]) -> int:
            if target:  # one key: the predecessor's entry
                return int(client.add_watch_callback(target, callback, **extra))
            return int(client.add_watch_prefix_callback(base, callback, **extra))

        self._target = target
        self._heads_only = target == b""
        try:
            self._watch = self._store.rpc.call("subscribing", add, self._key)
        except BackendError:
            self._watch = None
            return False
        return True

    def _stop(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            with contextlib.suppress(Exception):
                self._store.rpc.call("unsubscribing", lambda c, _a: c.cancel_watch(watch))

    def _heard(self, response: Any) -> None:
        if response is None or isinstance(response, BaseException):
            self._watch = None  # the stream ended (a node lost): look again, watch again
        elif self._heads_only:
            base = self._store._base(self._key)
            parts = [bytes(e.key)[len(base) :] for e in response.events]
            if not any(p == b"l" or p.startswith(b"s/") for p in parts):
                return  # a queue entry behind us left: nothing for us
        self._event.set()

    def _retarget(self) -> bool:
        """Watch what can make this waiter next; True if it may try now (it is at the head
        and the lock is free)."""
        with self._store._mutex:
            entry = self._store._entries.get((self._key, self._owner or ""))
        if entry is None:
            return False
        mine = entry[2]
        hold, _, shared, queue = self._store._parts(self._key)
        line = queue + b"lock/"
        rev, kvs = self._store._read("waiting", self._key)
        ahead = [kv for kv in kvs if bytes(kv.key).startswith(line) and kv.create_revision < mine]
        if ahead:
            target = bytes(max(ahead, key=lambda kv: kv.create_revision).key)
        elif any(bytes(kv.key) == hold or bytes(kv.key).startswith(shared) for kv in kvs):
            target = b""
        else:
            return True
        if target != self._target or self._watch is None:
            self._stop()
            self._event.clear()
            self._start(rev, target)
        return False

    # -- Subscription ----------------------------------------------------------------------
    def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` s; True early on a release. A queued waiter returns only
        when it is at the head and the holds are gone (its predecessor leaving just moves
        its watch), so it need not probe before it tries."""
        end = time.monotonic() + timeout
        while True:
            if self._event.is_set():
                self._event.clear()
                return True
            if self._owner is not None and self._retarget():
                return True
            if self._watch is None and not self._start(None, self._target):
                self._store.rt.sleep(min(timeout, self._store.poll_cap))
                return True
            woken = bool(self._event.wait(max(0.0, end - time.monotonic())))
            self._event.clear()
            if not woken or self._owner is None or self._heads_only or self._watch is None:
                return woken
            # the entry ahead of ours left: watch the next one, or the holds

    def close(self) -> None:
        self._stop()
        self._store._unsubscribed(self)
