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

**Floors** (``--contenders`` naming ``floor``; PostgreSQL and Redis, where dblock misses a
target): the same cells, processes and critical section, each process lining its tasks up in
an ``asyncio.Lock`` as dblock's client does, with the store's leanest fair lock that wakes only
the next waiter: on PostgreSQL ``pg_advisory_lock`` (the waiter sleeps in the server's lock
queue; no lease, token or queue table), on Redis the FIFO ticket lock of scenario (b) over
``redis.asyncio`` (``BLPOP`` on the waiter's own list). How their own hand-offs and work grow
from 8 to 512 waiters is what this machine allows: a target that the floor misses too is
beyond the best possible implementation here. PostgreSQL also runs a **doorbell** (a durable
lease with a fencing token, its waiters asleep in ``pg_advisory_lock``: see _DoorbellFloor),
what a server-side wait would cost dblock there.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import os
import time
import uuid
from collections.abc import Awaitable, Callable
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


#: the stores that have floors in this scenario, and theirs: "floor" the leanest fair lock,
#: "doorbell" a durable lease whose waiters sleep in the server (see _DoorbellFloor)
FLOORS = {"postgresql": ("floor", "doorbell"), "redis": ("floor",)}


def _label(waiters: int, floor: str | None = None) -> str:
    """A cell's name: its number of waiters, then the floor it runs (none: dblock's)."""
    return str(waiters) if floor is None else f"{waiters} {floor}"


def _advisory_key(key: str) -> int:
    """The bigint that names ``key``'s lock in ``pg_advisory_lock``."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big", signed=True)


@dataclass(frozen=True)
class Job:
    url: str
    table: str
    key: str
    counter: str
    tasks: int
    duration: float
    #: which of the store's floors (FLOORS) runs, instead of dblock
    floor: str | None = None
    store: str = ""


def waiter_process(job: Job, p: int, barrier: Any) -> dict[str, Any]:
    if job.floor is not None:
        return asyncio.run(_floor_waiters(job, p, barrier))
    return asyncio.run(_waiters(job, p, barrier))


class _AdvisoryFloor:
    """PostgreSQL's own lock: the waiter sleeps in ``pg_advisory_lock``; the unlock wakes the
    next in the server's queue, and only it."""

    def __init__(self, url: str, key: str) -> None:
        self.url, self.key = url, _advisory_key(key)

    async def open(self) -> None:
        import psycopg

        self.conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)

    async def acquire(self) -> None:
        await self.conn.execute("SELECT pg_advisory_lock(%s)", (self.key,))

    async def release(self) -> None:
        await self.conn.execute("SELECT pg_advisory_unlock(%s)", (self.key,))

    async def close(self) -> None:
        await self.conn.close()


class _DoorbellFloor:
    """A lease on the server's clock with a fencing token from a sequence, taken by one
    durable statement, whose waiters sleep in ``pg_advisory_lock`` on the key's bell: the
    release frees the row and lets go of the bell in one statement, which wakes the next
    waiter in the server's queue, and only it; its take waits for the release's row lock, then
    sees the row free. A waiter that finds the lease held (its holder died with the bell)
    looks again every 10 ms until the lease ends. What a doorbell would cost dblock on
    PostgreSQL (MariaDB's design, stores/mysql/doorbell.py), without its queue table."""

    TABLE = "bench_waiters_doorbell"
    TAKE = (
        f"INSERT INTO {TABLE} AS t (lock_key, owner, token, expires_at) VALUES (%(key)s, "
        f"%(owner)s, nextval('{TABLE}_seq'), clock_timestamp() + interval '60 seconds') "
        "ON CONFLICT (lock_key) DO UPDATE SET owner = EXCLUDED.owner, token = EXCLUDED.token, "
        "expires_at = EXCLUDED.expires_at WHERE t.owner IS NULL OR t.expires_at <= "
        "clock_timestamp() RETURNING token"
    )
    RELEASE = (
        f"WITH r AS (UPDATE {TABLE} SET owner = NULL, expires_at = clock_timestamp() WHERE "
        "lock_key = %(key)s AND owner = %(owner)s AND token = %(token)s RETURNING 1) "
        # the unlock is evaluated once the UPDATE has run (it reads its rows): the next
        # waiter's take then waits for this row's lock, and sees the row free at the commit
        "SELECT pg_advisory_unlock(%(bell)s), x.n FROM (SELECT count(*) AS n FROM r) x"
    )

    @classmethod
    def prepare(cls, url: str) -> None:
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {cls.TABLE} (lock_key text PRIMARY KEY, owner text, "
                "token bigint, expires_at timestamptz)"
            )
            conn.execute(f"CREATE SEQUENCE IF NOT EXISTS {cls.TABLE}_seq")

    def __init__(self, url: str, key: str) -> None:
        self.url = url
        self.params: dict[str, Any] = {"key": key, "owner": uuid.uuid4().hex, "token": None}
        self.params["bell"] = _advisory_key(key)

    async def open(self) -> None:
        import psycopg

        self.conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)

    async def acquire(self) -> None:
        await self.conn.execute("SELECT pg_advisory_lock(%(bell)s)", self.params)
        while True:
            row = await (await self.conn.execute(self.TAKE, self.params)).fetchone()
            if row is not None:
                self.params["token"] = row[0]
                return
            await asyncio.sleep(0.01)

    async def release(self) -> None:
        row = await (await self.conn.execute(self.RELEASE, self.params)).fetchone()
        if row is None or not row[1]:
            raise RuntimeError("the doorbell floor's release found its lease gone")

    async def close(self) -> None:
        await self.conn.close()


class _TicketFloor:
    """Redis: scenario (b)'s FIFO ticket lock (``RedisTicketFloor``) over redis.asyncio."""

    def __init__(self, url: str, key: str) -> None:
        self.url, self.key = url, key

    async def open(self) -> None:
        import redis.asyncio as aioredis

        from bench.contenders import RedisTicketFloor

        self.r = aioredis.from_url(self.url)
        self.keys, self.turn = RedisTicketFloor.names(self.key)
        await self.r.set(self.keys[0], 0, nx=True, ex=3600)
        await self.r.set(self.keys[1], 1, nx=True, ex=3600)
        self.take = self.r.register_script(RedisTicketFloor._TAKE)
        self.serve = self.r.register_script(RedisTicketFloor._SERVE)

    async def acquire(self) -> None:
        ticket = int(await self.take(keys=self.keys))
        if ticket:
            await self.r.blpop([self.turn + str(ticket)])

    async def release(self) -> None:
        await self.serve(keys=self.keys, args=[self.turn])

    async def close(self) -> None:
        await self.r.aclose()


Pair = tuple[Callable[[], Awaitable[Any]], Callable[[], Awaitable[Any]]]


async def _sections(job: Job, p: int, fd: int, pair: Callable[[], Pair]) -> dict[str, Any]:
    """Every task's loop for the cell's window: ``pair()`` gives a task its (acquire, release);
    the records and the process's CPU over the window."""
    cpu0 = time.process_time()
    end = time.monotonic() + job.duration
    records: list[Rec] = []

    async def work(i: int) -> None:
        acquire, release = pair()
        task = p * job.tasks + i
        while time.monotonic() < end:
            t_req = time.monotonic()
            await acquire()
            t_acq = time.monotonic()
            read_modify_write(fd)
            t_rel = time.monotonic()
            await release()
            records.append((task, t_req, t_acq, t_rel))

    await asyncio.gather(*(work(i) for i in range(job.tasks)))
    return {"records": records, "cpu": time.process_time() - cpu0}


async def _floor_waiters(job: Job, p: int, barrier: Any) -> dict[str, Any]:
    kinds = {
        ("postgresql", "floor"): _AdvisoryFloor,
        ("postgresql", "doorbell"): _DoorbellFloor,
        ("redis", "floor"): _TicketFloor,
    }
    floor: Any = kinds[job.store, job.floor or ""](job.url, job.key)
    line = asyncio.Lock()  # the process's tasks line up, as in dblock's client

    async def acquire() -> None:
        await line.acquire()
        try:
            await floor.acquire()
        except BaseException:
            line.release()
            raise

    async def release() -> None:
        try:
            await floor.release()
        finally:
            line.release()

    fd = os.open(job.counter, os.O_RDWR)
    try:
        await floor.open()
        try:
            await asyncio.to_thread(barrier.wait, 300)
            return await _sections(job, p, fd, lambda: (acquire, release))
        finally:
            await floor.close()
    finally:
        os.close(fd)


async def _waiters(job: Job, p: int, barrier: Any) -> dict[str, Any]:
    import dblock

    fd = os.open(job.counter, os.O_RDWR)
    try:
        async with await dblock.connect_async(job.url, table=job.table) as client:
            async with client.lock(f"{job.key}-warm-{p}", ttl=60):
                pass  # connections open, tables checked: none of it in the window
            await asyncio.to_thread(barrier.wait, 300)

            def pair() -> Pair:
                lock = client.lock(job.key, ttl=60)
                return lock.acquire, lock.release

            return await _sections(job, p, fd, pair)
    finally:
        os.close(fd)


def run_cell(
    t: Targets,
    backend: str,
    table: str,
    processes: int,
    tasks: int,
    duration: float,
    tmp: str,
    floor: str | None = None,
) -> dict[str, Any]:
    """One cell of dblock, or of the store's ``floor`` (FLOORS)."""
    key = f"bench-waiters-{uuid.uuid4().hex[:10]}"
    counter = os.path.join(tmp, f"counter-{uuid.uuid4().hex[:8]}")
    new_counter(counter)
    job = Job(t.url(backend), table, key, counter, tasks, duration, floor, backend)
    if floor == "doorbell":
        _DoorbellFloor.prepare(job.url)
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
    backends: list[str],
    t: Targets,
    b: Any,
    tmp: str,
    repeats: int = 2,
    *,
    dblock: bool = True,
    floors: bool = False,
) -> dict[str, Any]:
    """The cells of dblock (``dblock``) and of the stores' floors (``floors``; see FLOORS)."""
    quick = b.duration < 1  # --quick
    table = f"{t.table}_waiters"

    def measure(crowd: Targets, backend: str, cells: dict[str, Any]) -> None:
        kinds: list[str | None] = [None] if dblock else []
        kinds += list(FLOORS.get(backend, ())) if floors else []
        for r in range(repeats):
            order = CELLS if r % 2 == 0 else CELLS[::-1]
            for (processes, tasks), floor in itertools.product(order, kinds):
                label = _label(processes * tasks, floor)
                window = 1.5 if quick else WINDOW[processes * tasks]
                rep = run_cell(crowd, backend, table, processes, tasks, window, tmp, floor)
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


def _growth(
    cells: dict[str, Any], field: str, floor: str | None = None
) -> tuple[float, str] | None:
    """(512's figure ÷ 8's, both as text) for ``field`` of dblock's cells or a floor's."""
    few, many = cells.get(_label(8, floor)), cells.get(_label(512, floor))
    if not few or not many or not few.get(field) or many.get(field) is None:
        return None
    return many[field] / few[field], f"{many[field]:.2f} vs {few[field]:.2f}"


def _measured(cells: dict[str, Any], field: str, unit: str, limit: float) -> dict[str, Any] | None:
    mine = _growth(cells, field)
    if mine is None:
        return None
    text = f"{mine[0]:.2f}× ({mine[1]}{unit})"
    floor = _growth(cells, field, "floor")
    if floor is not None:
        beyond = "; the floor misses it too" if floor[0] > limit else ""
        text += f"; floor {floor[0]:.2f}× ({floor[1]}{unit}){beyond}"
    return {"measured": text, "met": mine[0] <= limit}


def targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for store, cells in res.items():
        handoff = _measured(cells, "handoff_p50_ms", " ms", HANDOFF_RATIO)
        if handoff is None:
            continue
        out.append(
            {"target": f"(waiters) {store}: hand-off median at 512 ≤ {HANDOFF_RATIO}× at 8"}
            | handoff
        )
        work = _measured(cells, "work_per_handoff", "", WORK_RATIO)
        if work is not None:
            label = f"(waiters) {store}: server work per hand-off at 512 ≤ {WORK_RATIO}× at 8"
            out.append({"target": label} | work)
        fair = min(
            v["fairness"]
            for label, v in cells.items()
            if v.get("fairness") is not None and label.isdigit()  # dblock's
        )  # (dblock's cells are there: the hand-off's figures were)
        out.append(
            {
                "target": f"(waiters) {store}: fairness ≥ {FAIRNESS} in every cell",
                "measured": f"{fair:.2f} (lowest)",
                "met": fair >= FAIRNESS,
            }
        )
    return out
