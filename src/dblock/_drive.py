"""The driver: runs engine steps against a store on the calling thread, or for the async
client in its greenlet (where the store's waits await on the event loop)."""

from __future__ import annotations

from typing import Any, TypeVar

from ._contract import Store
from ._engine import Call, Op, Sleep, Steps, Subscribe, Unsubscribe, Wait

T = TypeVar("T")


def run(steps: Steps[T], store: Store) -> T:
    """Run ``steps`` to the end and return its value; an operation's exception is thrown into
    the steps, so their cleanup runs (and may itself do operations) before it propagates."""
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
            value = _execute(op, store)
        except BaseException as exc:  # noqa: BLE001 - handed to the steps, which re-raise it
            error, value = exc, None


def _execute(op: Op, store: Store) -> Any:
    if isinstance(op, Call):
        return getattr(store, op.method)(*op.args)
    if isinstance(op, Wait):
        return op.subscription.wait(op.timeout)
    if isinstance(op, Subscribe):
        # the engine subscribes only where the client's traits say the store wakes waiters
        # (Traits.of asked ``provides`` once): no capability check (nor cast) per wait
        return store.subscribe(op.key, op.owner, op.queue)  # type: ignore[attr-defined]
    if isinstance(op, Unsubscribe):
        op.subscription.close()
        return None
    if isinstance(op, Sleep):
        store.rt.sleep(op.seconds)  # the async client's runtime awaits it on the loop
        return None
    raise TypeError(f"not an engine operation: {op!r}")
