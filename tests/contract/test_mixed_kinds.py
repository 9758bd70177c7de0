"""Issue 29, point 13: kinds of holds on one key exclude each other, symmetrically.

Read holds share with read holds and semaphore permits with permits; every other pair of kinds
excludes, whichever came first. Every backend.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import dblock
from tests.providers import Provider

KINDS = ["lock", "read", "write", "semaphore", "once"]
SHARING = {("read", "read"), ("semaphore", "semaphore")}


def _hold(client: dblock.Client, key: str, kind: str) -> object:
    """A hold of ``kind`` on ``key`` (not yet taken), with acquire/release semantics."""
    if kind == "lock":
        return client.lock(key, ttl=30)
    if kind == "read":
        return client.rwlock(key, ttl=30).read_lock()
    if kind == "write":
        return client.rwlock(key, ttl=30).write_lock()
    if kind == "semaphore":
        return client.semaphore(key, 2, ttl=30)
    return client.once(key, ttl=30)


def _try(client: dblock.Client, key: str, kind: str) -> Callable[[], None] | None:
    """Try once to take ``kind``; its release if taken, else None."""
    hold = _hold(client, key, kind)
    if kind == "once":
        try:
            hold.__enter__()  # type: ignore[attr-defined]
        except (dblock.InProgress, dblock.AlreadyDone):
            return None
        return lambda: hold.__exit__(None, None, None)  # type: ignore[attr-defined]
    if not hold.acquire(blocking=False):  # type: ignore[attr-defined]
        return None
    return hold.release  # type: ignore[attr-defined,no-any-return]


@pytest.mark.needs("SharedHolds", "OnceRecords")
@pytest.mark.parametrize("first", KINDS)
@pytest.mark.parametrize("second", KINDS)
def test_every_pair_of_kinds(
    provider: Provider, table: str, key: str, first: str, second: str
) -> None:
    with provider.connect(table=table) as a, provider.connect(table=table) as b:
        if first == "once" and second == "once":
            pytest.skip("once against once is the once contract (test_patterns)")
        release_first = _try(a, key, first)
        assert release_first is not None
        release_second = _try(b, key, second)
        shares = (first, second) in SHARING
        assert (release_second is not None) == shares, f"{second} while {first} holds"
        if release_second is not None:
            release_second()
        release_first()
        # the key is free again for the second kind: nothing stale blocks it
        key2 = key if second != "once" and first != "once" else key + ":again"
        release = _try(b, key2, second)
        assert release is not None, f"{second} after {first} was released"
        release()


@pytest.mark.needs("SharedHolds")
def test_a_plain_lock_waits_for_readers_and_gets_in_when_they_leave(
    client: dblock.Client, key: str
) -> None:
    read = client.rwlock(key, ttl=30).read_lock()
    assert read.acquire()
    lock = client.lock(key, ttl=30)
    assert not lock.acquire(timeout=0.3)
    read.release()
    assert lock.acquire(timeout=10)
    info = client.info(key)
    assert info is not None and info.kind == "lock" and info.token == lock.token
    # and readers wait for the plain lock (as they always did)
    assert not client.rwlock(key).read_lock().acquire(blocking=False)
    lock.release()


@pytest.mark.needs("SharedHolds")
def test_a_waiting_plain_lock_is_not_starved_by_new_readers(
    client: dblock.Client, key: str
) -> None:
    first = client.rwlock(key, ttl=30).read_lock()
    assert first.acquire()
    lock = client.lock(key, ttl=30)
    got = threading.Event()

    def wait_for_it() -> None:
        if lock.acquire(timeout=30):
            got.set()
            lock.release()

    waiter = threading.Thread(target=wait_for_it)
    waiter.start()
    try:
        time.sleep(1.0)  # let it try and queue
        assert not got.is_set()  # a reader holds the key
        # while the plain lock waits, a newcomer reader does not get in ahead of it
        newcomer = client.rwlock(key, ttl=30).read_lock()
        assert not newcomer.acquire(blocking=False)
        first.release()
        waiter.join(35)
        assert got.is_set()
    finally:
        waiter.join(35)


_WORKER = textwrap.dedent(
    """
    import sys, time, dblock
    url, table, key, kind, n, log = sys.argv[1:7]
    with dblock.connect(url, table=table) as client, open(log, "a") as out:
        for _ in range(int(n)):
            if kind == "lock":
                hold = client.lock(key, ttl=30, timeout=120)
            elif kind == "read":
                hold = client.rwlock(key, ttl=30, timeout=120).read_lock()
            elif kind == "write":
                hold = client.rwlock(key, ttl=30, timeout=120).write_lock()
            else:
                hold = client.semaphore(key, 2, ttl=30, timeout=120)
            with hold:
                start = time.monotonic_ns()
                time.sleep(0.003)
                end = time.monotonic_ns()
            out.write(f"{kind} {start} {end}\\n")
            out.flush()
    """
)


# its clients are sync scripts in other processes
@pytest.mark.needs("SharedHolds", "OnceRecords", "processes", "blocking")
def test_processes_mixing_kinds_never_overlap_wrongly(
    db_url: str, table: str, key: str, tmp_path: Path
) -> None:
    """Several processes, each taking one kind of hold on the same key in a loop: no two
    intervals of kinds that must exclude each other overlap."""
    log = tmp_path / "intervals.log"
    log.touch()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    kinds = ["lock", "read", "read", "semaphore", "lock", "write"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, db_url, table, key, kind, "15", str(log)], env=env
        )
        for kind in kinds
    ]
    try:
        codes = [proc.wait(timeout=240) for proc in procs]
    finally:  # none left running into the next test
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert codes == [0] * len(kinds), list(zip(kinds, codes, strict=True))
    intervals = [line.split() for line in log.read_text().splitlines()]
    assert len(intervals) == 15 * len(kinds)
    spans = [(kind, int(start), int(end)) for kind, start, end in intervals]
    bad = [
        (x, y)
        for i, x in enumerate(spans)
        for y in spans[i + 1 :]
        if (x[0], y[0]) not in SHARING and x[1] < y[2] and y[1] < x[2]
    ]
    assert bad == []
