"""Scenario ``waiters``: many waiters on one key (issue 52, point 1).

Three cells per store: 8 waiters (8 processes, one asyncio task each), 64 (8 processes of 8
tasks) and 512 (64 processes of 8 tasks); each process has one ``connect_async`` client, so
a store sees as many waiting clients as there are processes (a client lines its own tasks up
and only the first waits in the store). Every task loops for the cell's window (4, 6 and
20 s; then the ones still queued take their last turn): acquire the key, a short critical
section (a read-modify-write of a counter file: a lost update or two overlapping holds make
the cell FAILING), release. The processes are forked from the bench, connect and take a key of their
own once before a barrier, so the window holds no start-up.

Reported per cell (medians of the repeats): hand-offs per second; the **hand-off**, the time
from a release's call to the next acquisition's return when that waiter was already queued,
median and p99; the wait p99; **fairness**, Jain's index of the sections per task (1.0: all
equal; k against k + 1 sections still reads ≥ 0.9, a starved task does not) beside the
fewest/most; the clients' CPU per hand-off (every process, all threads, from the barrier);
and the server's **work per hand-off** (statements, commands, messages or packets the
server counted, see ``bench/crowd_servers.py``; over the cell's whole life, connecting
included) and its CPU per hand-off. PostgreSQL, MariaDB and ZooKeeper run on private
servers that take the connections (``crowd_servers``).

Targets: at 512 waiters the hand-off median ≤ 1.5 times its value at 8, the server's work
per hand-off ≤ 1.25 times its value at 8 (independent of the number of waiters: no thundering herd),
fairness ≥ 0.9.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

from bench import procs
from bench.contenders import Targets
from bench.crowd_servers import (
    Work,
    each_store,
    fmt,
    listener_pid,
    log,
    port_of,
    summarise,
    tree_cpu,
)
from dblock.bench import exclusion, new_counter, percentile, read_counter, read_modify_write

#: (processes, tasks per process)
CELLS = ((8, 1), (8, 8), (64, 8))
#: seconds per cell: long enough that every task gets several turns (with one or two each,
#: Jain's index of a perfectly fair queue can read 0.89)
WINDOW = {8: 4.0, 64: 6.0, 512: 20.0}
HANDOFF_RATIO = 1.5
WORK_RATIO = 1.25
FAIRNESS = 0.9
#: task, t_request, t_acquired, t_release_called (time.monotonic(), system-wide)
Rec = tuple[int, float, float, float]


@dataclass(frozen=True)
class Job:
    url: str
    table: str
    key: str
    counter: str
    tasks: int
    duration: float


def waiter_process(job: Job, p: int, barrier: Any) -> dict[str, Any]:
    return asyncio.run(_waiters(job, p, barrier))


async def _waiters(job: Job, p: int, barrier: Any) -> dict[str, Any]:
    import dblock

    fd = os.open(job.counter, os.O_RDWR)
    records: list[Rec] = []
    try:
        async with await dblock.connect_async(job.url, table=job.table) as client:
            async with client.lock(f"{job.key}-warm-{p}", ttl=60):
                pass  # connections open, tables checked: none of it in the window
            await asyncio.to_thread(barrier.wait, 300)
            cpu0 = time.process_time()
            end = time.monotonic() + job.duration

            async def work(i: int) -> None:
                lock = client.lock(job.key, ttl=60)
                task = p * job.tasks + i
                while time.monotonic() < end:
                    t_req = time.monotonic()
                    await lock.acquire()
                    t_acq = time.monotonic()
                    read_modify_write(fd)
                    t_rel = time.monotonic()
                    await lock.release()
                    records.append((task, t_req, t_acq, t_rel))

            await asyncio.gather(*(work(i) for i in range(job.tasks)))
            cpu = time.process_time() - cpu0
        return {"records": records, "cpu": cpu}
    finally:
        os.close(fd)


def run_cell(
    t: Targets, backend: str, table: str, processes: int, tasks: int, duration: float, tmp: str
) -> dict[str, Any]:
    key = f"bench-waiters-{uuid.uuid4().hex[:10]}"
    counter = os.path.join(tmp, f"counter-{uuid.uuid4().hex[:8]}")
    new_counter(counter)
    job = Job(t.url(backend), table, key, counter, tasks, duration)
    work = Work(t, backend)
    port = port_of(t, backend)
    pid = listener_pid(port) if port else None
    try:
        w0, cpu0 = work.read(), tree_cpu(pid)
        barrier = procs._CTX.Barrier(processes)
        results = procs.run_parallel(
            waiter_process,
            [(job, p, barrier) for p in range(processes)],
            timeout=duration + 240,
        )
        time.sleep(1.0 if backend == "postgresql" else 0.2)  # the backends' last counts land
        w1, cpu1 = work.read(), tree_cpu(pid)
        records = [r for res in results for r in res["records"]]
        stats = _stats(records, processes * tasks)
        lost, overlaps = exclusion(records, read_counter(counter))
        n = max(1, len(records))
        done = work.delta(w0, w1)
        return {
            **stats,
            "client_cpu_us": sum(r["cpu"] for r in results) / n * 1e6,
            "work_per_handoff": None if done is None else done / n,
            "server_cpu_us": None if cpu0 is None or cpu1 is None else (cpu1 - cpu0) / n * 1e6,
            "lost_updates": lost,
            "overlaps": overlaps,
            "exclusive": lost == 0 and overlaps == 0,
        }
    finally:
        work.close()
        with contextlib.suppress(OSError):
            os.unlink(counter)


def _stats(records: list[Rec], tasks: int) -> dict[str, Any]:
    if not records:
        return {"sections": 0, "throughput": 0.0}
    ordered = sorted(records, key=lambda r: r[2])
    gaps = [cur[2] - prev[3] for prev, cur in itertools.pairwise(ordered) if cur[1] < prev[3]]
    waits = [r[2] - r[1] for r in records]
    per_task = [0] * tasks
    for r in records:
        per_task[r[0]] += 1
    total, squares = sum(per_task), sum(x * x for x in per_task)
    span = ordered[-1][3] - ordered[0][2]
    return {
        "sections": len(records),
        "throughput": len(records) / max(span, 1e-9),
        "handoff_p50_ms": percentile(gaps, 50) * 1000,
        "handoff_p99_ms": percentile(gaps, 99) * 1000,
        "wait_p99_ms": percentile(waits, 99) * 1000,
        "fairness": total * total / (tasks * squares) if squares else 0.0,
        "min_max": f"{min(per_task)}/{max(per_task)}",
    }


_FIELDS = (
    "throughput",
    "handoff_p50_ms",
    "handoff_p99_ms",
    "wait_p99_ms",
    "fairness",
    "client_cpu_us",
    "work_per_handoff",
    "server_cpu_us",
)


def scenario_waiters(
    backends: list[str], t: Targets, b: Any, tmp: str, repeats: int = 2
) -> dict[str, Any]:
    quick = b.duration < 1  # --quick
    table = f"{t.table}_waiters"

    def measure(crowd: Targets, backend: str, cells: dict[str, Any]) -> None:
        for r in range(repeats):
            order = CELLS if r % 2 == 0 else CELLS[::-1]
            for processes, tasks in order:
                label = str(processes * tasks)
                window = 1.5 if quick else WINDOW[processes * tasks]
                rep = run_cell(crowd, backend, table, processes, tasks, window, tmp)
                cells.setdefault(label, {"processes": processes, "repeats": []})
                cells[label]["repeats"].append(rep)
                log(
                    f"[waiters] {backend} {label} waiters ({processes} processes): "
                    f"hand-off p50 {rep.get('handoff_p50_ms', 0):.2f} ms, "
                    f"{rep.get('throughput', 0):,.0f}/s, fairness "
                    f"{rep.get('fairness', 0):.2f}, work/hand-off "
                    f"{fmt(rep.get('work_per_handoff'), '.2f')}"
                    + ("" if rep["exclusive"] else "  FAILING")
                )
        for v in cells.values():
            summarise(v, _FIELDS)
            v["min_max"] = " ".join(x.get("min_max", "") for x in v["repeats"])

    return each_store("waiters", t, backends, tmp, table, measure)


def markdown(res: dict[str, Any]) -> list[str]:
    lines = [
        "### (waiters) 8, 64 and 512 waiters on one key (issue 52)",
        "",
        "8 processes × 1 task, 8 × 8, 64 × 8; one async client per process. Hand-off: a "
        "release's call to the queued next holder's return. Fairness: Jain's index of "
        "sections per task (fewest/most per repeat beside it). Work: what the server counted "
        "(statements, commands, gRPC messages, packets) per hand-off; CPU in µs per hand-off.",
        "",
        "| store | waiters | hand-offs/s | hand-off p50 ms | p99 ms | wait p99 ms | fairness "
        "| fewest/most | client CPU µs | server work | server CPU µs | exclusion |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|",
    ]
    for store, cells in res.items():
        if "error" in cells:
            lines.append(f"| {store} | error: {cells['error'][:90]} |||||||||||")
            continue
        for label, v in cells.items():
            status = "ok" if v["exclusive"] else f"**FAILING** {v['lost_updates']} lost"
            lines.append(
                f"| {store} | {label} | {fmt(v['throughput'])} | {fmt(v['handoff_p50_ms'], '.2f')} "
                f"| {fmt(v['handoff_p99_ms'], '.1f')} | {fmt(v['wait_p99_ms'], ',.0f')} "
                f"| {fmt(v['fairness'], '.2f')} | {v['min_max']} | {fmt(v['client_cpu_us'])} "
                f"| {fmt(v['work_per_handoff'], '.2f')} | {fmt(v['server_cpu_us'])} | {status} |"
            )
    lines.append("")
    return lines


def targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for store, cells in res.items():
        few, many = cells.get("8"), cells.get("512")
        if not few or not many or "handoff_p50_ms" not in many:
            continue
        h8, h512 = few["handoff_p50_ms"], many["handoff_p50_ms"]
        out.append(
            {
                "target": f"(waiters) {store}: hand-off median at 512 ≤ {HANDOFF_RATIO}× at 8",
                "measured": f"{h512 / h8:.2f}× ({h512:.2f} vs {h8:.2f} ms)",
                "met": h512 <= HANDOFF_RATIO * h8,
            }
        )
        w8, w512 = few.get("work_per_handoff"), many.get("work_per_handoff")
        if w8 and w512 is not None:
            out.append(
                {
                    "target": f"(waiters) {store}: server work per hand-off at 512 ≤ "
                    f"{WORK_RATIO}× at 8",
                    "measured": f"{w512 / w8:.2f}× ({w512:.2f} vs {w8:.2f})",
                    "met": w512 <= WORK_RATIO * w8,
                }
            )
        fair = min(v["fairness"] for v in cells.values() if v.get("fairness") is not None)
        out.append(
            {
                "target": f"(waiters) {store}: fairness ≥ {FAIRNESS} in every cell",
                "measured": f"{fair:.2f} (lowest)",
                "met": fair >= FAIRNESS,
            }
        )
    return out
