"""The async client's runtime: the blocking-style code waits by awaiting on the event loop.

Every method that waits is called from a greenlet started by :func:`dblock._green.spawn` and
awaits through :func:`dblock._green.await_`. The owner of a hold, for re-entrancy, is the
asyncio task.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import time
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

from ._green import await_, bridged, cleaning_up, spawn
from ._renewer import Job
from ._runtime import Event, Jobs, Worker, next_serial

log = logging.getLogger("dblock")
T = TypeVar("T")


class LoopEvent:
    """``threading.Event``'s interface on the loop; ``set`` from any thread.

    A wait is one future of the loop's (and a timer): no task, as ``asyncio.wait_for`` of an
    ``asyncio.Event`` made one per wait, two turns of the loop more for every wake-up of a
    waiting acquire."""

    __slots__ = ("_flag", "_loop", "_waiters")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._flag = False
        self._waiters: list[asyncio.Future[bool]] = []

    def set(self) -> None:
        if _on_loop(self._loop):
            self._set()
        else:
            self._loop.call_soon_threadsafe(self._set)

    def _set(self) -> None:
        if self._flag:
            return
        self._flag = True
        for waiter in self._waiters:  # each wait removes its own
            if not waiter.done():
                waiter.set_result(True)

    def clear(self) -> None:
        self._flag = False

    def is_set(self) -> bool:
        return self._flag

    def wait(self, timeout: float | None = None) -> bool:
        if self._flag:
            return True
        if timeout is not None and timeout <= 0:
            return False
        waiter: asyncio.Future[bool] = self._loop.create_future()
        self._waiters.append(waiter)
        timer = None if timeout is None else self._loop.call_later(timeout, _expire, waiter)
        try:
            return bool(await_(waiter))
        finally:
            if timer is not None:
                timer.cancel()
            self._waiters.remove(waiter)


def _expire(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(False)


class _TaskWorker:
    __slots__ = ("_task",)

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self._task = task

    def is_alive(self) -> bool:
        return not self._task.done()

    def join(self, timeout: float | None = None) -> None:
        if self._task.done() or not bridged():
            return
        await_(asyncio.wait([self._task], timeout=timeout))


class _LoopMutex:
    """A mutex held across awaits (a renewal and a release of one hold exclude each other)."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = asyncio.Lock()

    def __enter__(self) -> None:
        await_(self._lock.acquire())

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._lock.release()


class LoopJobs:
    """Timed background calls as tasks on the loop, each in a greenlet of its own."""

    def __init__(self, loop: asyncio.AbstractEventLoop, name: str) -> None:
        self._loop = loop
        self._name = name
        self._timers: set[asyncio.TimerHandle] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopped = False

    def at(self, when: float, fn: Callable[[], None]) -> Job:
        job = Job(fn)
        if self._stopped:
            return job
        if _on_loop(self._loop):
            self._arm(when, job)
        else:
            self._loop.call_soon_threadsafe(self._arm, when, job)
        return job

    def _arm(self, when: float, job: Job) -> None:
        if self._stopped:
            return
        timer: asyncio.TimerHandle | None = None

        def fire() -> None:
            if timer is not None:
                self._timers.discard(timer)
            if job.cancelled or self._stopped:
                return
            task = self._loop.create_task(self._run(job), name=self._name)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        timer = self._loop.call_later(max(0.0, when - time.monotonic()), fire)
        self._timers.add(timer)

    async def _run(self, job: Job) -> None:
        try:
            await spawn(job.fn)
        except Exception:
            log.exception("dblock background job failed")

    def stop(self) -> None:
        self._stopped = True
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        tasks = [t for t in self._tasks if not t.done()]
        if tasks and bridged():  # let a renewal in flight finish: it holds a connection
            await_(asyncio.wait(tasks, timeout=5))


class LoopRuntime:
    """Waits await on ``loop``; the owner for re-entrancy is the current task."""

    name = "asyncio"

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._serials: weakref.WeakKeyDictionary[asyncio.Task[Any], int] = (
            weakref.WeakKeyDictionary()
        )
        self._workers: set[asyncio.Task[None]] = set()

    def event(self) -> Event:
        return LoopEvent(self.loop)

    def sleep(self, seconds: float) -> None:
        await_(asyncio.sleep(seconds))

    def start(self, name: str, fn: Callable[[], None]) -> Worker:
        async def work() -> None:
            try:
                await spawn(fn)
            except Exception:
                log.exception("dblock background task %s failed", name)

        task = self.loop.create_task(work(), name=name)
        self._workers.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._workers.discard)
        return _TaskWorker(task)

    def mutex(self) -> _LoopMutex:
        return _LoopMutex()

    def owner_serial(self) -> int:
        task = asyncio.current_task(self.loop)
        if task is None:  # a plain callback (an on_lost, say): no task owns anything
            return 0
        serial = self._serials.get(task)
        if serial is None:
            serial = self._serials[task] = next_serial()
        return serial

    def owner_label(self) -> str:
        return f"task-{self.owner_serial()}"

    def offload(
        self, fn: Callable[..., T], *args: Any, discard: Callable[[T], None] | None = None
    ) -> T:
        """Run ``fn(*args)`` on a worker thread. A cancellation waits for it to finish (it
        cannot be stopped, and it may be using a connection), hands what it returned to
        ``discard`` (a connection it opened, which nobody would otherwise close), then
        propagates."""
        # what asyncio.to_thread does (the caller's context, the loop's default executor),
        # less the task that would run its coroutine: each offload was a task's two loop
        # turns more (a store operation of the async client is one offload)
        call = functools.partial(contextvars.copy_context().run, fn, *args)
        future = self.loop.run_in_executor(None, call)
        try:
            return await_(asyncio.shield(future))
        except asyncio.CancelledError:
            with contextlib.suppress(BaseException):
                made = await_(future)
                if discard is not None:
                    discard(made)
            raise

    def jobs(self, name: str) -> Jobs:
        return LoopJobs(self.loop, name)

    def cleaning_up(self) -> BaseException | None:
        return cleaning_up()

    def loop_running(self) -> bool:
        return False  # the async API is meant for the loop


class AnyThreadEvent(asyncio.Event):
    """An ``asyncio.Event`` (an election term's ``lost``) that may be set from any thread,
    as ``LoopEvent`` may; made on its loop."""

    def __init__(self) -> None:
        super().__init__()
        self._home = asyncio.get_running_loop()

    def set(self) -> None:
        if _on_loop(self._home):
            super().set()
        else:
            self._home.call_soon_threadsafe(super().set)


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


__all__ = ["AnyThreadEvent", "LoopEvent", "LoopJobs", "LoopRuntime"]
