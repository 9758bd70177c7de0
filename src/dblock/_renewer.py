"""One background thread per client that runs timed jobs: lease renewals and expiry watches."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

from . import _forksafe

log = logging.getLogger("dblock")


class Job:
    """A scheduled call; ``cancel()`` makes it a no-op if it has not started."""

    __slots__ = ("cancelled", "fn")

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        # a job's call usually refers to its hold, which refers to the job: dropping the call
        # lets the hold be freed as soon as it is released, not by the cycle collector after
        # the job's time has come (with thousands of short holds a second, that collector's
        # passes over them cost more than the holds themselves)
        self.fn = _nothing


def _nothing() -> None:
    """What a cancelled job calls, if its thread had taken it just before."""


class Scheduler:
    """Runs jobs at monotonic times on a daemon thread, started on first use."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._heap: list[tuple[float, int, Job]] = []
        self._seq = itertools.count()
        # `at` takes the plain lock, whose `with` costs no Python call (the condition's own
        # does), on every acquire; the thread waits on the condition over it
        self._lock = _forksafe.lock()
        self._cond = _forksafe.condition(self._lock)
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._pid = _forksafe.pid()

    def at(self, when: float, fn: Callable[[], None]) -> Job:
        """Run ``fn`` at ``time.monotonic() >= when``."""
        job = Job(fn)
        with self._lock:
            if self._pid != _forksafe.pid():
                # a forked child: the parent's renewals and watches are the parent's to run
                # (renewing them here would keep its leases alive after it died), and its
                # thread does not exist here
                self._heap.clear()
                self._thread = None
                self._pid = _forksafe.pid()
            if self._stopped:
                return job
            entry = (when, next(self._seq), job)
            heapq.heappush(self._heap, entry)
            if self._thread is None:
                # first use, a forked child (the parent's thread does not exist here), or
                # the thread ended (see _loop)
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            elif self._heap[0] is entry:
                # the thread sleeps until the earliest job; it needs waking only when that is
                # this one (waking it on every acquire cost each acquire a thread switch)
                self._cond.notify()
        return job

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._heap.clear()
            self._cond.notify()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def _loop(self) -> None:
        try:
            self._run_jobs()
        finally:
            # whatever ended it, the next job starts another (``at`` asks only this)
            with self._lock:
                if self._thread is threading.current_thread():
                    self._thread = None

    def _run_jobs(self) -> None:
        while True:
            with self._cond:
                while not self._stopped:
                    if self._heap:
                        wait = self._heap[0][0] - time.monotonic()
                        if wait <= 0:
                            break
                        self._cond.wait(wait)
                    else:
                        self._cond.wait()
                if self._stopped:
                    return
                _, _, job = heapq.heappop(self._heap)
            if job.cancelled:
                continue
            try:
                job.fn()
            except Exception:
                log.exception("dblock background job failed")
