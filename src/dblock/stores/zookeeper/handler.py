"""kazoo's threading handler, waiting with ``poll(2)``.

kazoo's connection thread waits for its socket once per request, reply and watch event, and
its handler makes a new epoll instance for each wait (``epoll_create``, an ``epoll_ctl`` per
descriptor, ``epoll_wait``, ``close``: five system calls). ``poll`` is one, and like epoll it
has no limit on descriptor numbers (why kazoo left ``select``). Measured on this project's
2-core machine: about 20 µs less CPU per request (``exists`` in a loop: 91-99 µs against
116-125 µs), a sixth of what a request costs the client.

Its answers also wait no longer than ``answer_bound`` seconds. kazoo queues a request made
while it reconnects and sends it once connected; its own ``get()`` waits for the answer
without end, so an ``acquire(timeout=1)`` made during an outage of the ensemble waited for the
whole outage. Where the bound passes with no connection, the store gives the session up
(``ZookeeperStore._end_unreachable_session``), so that what kazoo still queues for it is never
sent. A request that was sent and outlives the bound is a lost reply: every operation of the
store is safe to repeat, and a sequential node left that way is found by its owner's next try
or ends with its lease.
"""

from __future__ import annotations

import selectors
import types
from typing import Any

from kazoo.handlers.threading import AsyncResult, KazooTimeoutError, SequentialThreadingHandler
from kazoo.handlers.utils import selector_select

_POLL = types.SimpleNamespace(
    DefaultSelector=getattr(selectors, "PollSelector", selectors.DefaultSelector),
    EVENT_READ=selectors.EVENT_READ,
    EVENT_WRITE=selectors.EVENT_WRITE,
)


class _BoundedResult(AsyncResult):  # type: ignore[misc]
    """kazoo's answer; a wait without a timeout is bounded by the handler's."""

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        if not block or timeout is not None:
            return super().get(block, timeout)
        bound = self._handler.answer_bound
        try:
            return super().get(True, bound)
        except KazooTimeoutError:
            if self.ready():  # the answer itself was that error
                raise
            raise KazooTimeoutError(f"no answer within {bound:g} s") from None


class PollHandler(SequentialThreadingHandler):  # type: ignore[misc]
    """kazoo's ``SequentialThreadingHandler``, waiting for sockets with ``poll`` and for an
    answer at most ``answer_bound`` seconds (then ``KazooTimeoutError``)."""

    def __init__(self, answer_bound: float) -> None:
        super().__init__()
        self.answer_bound = answer_bound

    def async_result(self) -> Any:
        return _BoundedResult(self)

    def select(self, *args: Any, **kwargs: Any) -> Any:
        return selector_select(*args, selectors_module=_POLL, **kwargs)
