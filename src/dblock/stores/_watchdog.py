"""Aborts statements that overrun their deadline, at the price of a dict insert per statement.

A timer per statement (a heap push and a wake-up of the timer thread) cost 10-20 % of an
uncontended acquire. Here a statement only registers itself; one daemon thread per backend looks
at the registered statements when the earliest deadline it knows of comes, and aborts the
overdue ones. A statement registered while the thread sleeps has a deadline no earlier than
``shortest`` from now, and the thread never sleeps longer than that, so no abort comes late.

A deadline measures the statement, not the process. The thread wakes at least every ``TICK``;
when it wakes much later than it asked to (the process was stopped with SIGSTOP, or starved of
CPU), every deadline moves on by the time lost, so a statement whose answer waits in the socket
is not aborted on resume. A stop shorter than ``TICK + STALL`` still counts against the deadline.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable

from .. import _forksafe

log = logging.getLogger("dblock")


#: the longest the thread sleeps: it bounds how much of a stop goes unnoticed
TICK = 1.0
#: a wake-up later than this is taken as time the whole process lost, not the statements
STALL = 0.5


class Watch:
    """One statement in flight."""

    __slots__ = ("abort", "aborted", "deadline")

    def __init__(self, deadline: float, abort: Callable[[], None]) -> None:
        self.deadline = deadline
        self.abort = abort
        self.aborted = False


class Watchdog:
    """Calls ``watch.abort()`` once for each watch still registered after its deadline."""

    def __init__(self, name: str, shortest: float) -> None:
        self._name = name
        self._shortest = shortest
        self._watches: dict[int, Watch] = {}
        self._ids = itertools.count()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = -1

    def watch(self, seconds: float, abort: Callable[[], None]) -> tuple[int, Watch]:
        """Register a statement that must end within ``seconds`` (at least ``shortest``)."""
        if self._pid != _forksafe.pid():  # first use, or a forked child without the thread
            self._start()
        item = Watch(time.monotonic() + max(seconds, self._shortest), abort)
        ident = next(self._ids)
        self._watches[ident] = item
        return ident, item

    def done(self, ident: int) -> None:
        self._watches.pop(ident, None)

    def stop(self) -> None:
        self._stopped.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def _start(self) -> None:
        # a forked child's copy holds the parent's statements, on sockets it must not touch
        self._watches.clear()
        self._pid = _forksafe.pid()
        self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        asked = time.monotonic()
        while True:
            now = time.monotonic()
            lost = now - asked
            if lost > STALL:
                for item in list(self._watches.values()):
                    item.deadline += lost
            wake = now + min(TICK, self._shortest)
            for item in list(self._watches.values()):
                if item.aborted:
                    continue
                if item.deadline <= now:
                    item.aborted = True
                    try:
                        item.abort()
                    except Exception:  # the statement ended meanwhile
                        log.debug("dblock watchdog: abort failed", exc_info=True)
                else:
                    wake = min(wake, item.deadline)
            asked = max(wake, time.monotonic() + 0.001)
            if self._stopped.wait(asked - time.monotonic()):
                return


def run_aside(task: Callable[[], None], name: str, what: str) -> Callable[[float], bool]:
    """Start ``task`` on a daemon thread of its own, and return a wait for it: ``wait(s)``
    blocks at most ``s`` seconds (call it through the runtime) and says whether the task
    ended without an error. A task that fails is logged as failing to do ``what``."""
    done = threading.Event()
    ended: list[bool] = []

    def target() -> None:
        try:
            task()
            ended.append(True)
        except Exception as exc:  # noqa: BLE001 - the waiter learns it did not end
            log.warning("could not %s: %s", what, exc)
        finally:
            done.set()

    threading.Thread(target=target, name=name, daemon=True).start()

    def wait(seconds: float) -> bool:
        done.wait(seconds)
        return bool(ended)

    return wait
