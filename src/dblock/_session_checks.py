"""The checks of a client's session holds: one background job every half check looks at all
of them, instead of a job per hold.

A session hold's connection is checked about every ``SESSION_CHECK`` s (``hold.due`` says
when next). A job per hold cost each acquire a heap push under the scheduler's lock and its
cancellation at the release: a busy client takes thousands of short holds a second, most of
which never reach their first check. Here an acquire only puts the hold in a dict, and the
release takes it out.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from . import _forksafe
from ._engine import Hold
from ._engine.hold import SESSION_CHECK
from ._runtime import Jobs

#: how often the job looks (a hold is checked at the first look after its ``due``)
STEP = SESSION_CHECK / 2

log = logging.getLogger("dblock")


class SessionChecks:
    """The session holds of one client, each with what checks it."""

    def __init__(self, jobs: Jobs) -> None:
        self._jobs = jobs
        self._holds: dict[Hold, Callable[[Hold], None]] = {}
        #: the job is scheduled (it is, as long as there are holds)
        self._armed = False
        self._mutex = _forksafe.lock()
        self._pid = _forksafe.pid()

    def add(self, hold: Hold, check: Callable[[Hold], None]) -> None:
        """Check ``hold`` with ``check(hold)`` from ``hold.due`` on, until it is discarded."""
        with self._mutex:
            if self._pid != _forksafe.pid():
                # a forked child: the parent's holds are the parent's to check, and the job
                # was on the parent's scheduler
                self._holds.clear()
                self._armed = False
                self._pid = _forksafe.pid()
            self._holds[hold] = check
            if self._armed:
                return
            self._armed = True
        self._arm()

    def discard(self, hold: Hold) -> None:
        with self._mutex:
            self._holds.pop(hold, None)

    def _arm(self) -> None:
        self._jobs.at((math.floor(time.monotonic() / STEP) + 1) * STEP, self._look)

    def _look(self) -> None:
        now = time.monotonic()
        with self._mutex:
            due = [(hold, check) for hold, check in self._holds.items() if hold.due <= now]
        for hold, check in due:
            try:
                check(hold)  # sets the hold's next due, or discards it
            except Exception:  # that hold is no longer checked; the others still are
                log.exception("dblock: the check of a session hold failed")
                self.discard(hold)
        with self._mutex:
            if not self._holds:
                self._armed = False
                return
        self._arm()
