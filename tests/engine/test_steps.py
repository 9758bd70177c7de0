"""The engine without a store: its steps are driven by hand, by the blocking driver and by the
asyncio driver, which must see the same operations and leave nothing behind on failure."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dblock import _engine
from dblock._adrive import arun
from dblock._drive import run
from dblock._engine import Call, Sleep, Spec, Subscribe, Traits, Unsubscribe, Wait
from dblock.backends._contract import Subscription, Wakeups


def _traits(*, fair: bool = True, wakeups: bool = True, probe: bool = False) -> Traits:
    return Traits(
        fair=fair,
        probe_before_try=probe,
        wakeups=wakeups,
        poll_cap=0.05,
        joiner=None,
    )


class _Sub(Subscription):
    live = True
    targeted = True

    def wait(self, timeout: float) -> bool:
        return False

    def close(self) -> None:
        pass


def _name(op: object) -> str:
    return op.method if isinstance(op, Call) else type(op).__name__


def test_a_waiter_listens_before_it_tries_again_and_takes_the_lock_in_turn() -> None:
    spec = Spec("k", 30.0)
    steps = _engine.Acquisition(_traits(), spec, "me", blocking=True, timeout=5).run()
    op = steps.send(None)
    assert (_name(op), op.args) == ("acquire_fair", ("k", "me", 30.0, False))  # type: ignore[union-attr]
    op = steps.send(None)  # busy
    assert isinstance(op, Subscribe) and (op.key, op.owner, op.queue) == ("k", "me", "lock")
    op = steps.send(_Sub())
    # a live subscription: the queue entry carries the lease a releaser may hand over
    assert (_name(op), op.args) == ("enqueue", ("k", "me", "lock", _engine.QUEUE_TTL, 30.0))  # type: ignore[union-attr]
    op = steps.send(None)
    # a release between the first try and the subscription was not heard: try again now
    assert (_name(op), op.args) == ("acquire_fair", ("k", "me", 30.0, True))  # type: ignore[union-attr]
    op = steps.send(7)
    assert isinstance(op, Unsubscribe)
    with pytest.raises(StopIteration) as done:
        steps.send(None)
    hold = done.value.value
    assert (hold.token, hold.owner, hold.key) == (7, "me", "k")


def test_a_failure_while_waiting_leaves_the_queue_before_it_propagates() -> None:
    steps = _engine.Acquisition(_traits(), Spec("k", 30.0), "me", blocking=True, timeout=5).run()
    seen = [steps.send(None), steps.send(None), steps.send(_Sub()), steps.send(None)]
    op = steps.send(None)  # the second try: busy again
    while not isinstance(op, Wait):
        seen.append(op)
        op = steps.send(None)
    cleanup = [steps.throw(KeyboardInterrupt())]  # e.g. Ctrl-C, or a task's cancellation

    def drain() -> None:
        while True:
            cleanup.append(steps.send(None))

    with pytest.raises(KeyboardInterrupt):
        drain()
    assert [_name(op) for op in cleanup] == ["Unsubscribe", "dequeue"]


def test_without_wakeups_a_waiter_sleeps_and_without_a_queue_it_only_tries() -> None:
    traits = _traits(fair=False, wakeups=False)
    steps = _engine.Acquisition(traits, Spec("k", 30.0), "me", blocking=True, timeout=5).run()
    ops = [steps.send(None)]
    for _ in range(3):
        ops.append(steps.send(None))
    assert [_name(op) for op in ops] == ["acquire", "Sleep", "acquire", "Sleep"]
    assert all(op.seconds <= 0.05 for op in ops if isinstance(op, Sleep))


class _Store(Wakeups):
    """Two busy tries, then the lock: the same answers for both drivers."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.tries = 0

    def _answer(self, method: str) -> Any:
        self.calls.append(method)
        if method == "acquire_fair":
            self.tries += 1
            return None if self.tries < 3 else 42
        return None

    def __getattr__(self, method: str) -> Any:
        return lambda *args: self._answer(method)

    def subscribe(self, key: str, owner: str, queue: str | None) -> Subscription:
        self.calls.append("subscribe")
        return _Sub()


class _AsyncStore(_Store):
    def __getattr__(self, method: str) -> Any:
        async def call(*args: Any) -> Any:
            return self._answer(method)

        return call

    async def subscribe(self, key: str, owner: str, queue: str | None) -> Any:  # type: ignore[override]
        self.calls.append("subscribe")
        return _AsyncSub()


class _AsyncSub:
    live, targeted, latched, granted = True, True, False, None

    async def wait(self, timeout: float) -> bool:
        await asyncio.sleep(0)
        return False

    async def close(self) -> None:
        pass


def test_the_blocking_and_the_asyncio_driver_run_the_same_steps() -> None:
    def steps() -> Any:
        return _engine.Acquisition(_traits(), Spec("k", 30.0), "me", blocking=True, timeout=5).run()

    sync_store, async_store = _Store(), _AsyncStore()
    hold = run(steps(), sync_store)  # type: ignore[arg-type]
    ahold = asyncio.run(arun(steps(), async_store))
    assert hold.token == ahold.token == 42
    assert sync_store.calls == async_store.calls
    assert sync_store.calls[:3] == ["acquire_fair", "subscribe", "enqueue"]


def test_the_asyncio_driver_cleans_up_a_cancelled_acquire() -> None:
    class Never(_AsyncStore):
        def _answer(self, method: str) -> Any:
            self.calls.append(method)
            return None  # always busy

    async def main(store: Never) -> None:
        steps = _engine.Acquisition(_traits(), Spec("k", 30.0), "me", blocking=True, timeout=None)
        task = asyncio.ensure_future(arun(steps.run(), store))
        while "enqueue" not in store.calls:
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    store = Never()
    asyncio.run(main(store))
    assert store.calls[-1] == "dequeue", store.calls
