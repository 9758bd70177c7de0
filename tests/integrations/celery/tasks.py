"""The Celery app the test workers run, and the tests send to.

Every Redis key the app writes (broker queues, results, the tasks' own records) and every
queue's name starts with ``PREFIX``, random per test process unless DBLOCK_CELERY_PREFIX is
set (the workers get the test process's). The worker learns its dblock URL and table from
DBLOCK_CELERY_URL and DBLOCK_CELERY_TABLE.

Each task records ``start`` (with its fencing token and process id) on the run's events list,
waits for one entry on the run's gate list, records ``end`` and returns its token: the test
holds a call inside its lock for as long as it wants.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

import redis
from celery import Celery

from dblock.contrib.celery import LockedTask

#: the broker: Redis by default, or RabbitMQ (amqp://guest:guest@127.0.0.1:5672//) if given
BROKER = os.environ.get("DBLOCK_TEST_CELERY_BROKER", "redis://127.0.0.1:6379/9")
#: results and the tasks' records: always Redis
RESULTS = os.environ.get("DBLOCK_TEST_CELERY_RESULTS", "redis://127.0.0.1:6379/9")
PREFIX = os.environ.get("DBLOCK_CELERY_PREFIX") or f"dblock_celery_{uuid.uuid4().hex[:12]}:"
GATE_SECONDS = 30  # a body left waiting ends by itself, so a worker always stops

app = Celery("dblock_celery_test", broker=BROKER, backend=RESULTS)
app.conf.update(
    broker_transport_options={"global_keyprefix": PREFIX},
    result_backend_transport_options={"global_keyprefix": PREFIX},
    broker_connection_retry_on_startup=True,
    worker_enable_remote_control=False,
    worker_prefetch_multiplier=1,
    task_track_started=True,
    result_expires=600,
    dblock_url=os.environ.get("DBLOCK_CELERY_URL"),
    dblock_table=os.environ.get("DBLOCK_CELERY_TABLE"),
)
records = redis.Redis.from_url(RESULTS, decode_responses=True)


def events_key(run: str) -> str:
    return f"{PREFIX}events:{run}"


def gate_key(run: str) -> str:
    return f"{PREFIX}gate:{run}"


def fail_key(run: str) -> str:
    return f"{PREFIX}fail:{run}"


def _record(run: str, *event: Any) -> None:
    records.rpush(events_key(run), json.dumps([*event, os.getpid()]))


def _hold(run: str, item: str, token: int | None) -> int | None:
    _record(run, "start", item, token)
    if records.delete(fail_key(run)):  # the test asked this run to fail, once
        _record(run, "failed", item, token)
        raise RuntimeError(f"run {run} failed as asked")
    records.blpop([gate_key(run)], timeout=GATE_SECONDS)
    _record(run, "end", item, token)
    return token


@app.task(base=LockedTask, dblock_busy="skip", dblock_ttl=30)
def hold_or_skip(run: str, item: str, dblock_token: int | None = None) -> int | None:
    return _hold(run, item, dblock_token)


@app.task(base=LockedTask, dblock_busy="retry", dblock_countdown=0.2, max_retries=None)
def hold_or_retry(run: str, item: str, dblock_token: int | None = None) -> int | None:
    return _hold(run, item, dblock_token)


@app.task(base=LockedTask, dblock_busy="wait", dblock_timeout=GATE_SECONDS * 2)
def hold_or_wait(run: str, item: str, dblock_token: int | None = None) -> int | None:
    return _hold(run, item, dblock_token)


@app.task(base=LockedTask, dblock_busy="wait", dblock_timeout=0.5, dblock_key="short:{run}")
def hold_or_give_up(run: str, item: str, dblock_token: int | None = None) -> int | None:
    return _hold(run, item, dblock_token)


@app.task(base=LockedTask, bind=True, dblock_once=True, dblock_key="payout:{run}:{item}")
def pay_once(self: Any, run: str, item: str, dblock_token: int | None = None) -> int | None:
    assert self.request.id  # a bound task gets its request as usual
    return _hold(run, item, dblock_token)


@app.task(
    base=LockedTask,
    dblock_once=True,
    dblock_busy="retry",
    dblock_countdown=0.2,
    max_retries=None,
    dblock_key="refund:{run}:{item}",
)
def refund_once(run: str, item: str, dblock_token: int | None = None) -> int | None:
    return _hold(run, item, dblock_token)
