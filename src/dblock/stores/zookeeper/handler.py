"""kazoo's threading handler, waiting with ``poll(2)``.

kazoo's connection thread waits for its socket once per request, reply and watch event, and
its handler makes a new epoll instance for each wait (``epoll_create``, an ``epoll_ctl`` per
descriptor, ``epoll_wait``, ``close``: five system calls). ``poll`` is one, and like epoll it
has no limit on descriptor numbers (why kazoo left ``select``). Measured on this project's
2-core machine: about 20 µs less CPU per request (``exists`` in a loop: 91-99 µs against
116-125 µs), a sixth of what a request costs the client.
"""

from __future__ import annotations

import selectors
import types
from typing import Any

from kazoo.handlers.threading import SequentialThreadingHandler
from kazoo.handlers.utils import selector_select

_POLL = types.SimpleNamespace(
    DefaultSelector=getattr(selectors, "PollSelector", selectors.DefaultSelector),
    EVENT_READ=selectors.EVENT_READ,
    EVENT_WRITE=selectors.EVENT_WRITE,
)


class PollHandler(SequentialThreadingHandler):  # type: ignore[misc]
    """kazoo's ``SequentialThreadingHandler``; only its wait for sockets differs."""

    def select(self, *args: Any, **kwargs: Any) -> Any:
        return selector_select(*args, selectors_module=_POLL, **kwargs)
