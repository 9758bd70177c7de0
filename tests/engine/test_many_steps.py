"""lock_many's engine steps (``dblock._engine.many``) driven by hand, without a store: the order
of a waiter's operations, and what it leaves behind when interrupted or granted too late."""

from __future__ import annotations

from typing import Any

import pytest

from dblock import LockInfo
from dblock._contract import FairManyKeys, Subscription
from dblock._engine import QUEUE_TTL, Call, Traits, Unsubscribe, Wait
from dblock._engine import attempt as attempt_module
from dblock._engine import many as many_module
from dblock._engine.many import ManyAcquisition, ManySpec

KEYS = ("a", "b", "c")


class _FairStore(FairManyKeys):
    """Declares FairManyKeys; the steps never call it (the test answers for it)."""

    withheld: frozenset[type] = frozenset()

    def __getattribute__(self, name: str) -> Any:
        if name in ("withheld", "__class__"):
            return object.__getattribute__(self, name)
        raise AssertionError(f"the steps called the store directly: {name}")


for _name in list(FairManyKeys.__abstractmethods__):
    setattr(_FairStore, _name, None)
_FairStore.__abstractmethods__ = frozenset()


class _Sub(Subscription):
    live = True

    def wait(self, timeout: float) -> bool:
        return False

    def close(self) -> None:
        pass


def _traits() -> Traits:
    return Traits(fair=True, probe_before_try=False, wakeups=True, poll_cap=0.05, joiner=None)


def _steps(timeout: float = 5.0, blocking: bool = True) -> Any:
    spec = ManySpec.of(KEYS, 30.0)
    return ManyAcquisition(
        _FairStore(), _traits(), spec, "me", blocking=blocking, timeout=timeout
    ).run()


def _call(op: object) -> tuple[str, tuple[Any, ...]]:
    assert isinstance(op, Call), op
    return op.method, op.args


def _to_the_wait(steps: Any) -> Any:
    """Drive a waiter from its first try to its first wait; the ops on the way."""
    assert _call(steps.send(None)) == ("acquire_many", (KEYS, "me", 30.0))
    assert _call(steps.send(None)) == ("subscribe_many", (KEYS, "me"))  # busy: listen
    assert _call(steps.send(_Sub())) == ("enqueue_many", (KEYS, "me", QUEUE_TTL))
    # a release between the first try and the entries told nobody: try in turn at once
    assert _call(steps.send(None)) == ("acquire_many_in_turn", (KEYS, "me", 30.0))
    op = steps.send(None)  # still busy: wait for a release of any key
    assert isinstance(op, Wait)
    return op


def test_a_waiter_listens_queues_on_every_key_then_takes_them_in_turn() -> None:
    steps = _steps()
    _to_the_wait(steps)
    assert _call(steps.send(True)) == ("acquire_many_in_turn", (KEYS, "me", 30.0))
    tokens = {"a": 3, "b": 9, "c": 1}
    assert isinstance(steps.send(tokens), Unsubscribe)
    with pytest.raises(StopIteration) as done:
        steps.send(None)  # the grant removed the entries: no dequeue
    hold = done.value.value
    assert hold.spec.tokens == tokens and hold.owner == "me"


def test_a_waiter_given_up_or_cancelled_leaves_every_queue() -> None:
    steps = _steps()
    _to_the_wait(steps)
    op = steps.throw(KeyboardInterrupt())
    assert isinstance(op, Unsubscribe)
    assert _call(steps.send(None)) == ("dequeue_many", (KEYS, "me"))
    with pytest.raises(KeyboardInterrupt):
        steps.send(None)


def test_a_try_interrupted_in_flight_ends_whatever_it_was_granted() -> None:
    """The try may have been granted as it was interrupted: each key's holder is looked up,
    and this owner's holds are ended in one step, before the queues are left."""
    steps = _steps()
    _to_the_wait(steps)
    assert _call(steps.send(True))[0] == "acquire_many_in_turn"
    looked = [steps.throw(KeyboardInterrupt())]
    mine = {"a": 4, "b": 10, "c": 2}
    for key in KEYS:
        assert _call(looked[-1]) == ("info", (key,))
        looked.append(steps.send(LockInfo(key, "me", mine[key], None, None, "lock")))  # type: ignore[arg-type]
    assert _call(looked[-1]) == ("release_many", (mine, "me"))
    assert isinstance(steps.send(True), Unsubscribe)
    assert _call(steps.send(None)) == ("dequeue_many", (KEYS, "me"))
    with pytest.raises(KeyboardInterrupt):
        steps.send(None)


def test_a_grant_back_after_its_lease_is_renewed_or_ended_never_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The grant's reply took longer than the ttl: it is renewed to confirm it; the renewal
    finds it gone, so it is ended, and the waiter goes on (queued afresh)."""
    now = [1000.0]

    class _Clock:
        @staticmethod
        def monotonic() -> float:
            return now[0]

    monkeypatch.setattr(many_module, "time", _Clock)
    monkeypatch.setattr(attempt_module, "time", _Clock)  # where a late grant is checked
    steps = _steps(timeout=100)
    assert _call(steps.send(None))[0] == "acquire_many"
    now[0] += 31.0  # the reply came back past the 30 s lease
    tokens = {"a": 1, "b": 1, "c": 1}
    assert _call(steps.send(tokens)) == ("renew_many", (tokens, "me", 30.0))
    assert _call(steps.send(False)) == ("release_many", (tokens, "me"))  # gone: ended
    # not reported held: it listens and queues, as after a busy try
    assert _call(steps.send(True)) == ("subscribe_many", (KEYS, "me"))


def test_a_try_without_waiting_asks_once_and_leaves_nothing() -> None:
    steps = _steps(blocking=False)
    assert _call(steps.send(None))[0] == "acquire_many"
    with pytest.raises(StopIteration) as done:
        steps.send(None)
    assert done.value.value is None


def test_steps_closed_while_waiting_end_without_a_step() -> None:
    """Steps abandoned at a wait (the driver left by an exception not thrown into them) are
    closed by the garbage collector: no cleanup step may follow (see test_steps.py)."""
    steps = _steps()
    _to_the_wait(steps)
    steps.close()  # raised RuntimeError: generator ignored GeneratorExit
