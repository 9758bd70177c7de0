"""What runs inside the worker processes, and the statistics of what they recorded.

Times are ``time.monotonic()``: CLOCK_MONOTONIC is one system-wide clock on Linux, so the
records of different processes can be merged and compared.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from bench.contenders import Contender, LockAdapter, Targets

# the loops and statistics are the ones `dblock bench` (the user-facing tool) runs and reports
from dblock.bench import (
    Record,
    exclusion,
    handoff_loop,
    handoffs,
    median,
    percentile,
    section_loop,
)
from dblock.bench import contended_stats as _lock_stats

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
                n, wall, cpu = timed_slice(adapter, slice_s)
                res["ops"] += n
                res["seconds"] += wall
                res["cpu_seconds"] += cpu
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


def timed_slice(lock: Any, slice_s: float) -> tuple[int, float, float]:
    """acquire+release pairs of ``lock`` for ``slice_s`` seconds (at least one): how many,
    the wall time and the process's CPU time they took."""
    n, cpu, start = 0, time.process_time(), time.perf_counter()
    end = start + slice_s
    while True:
        lock.acquire()
        lock.release()
        n += 1
        if time.perf_counter() >= end:
            break
    return n, time.perf_counter() - start, time.process_time() - cpu


def timed_calls(step: Callable[[], object], slice_s: float) -> tuple[int, float, float]:
    """``step()`` for ``slice_s`` seconds (at least once): how many, the wall time and the
    process's CPU time they took (``timed_slice`` for what is not a lock)."""
    n, cpu, start = 0, time.process_time(), time.perf_counter()
    end = start + slice_s
    while True:
        step()
        n += 1
        if time.perf_counter() >= end:
            break
    return n, time.perf_counter() - start, time.process_time() - cpu


def interleave(
    slices: Mapping[str, Callable[[float], tuple[int, float, float]]],
    duration: float,
    max_ops: int,
    slice_s: float,
) -> dict[str, dict[str, float]]:
    """Each side's slices (``slices[side](slice_s)``: how many, wall, CPU), taken in turn, the
    order rotated every round, for ``duration`` s of each side (none past ``max_ops``), so
    that the machine's drifts fall on every side alike: each side's ops, wall and cpu."""
    out: dict[str, dict[str, float]] = {s: {"ops": 0, "wall": 0.0, "cpu": 0.0} for s in slices}
    for r in range(max(1, round(duration / slice_s))):
        for side in rounds(list(slices), r):
            res = out[side]
            if res["ops"] >= max_ops:
                continue
            n, wall, cpu = slices[side](slice_s)
            res["ops"] += n
            res["wall"] += wall
            res["cpu"] += cpu
    return out


def repeat_interleaved(
    res: dict[str, Any],
    run: Callable[[], dict[str, Any]],
    repeats: int,
    sides: Sequence[str],
    fields: tuple[str, str],
    ratios: Callable[[dict[str, Any]], dict[str, float]],
    logged: Callable[[int, dict[str, Any]], None],
) -> None:
    """``run()`` (one fresh process whose sides ran interleaved) ``repeats`` times, into
    ``res``: ``repeats``, each side's median of ``fields`` (a rate, a CPU cost), and each of
    ``ratios``' median with its repeats' values (``<name>_repeats``). A ratio is taken within
    a repeat, whose sides ran under the same load, and the median of those is quoted."""
    res["repeats"] = []
    for r in range(repeats):
        v = run()
        res["repeats"].append(v)
        logged(r, v)
    for side in sides:
        res[side] = {k: median([x[side][k] for x in res["repeats"]]) for k in fields}
    each = [ratios(x) for x in res["repeats"]]
    for name in each[0]:
        res[name] = median([x[name] for x in each])
        res[f"{name}_repeats"] = [x[name] for x in each]


def exclusion_status(v: dict[str, Any]) -> str:
    """A report's exclusion cell: ok, or FAILING with the lost updates and overlaps."""
    if v["exclusive"]:
        return "ok"
    return f"**FAILING** ({v['lost_updates']} lost, {v['overlaps']} overlaps)"


# -- (b) contended critical sections and (c) hand-off -----------------------------------------
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
    try:
        return section_loop(adapter, fd, worker, barrier, duration, max_ops, pause)
    finally:
        os.close(fd)
        _close(adapter)


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
    """Two of these ping-pong one key (see dblock.bench.handoff_loop)."""
    adapter = c.factory(t, key)
    fd = os.open(counter, os.O_RDWR)
    try:
        return handoff_loop(adapter, fd, worker, barrier, seq, duration, max_ops, hold)
    finally:
        os.close(fd)
        _close(adapter)


def check_exclusion(records: list[Record], counter_value: int) -> dict[str, Any]:
    """Lost updates (counter vs sections) and overlapping hold intervals."""
    lost, overlaps = exclusion(records, counter_value)
    return {
        "sections": len(records),
        "counter": counter_value,
        "lost_updates": lost,
        "overlaps": overlaps,
        "exclusive": lost == 0 and overlaps == 0,
    }


def contended_stats(records: list[Record], workers: int) -> dict[str, Any]:
    """dblock bench's statistics, with the sections per worker and the hand-off times."""
    stats = _lock_stats(records, workers)
    if not records:
        return stats
    ho = handoffs(records)
    return {
        **stats,
        "per_worker": [sum(1 for r in records if r[0] == w) for w in range(workers)],
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
