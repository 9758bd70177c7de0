"""What the client's code waits with: threads for the blocking client, the event loop for the
async one.

The locks, patterns and stores are written once, in blocking style. Everything in them that
waits (a sleep, an event, a mutex held across a statement, a background worker, the owner's
identity) asks the client's runtime: :data:`THREADS` blocks the calling thread; a
:class:`LoopRuntime` (:mod:`dblock._aio`) awaits on the event loop from inside the greenlet
that runs the code (:mod:`dblock._green`).
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

from . import _forksafe
from ._renewer import Scheduler

T = TypeVar("T")


class Event(Protocol):
    """What waiting code needs of an event (``threading.Event`` has it)."""

    def set(self) -> None: ...
    def clear(self) -> None: ...
    def is_set(self) -> bool: ...
    def wait(self, timeout: float | None = None) -> bool: ...


class Worker(Protocol):
    """A background loop (a thread, or a task on the event loop)."""

    def is_alive(self) -> bool: ...
    def join(self, timeout: float | None = None) -> None: ...


class Jobs(Protocol):
    """Timed background calls: renewals and expiry watches."""

    def at(self, when: float, fn: Callable[[], None]) -> Any: ...
    def stop(self) -> None: ...


class Runtime(Protocol):
    #: "threads" or "asyncio", for messages
    name: str

    def event(self) -> Event: ...
    def sleep(self, seconds: float) -> None: ...
    def start(self, name: str, fn: Callable[[], None]) -> Worker: ...
    def mutex(self) -> AbstractContextManager[Any]: ...
    def owner_serial(self) -> int: ...
    def owner_label(self) -> str: ...
    def offload(
        self, fn: Callable[..., T], *args: Any, discard: Callable[[T], None] | None = None
    ) -> T: ...
    def jobs(self, name: str) -> Jobs: ...
    def loop_running(self) -> bool: ...
    def cleaning_up(self) -> BaseException | None:
        """The cancellation whose cleanup the current call is running, if any."""
        ...


_THREAD = threading.local()
SERIALS = itertools.count(1)
_SERIAL_LOCK = _forksafe.lock()


def next_serial() -> int:
    with _SERIAL_LOCK:
        return next(SERIALS)


def thread_id() -> int:
    """This thread's identity for ownership: unlike ``threading.get_ident()``, which Python
    gives to a new thread once the old one has ended, it is never reused in this process, so
    a new thread can never re-enter or release a hold of a thread that died holding it."""
    serial: int | None = getattr(_THREAD, "serial", None)
    if serial is None:
        serial = next_serial()
        _THREAD.serial = serial
    return serial


class Threads:
    """The blocking client's runtime: waits block the calling thread."""

    name = "threads"

    def event(self) -> Event:
        return threading.Event()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def start(self, name: str, fn: Callable[[], None]) -> Worker:
        thread = threading.Thread(target=fn, name=name, daemon=True)
        thread.start()
        return thread

    def mutex(self) -> AbstractContextManager[Any]:
        return _forksafe.lock()

    #: the thread (no call in between: it runs on every acquire and release)
    owner_serial = staticmethod(thread_id)

    def owner_label(self) -> str:
        return str(threading.get_ident())

    def offload(
        self, fn: Callable[..., T], *args: Any, discard: Callable[[T], None] | None = None
    ) -> T:
        return fn(*args)  # on the caller's thread: nothing can be left half done

    def jobs(self, name: str) -> Jobs:
        return Scheduler(name)

    def cleaning_up(self) -> BaseException | None:
        return None  # a Ctrl-C leaves the call at once: no cleanup statements run after it

    def loop_running(self) -> bool:
        """True if this thread is running an asyncio event loop (without importing asyncio)."""
        if "asyncio" not in sys.modules:
            return False  # nothing can be running a loop that was never imported
        import asyncio  # already loaded: no import cost

        return asyncio._get_running_loop() is not None


THREADS: Runtime = Threads()
