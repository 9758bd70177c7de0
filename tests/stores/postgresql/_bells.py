"""What the PostgreSQL doorbell tests share: who sleeps at a bell, and a holder that keeps one."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import dblock
from dblock.stores.postgresql.store import PostgresStore
from tests import _worker
from tests._servers import POSTGRESQL_URL, raw_connect
from tests._waiting import until


def in_pg_locks(backend: PostgresStore, key: str) -> tuple[str, tuple[int, int]]:
    """SQL conditions on ``pg_locks`` that pick ``key``'s doorbell, and their parameters."""
    c, o = backend._bells.lock_of(key)
    where = (
        "locktype = 'advisory' AND classid = %s::bigint::oid AND objid = %s::bigint::oid "
        "AND objsubid = 2 "
        "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    )
    return where, (c & 0xFFFFFFFF, o & 0xFFFFFFFF)


def at_the_bell(inspect: Any, backend: PostgresStore, key: str) -> Callable[[], int]:
    """A count of the backends asleep in ``key``'s doorbell (other tests' waiters share the
    server)."""
    where, params = in_pg_locks(backend, key)

    def count() -> int:
        sql = f"SELECT count(*) FROM pg_locks WHERE {where} AND NOT granted"
        row = inspect.execute(sql, params).fetchone()
        return int(row[0])

    return count


@contextmanager
def waiters_in_line(
    pg_store: tuple[dblock.Client, PostgresStore, str], waiters: int, *, at_bell: bool
) -> Iterator[tuple[dblock.Lock, list[subprocess.Popen[str]], Any]]:
    """A fresh key held without waiting and ``waiters`` workers queued behind it in order
    (start_in_line): (the holder's lock, the workers, a connection to inspect the server),
    the workers killed afterwards. Its ``key`` is the holder's."""
    client, backend, table = pg_store
    key = "k-" + uuid.uuid4().hex
    inspect = raw_connect(POSTGRESQL_URL)
    holder = client.lock(key, ttl=60)
    assert holder.acquire(blocking=False)
    workers: list[subprocess.Popen[str]] = []
    try:
        workers = start_in_line(backend, table, key, waiters, inspect, at_bell=at_bell)
        yield holder, workers, inspect
    finally:
        finish(*workers)
        inspect.close()


def start_in_line(
    backend: PostgresStore, table: str, key: str, waiters: int, inspect: Any, *, at_bell: bool
) -> list[subprocess.Popen[str]]:
    """Start ``waiters`` "turn" workers for ``key`` one at a time, each once the one before
    has queued (and, ``at_bell``, sleeps at the bell: the first of them has it): their order
    in the queue and at the bell is the start order. Each holds the lock 0.05 s, then keeps
    its client 30 s."""
    workers: list[subprocess.Popen[str]] = []
    asleep = at_the_bell(inspect, backend, key)
    try:
        for idx in range(waiters):
            w = _worker.start("turn", POSTGRESQL_URL, table, key, str(idx), "0.05", "30")
            workers.append(w)
            assert w.stdout is not None
            assert w.stdout.readline().strip() == "queued"
            until(lambda n=idx + 1: len(backend.waiters(key)) == n, f"{idx + 1} waiters queue", 30)
            if at_bell:
                until(lambda n=idx: asleep() >= n, f"{idx} at the bell", 30)
    except BaseException:
        finish(*workers)
        raise
    return workers


def turns(workers: list[subprocess.Popen[str]], timeout: float = 30) -> list[tuple[int, ...]]:
    """Each worker's (idx, token, acquired, released), in the order of their tokens."""
    done = []
    for w in workers:
        got = line(w, timeout)
        assert got is not None, "a waiter never got the lock"
        idx, token, acquired, released = got.split()
        done.append((int(idx), int(token), float(acquired), float(released)))
    return sorted(done, key=lambda t: t[1])


def line(proc: subprocess.Popen[str], timeout: float) -> str | None:
    """The next line the worker prints within ``timeout`` s, or None."""
    import select

    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline() if ready else None


@contextmanager
def bell_holder_and_one_behind(
    pg_store: tuple[dblock.Client, PostgresStore, str], key: str, ttl: str
) -> Iterator[tuple[subprocess.Popen[str], dict[str, Any], subprocess.Popen[str], Any]]:
    """A worker holding ``key`` (lease ``ttl`` s) that waited for it, so keeps its bell, and a
    second waiting at that bell: (holder, its hold as it printed it, the one behind, a
    connection to inspect the server). Both are killed afterwards."""
    client, backend, table = pg_store
    first = client.lock(key, ttl=60)
    assert first.acquire(blocking=False)
    holder = _worker.start("hold", POSTGRESQL_URL, table, key, ttl, stdin=subprocess.PIPE)
    behind = None
    inspect = raw_connect(POSTGRESQL_URL)
    try:
        until(lambda: len(backend.waiters(key)) == 1, "the first waiter queues", 30)
        first.release()  # the waiter at the bell takes it, and keeps the bell
        held = json.loads(line(holder, 30) or "{}")
        assert held, "the waiter never got the lock"
        behind = _worker.start("hold", POSTGRESQL_URL, table, key, "30", stdin=subprocess.PIPE)
        asleep = at_the_bell(inspect, backend, key)
        until(lambda: asleep() == 1, "the second waits at the kept bell", 30)
        yield holder, held, behind, inspect
    finally:
        inspect.close()
        finish(holder, *([behind] if behind is not None else []))


def finish(*procs: subprocess.Popen[str]) -> None:
    """Kill what still runs (stopped or not), reap, and close the pipes."""
    import signal

    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
        proc.communicate(timeout=10)
