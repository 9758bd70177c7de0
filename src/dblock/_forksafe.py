"""Thread locks that a forked child gets unlocked, and the current process id.

``fork()`` copies a lock in whatever state it is in. If another thread of the parent held
it at that moment (a renewal, a checkout from the pool, ...), nothing in the child would
ever release it, and the child's first use would hang. Every lock dblock makes comes from
here and is reset in the child, as the standard library does for its own (``logging``).
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

_made: weakref.WeakSet[Any] = weakref.WeakSet()
_pid = os.getpid()


def pid() -> int:
    """``os.getpid()`` without its system call (hot paths ask on every statement), set anew in
    a forked child by the hook that resets the locks: a child that skipped it (a fork from C
    that never calls ``PyOS_AfterFork_Child``) would have the parent's locks held as well."""
    return _pid


def lock() -> threading.Lock:
    """A ``threading.Lock`` that is released in a forked child."""
    made = threading.Lock()
    _made.add(made)
    return made


def condition(lock: threading.Lock | None = None) -> threading.Condition:
    """A ``threading.Condition`` (on ``lock``, one of ``lock()``'s, if given) that is released,
    with no waiters, in a forked child."""
    made = threading.Condition(lock)
    _made.add(made)
    return made


def _reset_in_child() -> None:
    global _pid  # noqa: PLW0603 - the one place the cached id changes
    _pid = os.getpid()
    for made in list(_made):
        reset = getattr(made, "_at_fork_reinit", None)  # CPython >= 3.9: what logging uses
        if reset is not None:
            reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_in_child)
