"""Two real workers run the same call at once: one runs it under the lock, the other skips,
retries or waits as the task says; a once-task succeeds once across duplicates and runs again
after a failure. Tokens come from the store and strictly increase."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from celery.result import AsyncResult

import dblock
from dblock.contrib.celery import skipped

from . import tasks
from .conftest import Workers

RESULT_SECONDS = 30


def _run() -> str:
    return uuid.uuid4().hex[:12]


def _events(run: str) -> list[list[Any]]:
    return [json.loads(e) for e in tasks.records.lrange(tasks.events_key(run), 0, -1)]


def _wait_for(what: str, condition: Any) -> None:
    deadline = time.monotonic() + RESULT_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"waited {RESULT_SECONDS} s for {what}")
        time.sleep(0.05)


def _started(run: str, count: int = 1) -> None:
    _wait_for(f"{count} start(s) of run {run}", lambda: _starts(run) >= count)


def _starts(run: str) -> int:
    return sum(1 for e in _events(run) if e[0] == "start")


def _open_gate(run: str, times: int = 1) -> None:
    tasks.records.rpush(tasks.gate_key(run), *["go"] * times)


def _send(task: Any, workers: Workers, worker: int, *args: Any) -> AsyncResult:
    return task.apply_async(args, queue=workers.queues[worker])


def _in_turn(run: str) -> list[int]:
    """The tokens of the run's calls, checking each started after the one before ended."""
    events = _events(run)
    kinds = [e[0] for e in events]
    assert kinds == ["start", "end"] * (len(kinds) // 2), events
    tokens = [e[2] for e in events if e[0] == "start"]
    assert tokens == sorted(set(tokens)), f"tokens must strictly increase: {events}"
    return tokens


def test_a_call_that_finds_the_key_held_skips(workers: Workers) -> None:
    run = _run()
    first = _send(tasks.hold_or_skip, workers, 0, run, "sku-42")
    _started(run)
    second = _send(tasks.hold_or_skip, workers, 1, run, "sku-42")
    marker = second.get(timeout=RESULT_SECONDS)
    assert skipped(marker)
    assert marker["reason"] == "busy"
    assert marker["key"].startswith("celery:tests.integrations.celery.tasks.hold_or_skip:")
    other = _send(tasks.hold_or_skip, workers, 1, run, "sku-43")  # other arguments, other key
    _started(run, 2)
    _open_gate(run, 2)
    assert not skipped(other.get(timeout=RESULT_SECONDS))
    token = first.get(timeout=RESULT_SECONDS)
    third = _send(tasks.hold_or_skip, workers, 1, run, "sku-42")  # free again: it runs
    _open_gate(run)
    assert third.get(timeout=RESULT_SECONDS) > token
    assert [e[1] for e in _events(run) if e[0] == "start"] == ["sku-42", "sku-43", "sku-42"]


def test_two_threads_of_one_worker_contend_like_two_workers(workers: Workers) -> None:
    run = _run()
    first = _send(tasks.hold_or_skip, workers, 0, run, "sku-42")
    _started(run)
    second = _send(tasks.hold_or_skip, workers, 0, run, "sku-42")  # the worker's other thread
    assert second.get(timeout=RESULT_SECONDS)["reason"] == "busy"
    _open_gate(run)
    assert isinstance(first.get(timeout=RESULT_SECONDS), int)
    assert _starts(run) == 1


def _retrying(workers: Workers, run: str, second: AsyncResult) -> bool:
    return bool(second.state == "RETRY")


def _waiting(workers: Workers, run: str, second: AsyncResult) -> bool:
    lines = workers.logs[1].read_text().splitlines()
    return any(run in line and "waiting for it" in line for line in lines)


@pytest.mark.parametrize(
    ("task", "holding_back"),
    [(tasks.hold_or_retry, _retrying), (tasks.hold_or_wait, _waiting)],
    ids=["retry", "wait"],
)
def test_a_call_that_finds_the_key_held_runs_after_it_is_free(
    workers: Workers, task: Any, holding_back: Any
) -> None:
    run = _run()
    first = _send(task, workers, 0, run, "sku-42")
    _started(run)
    second = _send(task, workers, 1, run, "sku-42")
    _wait_for("the second call to retry or wait", lambda: holding_back(workers, run, second))
    assert _starts(run) == 1
    _open_gate(run, 2)
    assert second.get(timeout=RESULT_SECONDS) > first.get(timeout=RESULT_SECONDS)
    assert len(_in_turn(run)) == 2


def test_a_wait_that_times_out_fails_the_call_without_running_it(workers: Workers) -> None:
    run = _run()
    first = _send(tasks.hold_or_give_up, workers, 0, run, "a")
    _started(run)
    second = _send(tasks.hold_or_give_up, workers, 1, run, "b")  # same key: "short:{run}"
    with pytest.raises(Exception, match=f"short:{run}") as failure:
        second.get(timeout=RESULT_SECONDS)
    assert type(failure.value).__name__ == "LockTimeout"
    _open_gate(run)
    assert isinstance(first.get(timeout=RESULT_SECONDS), int)
    assert _starts(run) == 1


def test_a_once_task_succeeds_once_across_duplicates(workers: Workers) -> None:
    run = _run()
    key = tasks.pay_once.dblock_key_for(run, "order-7")
    assert key == f"payout:{run}:order-7"
    first = _send(tasks.pay_once, workers, 0, run, "order-7")
    _started(run)
    duplicate = _send(tasks.pay_once, workers, 1, run, "order-7")
    assert duplicate.get(timeout=RESULT_SECONDS) == {
        "dblock": "skipped",
        "key": key,
        "reason": "in_progress",
    }
    _open_gate(run)
    assert isinstance(first.get(timeout=RESULT_SECONDS), int)
    for worker in (0, 1):
        late = _send(tasks.pay_once, workers, worker, run, "order-7")
        assert late.get(timeout=RESULT_SECONDS)["reason"] == "done"
    assert _starts(run) == 1
    with dblock.connect(workers.url, table=workers.table) as client:
        assert client.state(key) == "succeeded"


def test_a_once_task_runs_again_after_a_failure(workers: Workers) -> None:
    run = _run()
    key = f"payout:{run}:order-8"
    tasks.records.set(tasks.fail_key(run), 1)
    failed = _send(tasks.pay_once, workers, 0, run, "order-8")
    with pytest.raises(RuntimeError, match="failed as asked"):
        failed.get(timeout=RESULT_SECONDS)
    with dblock.connect(workers.url, table=workers.table) as client:
        assert client.state(key) == "failed"
        _open_gate(run)
        again = _send(tasks.pay_once, workers, 1, run, "order-8")
        token = again.get(timeout=RESULT_SECONDS)
        assert client.state(key) == "succeeded"
    done = _send(tasks.pay_once, workers, 0, run, "order-8")
    assert done.get(timeout=RESULT_SECONDS)["reason"] == "done"
    tokens = [e[2] for e in _events(run) if e[0] == "start"]
    assert tokens == [tokens[0], token]
    assert token > tokens[0]


def test_a_once_duplicate_that_retries_finds_the_run_done(workers: Workers) -> None:
    run = _run()
    first = _send(tasks.refund_once, workers, 0, run, "order-9")
    _started(run)
    duplicate = _send(tasks.refund_once, workers, 1, run, "order-9")
    _wait_for("the duplicate to retry", lambda: duplicate.state == "RETRY")
    _open_gate(run)
    assert isinstance(first.get(timeout=RESULT_SECONDS), int)
    assert duplicate.get(timeout=RESULT_SECONDS) == {
        "dblock": "skipped",
        "key": f"refund:{run}:order-9",
        "reason": "done",
    }
    assert _starts(run) == 1
