"""Real Celery workers for the tests: two per store (SQLite, PostgreSQL), each consuming its
own queue, so a test decides which worker runs a call. The first runs tasks on two threads of
its process (``--pool=threads``: one client, two holders), the second in two forked children
(``--pool=prefork``, Celery's default: each child opens its dblock client after the fork).
They are stopped, and the broker's keys of this test process deleted, when the module ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("celery")

from tests._servers import POSTGRESQL_URL, drop_tables, require_server, server_url

from . import tasks

ROOT = Path(__file__).resolve().parents[3]
POOLS = (("--pool=threads", "--concurrency=2"), ("--pool=prefork", "--concurrency=2"))
READY_SECONDS = 60  # a worker's start on a busy machine (imports, broker connection)


@dataclass(frozen=True)
class Workers:
    """Two running workers on one lock table: ``queues[0]`` and ``queues[1]`` name them."""

    url: str
    table: str
    queues: tuple[str, str]
    logs: tuple[Path, Path]


@pytest.fixture(scope="module")
def broker() -> Iterator[None]:
    """The broker and Redis, reachable; afterwards this test process's keys are deleted."""
    require_server("redis", tasks.RESULTS)
    if tasks.BROKER.startswith("amqp"):
        with tasks.app.connection_for_write() as connection:
            connection.ensure_connection(max_retries=1)
    yield
    for name in tasks.records.scan_iter(match=tasks.PREFIX + "*", count=1000):
        tasks.records.delete(name)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def workers(
    request: pytest.FixtureRequest, broker: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Workers]:
    store = str(request.param)
    tmp = tmp_path_factory.mktemp(f"celery-{store}")
    url = server_url(store, str(tmp))
    if store != "sqlite":
        require_server(store, url)
    table = "t_celery_" + uuid.uuid4().hex[:12]
    queues = (f"{tasks.PREFIX}{store}-a", f"{tasks.PREFIX}{store}-b")
    env = {
        **os.environ,
        "DBLOCK_CELERY_PREFIX": tasks.PREFIX,
        "DBLOCK_CELERY_URL": url,
        "DBLOCK_CELERY_TABLE": table,
    }
    started: list[subprocess.Popen[bytes]] = []
    logs = (tmp / f"{queues[0]}.log", tmp / f"{queues[1]}.log")
    try:
        for queue, log, pool in zip(queues, logs, POOLS, strict=True):
            started.append(_start_worker(queue, log, env, pool))
        for process, log in zip(started, logs, strict=True):
            _wait_ready(process, log)
        yield Workers(url, table, queues, logs)
    finally:
        _stop(started)
        _delete_queues(queues)
        if store == "postgresql":
            drop_tables(POSTGRESQL_URL, table)


def _start_worker(
    queue: str, log: Path, env: dict[str, str], pool: tuple[str, ...]
) -> subprocess.Popen[bytes]:
    command = [
        sys.executable, "-m", "celery", "-A", "tests.integrations.celery.tasks", "worker",
        "-Q", queue, "-n", f"{queue}@%h", *pool,
        "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel=INFO",
    ]  # fmt: skip
    with log.open("wb") as out:
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def _wait_ready(process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline:
        if " ready." in log.read_text(errors="replace"):
            return
        if process.poll() is not None:
            break
        time.sleep(0.1)
    pytest.fail(f"the Celery worker did not start; its log:\n{log.read_text(errors='replace')}")


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    """Warm shutdown (a running task finishes), then a kill if it takes too long."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=tasks.GATE_SECONDS + 5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _delete_queues(queues: tuple[str, str]) -> None:
    """RabbitMQ keeps a queue after its consumers leave (on Redis its keys go with the rest)."""
    if tasks.BROKER.startswith("amqp"):
        with tasks.app.connection_for_write() as connection:
            for queue in queues:
                connection.default_channel.queue_delete(queue)
