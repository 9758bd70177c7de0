"""Run the blocking client's code on an asyncio event loop, without a thread per call.

The async client does not re-implement anything: it runs the same code as the blocking client
(engine, locks, patterns, stores) inside a greenlet per call (:func:`spawn`). Wherever that code
would block on I/O or time (a statement, a sleep, a wake-up, a free pooled connection), the
async runtime (:mod:`dblock._runtime`) passes an awaitable to :func:`await_`, which switches to
the task driving the greenlet; the task awaits it on the loop and switches back with the result
or throws the exception in. The code in between is plain Python, so one implementation serves
both APIs, and the async one uses the drivers' own asyncio connections.

Cancellation: a ``CancelledError`` (``task.cancel()``, ``asyncio.timeout``, ``wait_for``) is thrown
into the greenlet at the ``await_`` where it was waiting, so the code's own ``finally`` and
``except`` blocks run, as they would for an error. The cleanup they await is shielded from
further cancellations (a second ``cancel()`` cannot leave a hold or a queue entry behind); the
first ``CancelledError`` propagates once it is done. A release runs shielded from the start
(``spawn(..., shielded=True)``): a cancellation waits for it, then propagates. An awaitable
that swallows a cancellation (``wait_for`` before Python 3.12, a driver raising its own error)
does not lose it: the code gets ``CancelledError`` all the same (Python 3.11+ count a task's
cancellation requests; on 3.10 each step is awaited as a task of its own to see them).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from greenlet import getcurrent, greenlet

T = TypeVar("T")


class _Bridge(greenlet):  # type: ignore[misc]
    """A greenlet running blocking-style code for the task that ``driver`` belongs to."""

    def __init__(self, fn: Callable[..., Any], driver: greenlet) -> None:
        super().__init__(fn, driver)
        self.driver = driver
        # contextvars (the caller's deadline, ...) are the task's own
        self.gr_context = driver.gr_context
        #: the cancellation thrown into the code, whose cleanup now runs (None: not cancelled)
        self.cancelled: BaseException | None = None


def cleaning_up() -> BaseException | None:
    """The cancellation whose cleanup the code on this greenlet is running, if any: an error
    of a statement the cleanup started afterwards is that statement's own (a busy database
    to retry), not a sign that the statement was interrupted."""
    current = getcurrent()
    return current.cancelled if isinstance(current, _Bridge) else None


def bridged() -> bool:
    """True on a greenlet started by :func:`spawn`, where :func:`await_` may be called."""
    return isinstance(getcurrent(), _Bridge)


def await_(awaitable: Awaitable[T]) -> T:
    """Await ``awaitable`` on the task driving this greenlet and return its result."""
    current = getcurrent()
    if not isinstance(current, _Bridge):
        raise RuntimeError("dblock: await_() called outside of a dblock async call")  # noqa: TRY004
    return cast(T, current.driver.switch(awaitable))


async def spawn(fn: Callable[..., T], *args: Any, shielded: bool = False) -> T:
    """Run ``fn(*args)`` to the end, awaiting what it passes to :func:`await_`.

    ``shielded``: a cancellation does not interrupt ``fn`` at all (a release cut short would
    leave its hold for the lease to end); it propagates once ``fn`` is done.
    """
    bridge = _Bridge(fn, getcurrent())
    deferred: list[asyncio.CancelledError] = []
    task = asyncio.current_task()
    requests = _cancelling(task)
    try:
        pending: Any = bridge.switch(*args)
        cancelled: BaseException | None = None
        while not bridge.dead:
            try:
                if cancelled is None and not shielded:
                    value = await (pending if _COUNTS_CANCELS else _watched(pending))
                else:
                    value = await _finish(pending, deferred if shielded else None)
            except BaseException as exc:  # noqa: BLE001 - thrown into the code, which handles it
                exc = _as_thrown(exc, cancelled, None if shielded else (task, requests))
                if cancelled is None and isinstance(exc, asyncio.CancelledError):
                    cancelled = bridge.cancelled = exc
                pending = bridge.throw(exc)
            else:
                lost = None if cancelled or shielded else _lost_cancellation(task, requests)
                if lost is not None:
                    cancelled = bridge.cancelled = lost
                    pending = bridge.throw(lost)
                else:
                    pending = bridge.switch(value)
    except BaseException as exc:
        if deferred:
            raise deferred[0] from exc
        raise
    if deferred:
        raise deferred[0]
    return cast(T, pending)


def _as_thrown(
    exc: BaseException,
    cancelled: BaseException | None,
    watch: tuple[asyncio.Task[Any] | None, int] | None,
) -> BaseException:
    """What to throw into the code for ``exc``, raised by an awaitable it passed."""
    if cancelled is not None:
        if exc.__context__ is None and exc is not cancelled:
            # raised in the cleanup after the cancellation (greenlet's throw does not chain
            # it, as a raise in an except block would): the cleanup's callers must still see
            # the cancellation behind it (see stores/_pool.py's retries)
            exc.__context__ = cancelled
        return exc
    if watch is None or isinstance(exc, asyncio.CancelledError):
        return exc
    return _lost_cancellation(*watch, exc) or exc


#: Task.cancelling() (Python 3.11+) counts a task's cancellation requests, so one that an
#: awaitable swallowed is still seen (_lost_cancellation); before it nothing on the task tells
_COUNTS_CANCELS = hasattr(asyncio.Task, "cancelling")


async def _watched(awaitable: Awaitable[T]) -> T:
    """Await ``awaitable`` as a task of its own, passing it each cancellation of the calling
    task, and raise ``CancelledError`` if it got one, whatever it made of it (a result, a
    driver's own error): on Python 3.10, where a cancellation that ``wait_for`` or a driver
    swallows leaves no trace on the task, this is how the code in the greenlet still learns of
    it. A cancellation that comes after the awaitable finished (its result not yet handed
    over) did not reach it: the result is returned, and the task cancelled again, for its
    next await, as a direct ``await`` would have had it."""
    inner = asyncio.ensure_future(awaitable)
    delivered: asyncio.CancelledError | None = None
    late = False
    while not inner.done():
        # a future only this call resolves: a CancelledError out of it is the caller's
        waiter = asyncio.get_running_loop().create_future()
        wake = functools.partial(_resolve, waiter)
        inner.add_done_callback(wake)
        try:
            await waiter
        except asyncio.CancelledError as exc:
            inner.remove_done_callback(wake)
            if inner.done():
                late = True
            else:
                delivered = delivered or exc
                inner.cancel()
    if delivered is None:
        if late:
            task = asyncio.current_task()
            if task is not None:
                task.cancel()
        return inner.result()
    if inner.cancelled():
        raise delivered
    raise _lost(inner.exception())


def _resolve(waiter: asyncio.Future[None], _done: object) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _lost(error: BaseException | None) -> asyncio.CancelledError:
    """A CancelledError for a cancellation the awaitable did not raise (``error``: what it
    raised instead, kept as the context)."""
    lost = asyncio.CancelledError()
    lost.__context__ = error
    return lost


def _cancelling(task: asyncio.Task[Any] | None) -> int:
    """The task's pending cancellation requests (0 before Python 3.11, which cannot tell)."""
    count = getattr(task, "cancelling", None)
    return int(count()) if count is not None else 0


def _lost_cancellation(
    task: asyncio.Task[Any] | None, requests: int, error: BaseException | None = None
) -> asyncio.CancelledError | None:
    """A CancelledError if the task was cancelled since the call began but the awaitable did
    not raise one: a driver turned it into an error of its own (aiomysql's "Cancelled during
    execution"), or it was swallowed on the way (``wait_for`` before Python 3.12). The code in
    the greenlet must learn of it as a cancellation, or it would retry, or carry on, and the
    cancellation be lost."""
    if _cancelling(task) <= requests:
        return None
    return _lost(error)


async def _finish(
    awaitable: Awaitable[T], cancels: list[asyncio.CancelledError] | None = None
) -> T:
    """Await ``awaitable`` to its end although the task is cancelled meanwhile (the cleanup
    after a cancellation, a shielded call, runs to completion); ``cancels`` collects those
    cancellations."""
    future = asyncio.ensure_future(awaitable)
    while True:
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError as exc:
            if cancels is not None:
                cancels.append(exc)
            if future.done():
                return future.result()
