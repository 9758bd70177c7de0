"""The asyncio driver: awaits engine steps against a store whose operations are coroutines.

The same steps the blocking driver runs (:mod:`dblock._drive`); a failure or a cancellation
at an ``await`` is thrown into the steps, so their cleanup (leave the queue, stop listening)
is awaited before the error propagates.
"""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

from ._engine import Call, Op, Sleep, Steps, Subscribe, Unsubscribe, Wait

T = TypeVar("T")


async def arun(steps: Steps[T], store: Any) -> T:
    """Run ``steps`` to the end on the running event loop and return its value."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            op = steps.send(value) if error is None else steps.throw(error)
        except StopIteration as stop:
            result: T = stop.value
            return result
        finally:
            error = None
        try:
            value = await _execute(op, store)
        except BaseException as exc:  # noqa: BLE001 - handed to the steps, which re-raise it
            error, value = exc, None


async def _execute(op: Op, store: Any) -> Any:
    if isinstance(op, Call):
        return await getattr(store, op.method)(*op.args)
    if isinstance(op, Wait):
        waiting: Any = op.subscription  # an asyncio store's subscription: wait is a coroutine
        return await waiting.wait(op.timeout)
    if isinstance(op, Subscribe):
        return await store.subscribe(op.key, op.owner, op.queue)
    if isinstance(op, Unsubscribe):
        closing: Any = op.subscription
        await closing.close()
        return None
    if isinstance(op, Sleep):
        await asyncio.sleep(op.seconds)
        return None
    raise TypeError(f"not an engine operation: {op!r}")
