"""What runs inside the worker processes, and the statistics of what they recorded.

Times are ``time.monotonic()``: CLOCK_MONOTONIC is one system-wide clock on Linux, so the
records of different processes can be merged and compared.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import time
import uuid
from typing import Any, TypeVar

from bench.contenders import Contender, LockAdapter, Targets

# the statistics are the ones `dblock bench` (the user-facing tool) reports
from dblock.bench import Record
from dblock.bench import _median as median  # noqa: F401 - bench.run uses workload.median
from dblock.bench import _percentile as percentile

T = TypeVar("T")


def _close(adapter: LockAdapter) -> None:
    with contextlib.suppress(Exception):
        adapter.close()


def rounds(items: list[T], r: int) -> list[T]:
    """Round r's order: rotated by r, reversed every other round."""
    if not items:
        return []
    k = r % len(items)
    order = items[k:] + items[:k]
    return order[::-1] if r % 2 else order


# -- (a) uncontended pairs per second ---------------------------------------------------------
def uncontended_interleaved(
    cs: list[Contender], t: Targets, duration: float, max_ops: int, slice_s: float = 0.1
) -> dict[str, dict[str, Any]]:
    """(a) for several contenders in one process, interleaved in short slices (order rotated
    every slice), so that the machine's slow drifts (a neighbour's load, CPU frequency) fall on
    every contender alike. ``duration`` seconds of measurement per contender. Each contender's
    pairs/s, and the process CPU time it spent per pair."""
    adapters: dict[str, LockAdapter] = {}
    out: dict[str, dict[str, Any]] = {}
    for c in cs:
        try:
            adapter = c.factory(t, f"bench-a-{uuid.uuid4().hex[:12]}")
            for _ in range(20):  # warm-up: connections, prepared statements, tables
                adapter.acquire()
                adapter.release()
            adapters[c.id] = adapter
            out[c.id] = {"ops": 0, "seconds": 0.0, "cpu_seconds": 0.0}
        except Exception as exc:  # reported per contender
            out[c.id] = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
    try:
        for r in range(max(1, round(duration / slice_s))):
            for cid in rounds(list(adapters), r):
                adapter, res = adapters[cid], out[cid]
                if res["ops"] >= max_ops:
                    continue
                n, cpu, start = 0, time.process_time(), time.perf_counter()
                end = start + slice_s
                while True:
                    adapter.acquire()
                    adapter.release()
                    n += 1
                    if time.perf_counter() >= end:
                        break
                res["ops"] += n
                res["seconds"] += time.perf_counter() - start
                res["cpu_seconds"] += time.process_time() - cpu
    finally:
        for adapter in adapters.values():
            _close(adapter)
    for res in out.values():
        if "error" not in res:
            res["pairs_per_s"] = res["ops"] / res["seconds"]
            # the client process's CPU time (all its threads), per pair: where a contender
            # spends its time when it is not waiting for the server
            res["cpu_us_per_pair"] = res["cpu_seconds"] / res["ops"] * 1e6
    return out


# -- (b) contended critical sections and (c) hand-off -----------------------------------------
def _read_modify_write(fd: int, pause: float) -> None:
    raw = os.pread(fd, 32, 0)
    value = int(raw.strip(b"\x00 \n") or b"0")
    if pause:
        time.sleep(pause)
    os.pwrite(fd, b"%-20d\n" % (value + 1), 0)


def new_counter(path: str) -> None:
    with open(path, "wb") as f:
        f.write(b"%-20d\n" % 0)


def read_counter(path: str) -> int:
    with open(path, "rb") as f:
        return int(f.read().strip() or b"0")


def contended_worker(
    c: Contender,
    t: Targets,
    key: str,
    worker: int,
    counter: str,
    barrier: Any,
    duration: float,
    max_ops: int,
    pause: float,
) -> list[Record]:
    """Loop: acquire, read-modify-write the shared counter file, release. Until time/ops run out."""
    adapter = c.factory(t, key)
    fd = os.open(counter, os.O_RDWR)
    records: list[Record] = []
    try:
        barrier.wait(60)
        end = time.monotonic() + duration
        while len(records) < max_ops and time.monotonic() < end:
            t_req = time.monotonic()
            adapter.acquire()
            t_acq = time.monotonic()
            _read_modify_write(fd, pause)
            t_rel = time.monotonic()
            adapter.release()
            records.append((worker, t_req, t_acq, t_rel))
    finally:
        os.close(fd)
        _close(adapter)
    return records


def handoff_worker(
    c: Contender,
    t: Targets,
    key: str,
    worker: int,
    counter: str,
    barrier: Any,
    seq: Any,
    duration: float,
    max_ops: int,
    hold: float,
) -> list[Record]:
    """Two of these ping-pong one key. After releasing, a worker waits until the other one has
    acquired before it competes again, so every hand-off goes to a waiter that was already
    blocked (a poller cannot be overtaken by the releaser coming straight back)."""
    adapter = c.factory(t, key)
    fd = os.open(counter, os.O_RDWR)
    records: list[Record] = []
    try:
        barrier.wait(60)
        end = time.monotonic() + duration
        while len(records) < max_ops:
            t_req = time.monotonic()
            adapter.acquire()
            t_acq = time.monotonic()
            seq.value += 1
            mine = seq.value
            time.sleep(hold)  # the other one is blocked in acquire() by now
            _read_modify_write(fd, 0.0)
            t_rel = time.monotonic()
            adapter.release()
            records.append((worker, t_req, t_acq, t_rel))
            if time.monotonic() >= end:
                break
            give_up = time.monotonic() + 30
            while seq.value == mine and time.monotonic() < give_up:
                time.sleep(0.0002)
            if seq.value == mine:
                break
    finally:
        os.close(fd)
        _close(adapter)
    return records


def check_exclusion(records: list[Record], counter_value: int) -> dict[str, Any]:
    """Lost updates (counter vs sections) and overlapping hold intervals (a proof of overlap:
    a later acquisition returned before an earlier holder had even started its release)."""
    ordered = sorted(records, key=lambda r: r[2])
    overlaps = 0
    latest_release = -math.inf
    for _, _, t_acq, t_rel in ordered:
        if t_acq < latest_release:
            overlaps += 1
        latest_release = max(latest_release, t_rel)
    lost = len(records) - counter_value
    return {
        "sections": len(records),
        "counter": counter_value,
        "lost_updates": lost,
        "overlaps": overlaps,
        "exclusive": lost == 0 and overlaps == 0,
    }


def handoffs(records: list[Record]) -> list[float]:
    """Release-to-next-acquisition gaps where the lock passed to another worker."""
    ordered = sorted(records, key=lambda r: r[2])
    return [b[2] - a[3] for a, b in itertools.pairwise(ordered) if a[0] != b[0] and b[2] >= a[3]]


def contended_stats(records: list[Record], workers: int) -> dict[str, Any]:
    if not records:
        return {"throughput": 0.0}
    first = min(r[2] for r in records)
    last = max(r[3] for r in records)
    span = max(last - first, 1e-9)
    throughput = len(records) / span
    waits = [r[2] - r[1] for r in records]
    per_worker = [sum(1 for r in records if r[0] == w) for w in range(workers)]
    ideal = (workers - 1) / throughput if throughput else math.nan
    p99 = percentile(waits, 99)
    ho = handoffs(records)
    return {
        "throughput": throughput,
        "wait_p50_ms": percentile(waits, 50) * 1000,
        "wait_p99_ms": p99 * 1000,
        "ideal_wait_ms": ideal * 1000,
        "p99_over_ideal": p99 / ideal if ideal else math.nan,
        "fairness": min(per_worker) / max(per_worker) if max(per_worker) else 0.0,
        "per_worker": per_worker,
        "handoff_p50_ms": percentile(ho, 50) * 1000,
        "handoff_p99_ms": percentile(ho, 99) * 1000,
    }


# -- (e) waiting cost --------------------------------------------------------------------------
def holder(c: Contender, t: Targets, key: str, acquired: Any, release: Any, bound: float) -> None:
    adapter = c.factory(t, key)
    try:
        adapter.acquire()
        acquired.set()
        release.wait(bound)
        adapter.release()
    finally:
        _close(adapter)


def waiter(c: Contender, t: Targets, key: str, ready: Any) -> None:
    adapter = c.factory(t, key)
    try:
        ready.release()  # a semaphore the parent counts down
        adapter.acquire()
        adapter.release()
    finally:
        _close(adapter)
