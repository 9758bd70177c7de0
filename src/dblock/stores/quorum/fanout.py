"""The quorum's fan-out under the async client: every member asked at once, each in a
greenlet of its own on the event loop (under the blocking client the quorum uses a thread
pool: ``store.py``). Imported only by an async quorum, so that asyncio loads only there."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from ..._green import await_, spawn
from .rules import TIMED_OUT, Fault

T = TypeVar("T")


def fan_out_on_loop(
    rt: Any,
    jobs: list[Callable[[], T]],
    within: float,
    late: Callable[[int, T], None] | None,
    keep: set[Any],
) -> list[Any]:
    """Run ``jobs`` at once, each in a greenlet of its own (a quorum asking its stores), and
    wait up to ``within`` s; their values in order, a ``Fault`` for each failed or unfinished
    one. Unfinished ones go on: ``late`` gets their values (run in a greenlet of its own);
    ``keep`` holds their tasks meanwhile."""
    loop: asyncio.AbstractEventLoop = rt.loop
    tasks = [loop.create_task(spawn(job)) for job in jobs]
    for task in tasks:
        task.add_done_callback(_retrieved)
    if tasks:
        try:
            await_(asyncio.wait(tasks, timeout=within))
        except BaseException:
            # interrupted (a cancellation): the calls in flight finish first, so the caller's
            # cleanup sees what they did (this wait is shielded: dblock._green)
            await_(asyncio.wait(tasks, timeout=within))
            raise
    out: list[Any] = []
    for i, task in enumerate(tasks):
        if not task.done():
            out.append(TIMED_OUT)
            if late is not None:
                keep.add(task)
                task.add_done_callback(_later(i, late, keep))
        elif task.cancelled():
            out.append(Fault("cancelled"))
        elif task.exception() is not None:
            out.append(Fault(str(task.exception())))
        else:
            out.append(task.result())
    return out


def _retrieved(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # a failure is a lost vote, already logged: not "never retrieved"


def _later(
    i: int, late: Callable[[int, T], None], keep: set[Any]
) -> Callable[[asyncio.Task[Any]], None]:
    def done(task: asyncio.Task[Any]) -> None:
        keep.discard(task)
        if task.cancelled() or task.exception() is not None:
            return
        value = task.result()
        follow = task.get_loop().create_task(spawn(late, i, value))
        keep.add(follow)
        follow.add_done_callback(keep.discard)
        follow.add_done_callback(_retrieved)

    return done
