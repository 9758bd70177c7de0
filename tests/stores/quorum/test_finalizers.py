"""A quorum's calls from a finalizer: the collector runs finalizers wherever memory is
allocated, so also while a thread hands a quorum's jobs to its pool and holds the pool's
locks; a release there must neither wait for those locks forever nor be lost."""

from __future__ import annotations

import gc
import threading
from pathlib import Path
from typing import Any

import pytest

import dblock
from tests._internals import store_of


class _Leftover:
    """Cyclic garbage whose finalizer releases a lock, as a lock wrapper's ``__del__`` does."""

    def __init__(self, lock: dblock.Lock, released: list[str]) -> None:
        self.lock = lock
        self.released = released
        self.me = self  # a cycle: only the collector frees it

    def __del__(self) -> None:
        try:
            self.lock.release()
            self.released.append("released")
        except Exception as exc:
            self.released.append(repr(exc))


def test_a_release_from_a_finalizer_run_inside_the_pools_submit_does_not_hang(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = " ".join(f"sqlite:///{tmp_path}/q{i}.sqlite3" for i in range(3))
    # closed only once the scenario ended: a hung one holds the pool's locks for good
    client = dblock.connect(url, table="locks")
    assert client.lock("warm").acquire()  # the pool exists and has its threads
    pool: Any = store_of(client)._executor()
    adjust = pool._adjust_thread_count
    released: list[str] = []
    collected = threading.Event()

    def collect_then_adjust() -> None:
        # submit() calls this holding its pool's shutdown lock (and the module's global one)
        if not collected.is_set():
            collected.set()
            gc.collect()
        adjust()

    done = threading.Event()

    def scenario() -> None:  # one thread: the finalizer's release is its owner's
        try:
            lock = client.lock("k")
            assert lock.acquire()
            _Leftover(lock, released)
            monkeypatch.setattr(pool, "_adjust_thread_count", collect_then_adjust)
            client.info("other")  # its fan-out's submit() runs the collection
        finally:
            done.set()

    gc.disable()  # the collection happens where this test says, not earlier
    try:
        threading.Thread(target=scenario, daemon=True).start()
        assert done.wait(10), "a release run by the collector inside submit() hung"
    finally:
        gc.enable()
    assert collected.is_set()
    assert released == ["released"]
    assert client.info("k") is None  # released on the stores, not only forgotten
    other = client.lock("k", reentrant=False)
    assert other.acquire(blocking=False)
    other.release()
    client.close()
