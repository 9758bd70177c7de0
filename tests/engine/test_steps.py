"""The engine without a store: its steps are driven by hand, and must leave nothing behind on
failure or interruption."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from typing import Any

import pytest

from dblock import _engine
from dblock._contract import Subscription
from dblock._engine import Call, Sleep, Spec, Subscribe, Traits, Unsubscribe, Wait


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


def test_where_a_try_is_dear_a_waiter_probes_once_it_listens_instead_of_sleeping() -> None:
    """A release between the first try and the subscription was not heard: where the store
    would rather be probed than tried (a quorum), the waiter probes right after queueing,
    and tries if the lock is free, instead of sleeping until its fallback poll."""
    spec = Spec("k", 30.0)
    for free in (True, False):
        steps = _engine.Acquisition(_traits(probe=True), spec, "me", blocking=True, timeout=5).run()
        ops = [steps.send(None), steps.send(None), steps.send(_Sub()), steps.send(None)]
        assert [_name(op) for op in ops] == ["acquire_fair", "Subscribe", "enqueue", "probe"]
        op = steps.send((free, 0))
        if free:
            assert (_name(op), op.args) == ("acquire_fair", ("k", "me", 30.0, True))  # type: ignore[union-attr]
            assert isinstance(steps.send(7), Unsubscribe)
            with pytest.raises(StopIteration) as done:
                steps.send(None)
            assert done.value.value.token == 7
        else:  # still held: it sleeps until woken
            assert isinstance(op, Wait)
            assert _name(steps.throw(KeyboardInterrupt())) == "Unsubscribe"
            assert _name(steps.send(None)) == "dequeue"
            with pytest.raises(KeyboardInterrupt):
                steps.send(None)


@pytest.mark.parametrize(("vouched", "lease"), [(None, _engine.QUEUE_TTL), (60.0, 60.0)])
def test_a_handed_over_lock_counts_its_lease_from_the_entry_write(
    vouched: float | None, lease: float
) -> None:
    """A lock handed to a waiter is held without a call of its own, on a lease counted from
    the send of its entry's last write: the lock's ttl capped by the entry's lease, unless
    the store vouches for more (``granted_lease``: ZooKeeper's turn without a write)."""
    steps = _engine.Acquisition(_traits(), Spec("k", 60.0), "me", blocking=True, timeout=5).run()
    sub = _Sub()
    steps.send(None)  # the first try
    steps.send(None)  # busy: subscribe
    steps.send(sub)  # enqueue
    op = steps.send(None)  # the entry made: try again
    op = steps.send(None)  # busy
    while not isinstance(op, Wait):
        op = steps.send(None)
    sub.granted, sub.granted_lease = 9, vouched
    op = steps.send(True)  # woken, holding
    assert isinstance(op, Unsubscribe)
    with pytest.raises(StopIteration) as done:
        steps.send(None)
    hold = done.value.value
    assert (hold.token, hold.lease) == (9, lease)
    assert sub.granted is None and sub.granted_lease is None


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


def _grant_interrupted(error: BaseException, listed: list[Any]) -> list[Call]:
    """Drive an acquire whose first try is interrupted by ``error``; the calls that follow."""
    steps = _engine.Acquisition(
        _traits(fair=False, wakeups=False), Spec("k", 30.0), "me", blocking=True, timeout=5
    ).run()
    op = steps.send(None)
    assert isinstance(op, Call)
    assert op.method == "acquire"
    calls: list[Call] = []
    reply: Any = error
    raised: BaseException | None = None
    try:
        while True:
            op = steps.throw(reply) if isinstance(reply, BaseException) else steps.send(reply)
            assert isinstance(op, Call)
            calls.append(op)
            reply = listed if op.method == "list_holds" else True
    except BaseException as exc:
        raised = exc
    assert raised is error  # the interruption itself comes out, after the cleanup
    return calls


def test_an_interrupted_grant_is_ended_before_the_interruption_propagates() -> None:
    """A cancellation (or Ctrl-C) while the acquiring statement was in flight: the store may
    have granted the hold anyway, so the steps look for this owner's hold and end it."""
    from dblock._types import LockInfo

    ours = LockInfo("k", "me", 7, None, None, "lock")  # type: ignore[arg-type]
    theirs = LockInfo("k", "other", 8, None, None, "lock")  # type: ignore[arg-type]
    calls = _grant_interrupted(asyncio.CancelledError(), [theirs, ours])
    assert [(c.method, c.args) for c in calls] == [
        ("list_holds", ("k",)),
        ("release", ("k", "me", 7)),
    ]


def test_a_failed_grant_is_not_looked_for() -> None:
    """A statement that failed (the store retried it already) is not followed by a search:
    the database cannot be reached, and the error should come at once."""
    from dblock._errors import BackendError

    assert _grant_interrupted(BackendError("down"), []) == []


def test_a_grant_aborted_past_its_deadline_and_then_settled_is_looked_for() -> None:
    """A statement the store aborted past its deadline and whose server session it then
    ended (``_settled``) may have committed first: the steps look for the hold and end it."""
    from dblock._errors import BackendError
    from dblock._types import LockInfo

    ours = LockInfo("k", "me", 7, None, None, "lock")  # type: ignore[arg-type]
    settled = BackendError("did not complete within 5 s")
    settled._settled = True
    calls = _grant_interrupted(settled, [ours])
    assert [(c.method, c.args) for c in calls] == [
        ("list_holds", ("k",)),
        ("release", ("k", "me", 7)),
    ]


def test_a_session_acquire_waits_in_the_store_and_backs_off_only_when_stepped_back() -> None:
    """The server's queue does the waiting (one call with what is left of the timeout); a
    None before the deadline (a lease held the key) sleeps and asks again."""
    spec = Spec("k", float("inf"), "session")
    steps = _engine.acquire_session(spec, "me", 0.05, blocking=True, timeout=10.0)
    op = next(steps)
    assert isinstance(op, Call) and op.method == "acquire_session"
    assert 9.0 < op.args[2] <= 10.0  # the wait is the server's
    assert isinstance(steps.send(None), Sleep)  # stepped back by a lease: back off
    op = steps.send(None)
    assert isinstance(op, Call) and op.method == "acquire_session"
    with pytest.raises(StopIteration) as done:
        steps.send(7)
    hold = done.value.value
    assert hold.token == 7 and hold.live() and hold.renews(False)
    assert hold.spec.renew_call("me", 7, 1.0).method == "check_session"
    assert hold.spec.end_call("me", 7).method == "release_session"


def test_a_session_try_asks_once() -> None:
    spec = Spec("k", float("inf"), "session")
    steps = _engine.acquire_session(spec, "me", 0.05, blocking=False, timeout=None)
    op = next(steps)
    assert isinstance(op, Call) and op.args[2] == 0.0
    with pytest.raises(StopIteration) as done:
        steps.send(None)
    assert done.value.value is None


def test_only_a_waiter_far_back_on_a_broadcast_watch_paces_itself_instead_of_listening() -> None:
    """SQLite's watch wakes at every commit to the file: a waiter far back sleeps by the
    queue's pace instead. Any other subscription, pushed per key or not, is listened to
    wherever the waiter stands (pacing the quorum's waiters lost their wake-ups)."""

    class _KeyPush(_Sub):  # the quorum's: live, per key, not handed to one waiter
        targeted = False

    class _Broadcast(_KeyPush):
        broadcast = True

    spec = Spec("k", 30.0)
    for sub, expected in ((_KeyPush(), Wait), (_Broadcast(), Sleep)):
        steps = _engine.Acquisition(_traits(probe=True), spec, "me", blocking=True, timeout=5).run()
        ops = [steps.send(None), steps.send(None), steps.send(sub), steps.send(None)]
        assert [_name(op) for op in ops] == ["acquire_fair", "Subscribe", "enqueue", "probe"]
        assert isinstance(steps.send((False, 3)), Wait)  # the first wait knows no place
        assert _name(steps.send(False)) == "probe"  # not woken: where does it stand?
        op = steps.send((False, 3))  # held, three waiters ahead
        assert isinstance(op, expected), (type(sub).__name__, op)
        # interrupted: it stops listening and leaves the queue
        assert _name(steps.throw(KeyboardInterrupt())) == "Unsubscribe"
        left = []
        with contextlib.suppress(KeyboardInterrupt):
            while len(left) < 5:
                left.append(_name(steps.send(None)))
        assert len(left) < 5, left


def _drain(steps: Any, ops: list[object]) -> None:
    """Answer every op with None until the steps end (here: by raising)."""
    while True:
        ops.append(steps.send(None))


@pytest.mark.parametrize(
    "error",
    [KeyboardInterrupt(), RuntimeError("release unlocked lock")],
    ids=["interrupted", "interrupted-surfacing-as-RuntimeError"],
)
def test_an_enqueue_cut_short_is_left_before_the_error_propagates(error: BaseException) -> None:
    """The enqueue may have gone through as it was cut short: leaving the queue removes the
    entry. An interruption landing in a condition's wait (a quorum's wait for its members'
    answers) surfaces as ``RuntimeError: release unlocked lock``; it counts as one."""
    steps = _engine.Acquisition(_traits(), Spec("k", 30.0), "me", blocking=True, timeout=5).run()
    ops = [steps.send(None), steps.send(None), steps.send(_Sub())]
    assert [_name(op) for op in ops] == ["acquire_fair", "Subscribe", "enqueue"]
    cleanup = [steps.throw(error)]
    with pytest.raises(type(error)):
        _drain(steps, cleanup)
    assert [_name(op) for op in cleanup] == ["Unsubscribe", "dequeue"]


def test_an_enqueue_that_failed_in_the_store_is_not_left() -> None:
    """A BackendError is the store's report once it retried the statement: the database cannot
    be reached, so no dequeue is sent after it (the entry's own lease ends any)."""
    from dblock._errors import BackendError

    steps = _engine.Acquisition(_traits(), Spec("k", 30.0), "me", blocking=True, timeout=5).run()
    steps.send(None)
    steps.send(None)
    steps.send(_Sub())  # enqueue
    cleanup = [steps.throw(BackendError("down"))]
    with pytest.raises(BackendError):
        _drain(steps, cleanup)
    assert [_name(op) for op in cleanup] == ["Unsubscribe"]


def test_a_grant_cut_short_by_an_interruption_that_surfaced_as_another_error_is_ended() -> None:
    """Ctrl-C landing in a condition's wait surfaces as ``RuntimeError: release unlocked
    lock``: the store may have granted the hold, so it is looked for and ended."""
    from dblock._types import LockInfo

    ours = LockInfo("k", "me", 7, None, None, "lock")  # type: ignore[arg-type]
    calls = _grant_interrupted(RuntimeError("release unlocked lock"), [ours])
    assert [(c.method, c.args) for c in calls] == [
        ("list_holds", ("k",)),
        ("release", ("k", "me", 7)),
    ]


class _Joiner:
    """A store that joins the queue in the acquiring statement (QueueJoin) whenever asked."""

    def joining(self) -> bool:
        return True


@pytest.mark.parametrize("joins", [False, True], ids=["try", "try-or-join"])
def test_steps_closed_in_a_grant_s_flight_end_without_a_step(joins: bool) -> None:
    """Steps abandoned while their acquiring statement was in flight (the driver left by an
    exception that was not thrown into them: a signal handler's between two of its lines) are
    closed by the garbage collector: no cleanup step may follow (it would be ignored, and
    Python prints "generator ignored GeneratorExit" with a traceback, which `dblock run`
    showed on SIGTERM)."""
    traits = _traits()
    if joins:
        traits = dataclasses.replace(traits, joiner=_Joiner())  # type: ignore[arg-type]
    steps = _engine.Acquisition(traits, Spec("k", 30.0), "me", blocking=True, timeout=5).run()
    op = steps.send(None)
    if joins:  # it listens first, then tries and joins the queue in one statement
        assert isinstance(op, Subscribe)
        op = steps.send(_Sub())
    assert _name(op) == ("acquire_or_enqueue" if joins else "acquire_fair")
    steps.close()  # raised RuntimeError: generator ignored GeneratorExit


def test_steps_closed_while_waiting_end_without_a_step() -> None:
    """The same, for steps abandoned while their waiter waits (queued and listening)."""
    steps = _engine.Acquisition(_traits(), Spec("k", 30.0), "me", blocking=True, timeout=5).run()
    assert _name(steps.send(None)) == "acquire_fair"
    assert isinstance(steps.send(None), Subscribe)  # busy: listen
    assert _name(steps.send(_Sub())) == "enqueue"
    assert _name(steps.send(None)) == "acquire_fair"
    assert isinstance(steps.send(None), Wait)  # still busy
    steps.close()
