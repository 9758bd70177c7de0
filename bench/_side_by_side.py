"""What bench/etcd.py and bench/quorum.py share: a contender measured alone and then by 8
processes on one key, each holding it 5 ms a turn.

A contender is a class of a bench module's ``CONTENDERS`` (by name), made from one argument
(its URL or URLs), with ``lock(key)``, ``take(lock)`` (a blocking acquire) and ``close()``;
the lock has ``release()``.
"""

from __future__ import annotations

import importlib
import json
import multiprocessing as mp
import os
import statistics
import time
import uuid
from typing import Any

HOLD = 0.005
WORKERS = 8


def _make(module: str, name: str, arg: Any) -> Any:
    return importlib.import_module(module).CONTENDERS[name](arg)


def uncontended(module: str, name: str, arg: Any, ops: int) -> float:
    """``ops`` acquire+release of fresh keys by one process, after a warm-up: ops/s."""
    c = _make(module, name, arg)
    prefix = uuid.uuid4().hex[:8]
    for i in range(20):  # warm-up: connections, leases, scripts
        lock = c.lock(f"w-{prefix}-{i}")
        c.take(lock)
        lock.release()
    started = time.perf_counter()
    for i in range(ops):
        lock = c.lock(f"u-{prefix}-{i}")
        c.take(lock)
        lock.release()
    elapsed = time.perf_counter() - started
    c.close()
    return ops / elapsed


def _worker(
    module: str,
    name: str,
    arg: Any,
    key: str,
    duration: float,
    out: Any,
    inside: Any,
    ready: Any,
) -> None:
    c = _make(module, name, arg)
    waits: list[float] = []
    overlaps = 0
    lock = c.lock(key)
    ready.wait()  # every worker connected: they start together
    until = time.time() + duration
    while time.time() < until:
        asked = time.perf_counter()
        c.take(lock)
        waits.append(time.perf_counter() - asked)
        with inside.get_lock():
            inside.value += 1
            overlaps += inside.value > 1
        time.sleep(HOLD)
        with inside.get_lock():
            inside.value -= 1
        lock.release()
    c.close()
    out.put((os.getpid(), waits, overlaps))


def contended(module: str, name: str, arg: Any, duration: float) -> dict[str, Any]:
    """WORKERS processes on one key for ``duration`` s: sections/s, waits, the ideal FIFO
    wait ((workers-1)/throughput), fairness (fewest/most sections per worker), overlaps."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    inside = ctx.Value("i", 0)
    ready = ctx.Barrier(WORKERS)
    key = f"c-{uuid.uuid4().hex[:8]}"
    procs = [
        ctx.Process(target=_worker, args=(module, name, arg, key, duration, out, inside, ready))
        for _ in range(WORKERS)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=duration + 300) for _ in procs]
    for p in procs:
        p.join(30)
    counts = [len(w) for _, w, _ in results]
    waits = sorted(x for _, w, _ in results for x in w[1:])  # each first wait: start-up
    throughput = sum(counts) / duration
    ideal = (WORKERS - 1) / throughput if throughput else float("inf")
    p99 = waits[int(0.99 * (len(waits) - 1))] if waits else float("nan")
    return {
        "sections_per_s": throughput,
        "wait_p50_ms": 1000 * statistics.median(waits) if waits else float("nan"),
        "wait_p99_ms": 1000 * p99,
        "ideal_wait_ms": 1000 * ideal,
        "p99_over_ideal": p99 / ideal if ideal else float("nan"),
        "fairness": min(counts) / max(counts) if max(counts) else 0.0,
        "overlaps": sum(o for _, _, o in results),
    }


def finish(checks: list[tuple[str, str, bool]], report: Any, json_path: str | None) -> None:
    """Print each target's PASS/FAIL line; write the report as JSON if asked."""
    for what, value, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {what}: {value}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=2)
