"""Scenario "async": many asyncio tasks on one async client against a few blocking processes.

Per backend, two cells of the same length alternate round by round, contending on the same
few keys (``--async-keys``, 4): ``--async-tasks`` (200) tasks of one process sharing one
``connect_async`` client, and ``--workers`` (8) processes with a blocking client each, the
shape of scenario (b). Worker ``w``'s ``n``-th section takes key ``(w + n) % keys``, and is a
read-modify-write of that key's counter file: a lost update or two overlapping holds of one
key make the cell FAILING. Reported per cell: sections/s, wait p50/p99, fairness (fewest/most
sections per worker, and Jain's index), the connections opened to the database and the most
open at once, and the statements the server ran (per second of the window, per section).

Counting: PostgreSQL and MariaDB run the cell in a private database made for the run (the
counting connection sits in the shared one). PostgreSQL: ``pg_stat_database.sessions`` and
``xact_commit + xact_rollback`` of that database, read once every client has gone (a backend
publishes its counts when it exits), and the most rows of ``pg_stat_activity`` seen at once
(sampled every 20 ms). MariaDB: the distinct connection ids ``information_schema.PROCESSLIST``
showed for that database (sampled every 20 ms, so a connection that lived less than that can
be missed), and ``SHOW GLOBAL STATUS 'Questions'``, which is server-wide: minus the counting
connection's own statements and minus the rate of an idle window just before the cell.
SQLite has no server: the connections the clients' stores opened (counted in the clients, the
one ``connect`` opened before the count began included, as PostgreSQL's count includes it), and
the store operations they ran (one transaction each; the waiters' reads of the file's change
counter, shared memory, are not counted).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from bench import procs, servers
from bench.contenders import Targets
from dblock.bench import exclusion, median, new_counter, percentile, read_counter, read_modify_write

BACKENDS = ("postgresql", "mysql", "sqlite")
CELLS = ("tasks", "processes")
#: worker, key index, t_request, t_acquired, t_release_called (time.monotonic())
Rec = tuple[int, int, float, float, float]
SAMPLE_EVERY = 0.02


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- what runs in the clients ------------------------------------------------------------------
class _Counted:
    """The store's operations and new connections, counted in the client (SQLite's figures)."""

    def __init__(self, store: Any) -> None:
        # the pool's connections opened by connect() before this count began are the
        # client's too (a cell whose waiters never open a change watch opened those alone)
        self.counts = {"connections": store._open, "operations": 0}
        self._lock = threading.Lock()  # connections are opened on worker threads too
        # SQLite opens every connection (pooled, or a waiter's change watch) in _open_file
        opener = "_open_file" if hasattr(store, "_open_file") else "_connect"
        connect, run = getattr(store, opener), store.run

        def counted_connect() -> Any:
            self._add("connections")
            return connect()

        def counted_run(*args: Any, **kwargs: Any) -> Any:
            self._add("operations")
            return run(*args, **kwargs)

        setattr(store, opener, counted_connect)
        store.run = counted_run

    def _add(self, what: str) -> None:
        with self._lock:
            self.counts[what] += 1

    def totals(self) -> dict[str, int]:
        return dict(self.counts)


@dataclass(frozen=True)
class Job:
    """What both cells' clients are given: where, which keys and counter files, how long."""

    url: str
    table: str
    keys: list[str]
    counters: list[str]
    duration: float
    max_ops: int


def tasks_worker(job: Job, tasks: int) -> dict[str, Any]:
    """The tasks cell's process: see :func:`_tasks`."""
    return asyncio.run(_tasks(job, tasks))


async def _tasks(job: Job, tasks: int) -> dict[str, Any]:
    """``tasks`` asyncio tasks on one async client; their records and the client's counts."""
    import dblock

    fds = [os.open(path, os.O_RDWR) for path in job.counters]
    records: list[Rec] = []
    go = asyncio.Event()
    try:
        async with await dblock.connect_async(job.url, table=job.table) as client:
            counted = _Counted(client._sync._store)
            end = 0.0

            async def work(w: int) -> None:
                locks = [client.lock(k, ttl=60) for k in job.keys]
                await go.wait()
                n = 0
                while len(records) < job.max_ops and time.monotonic() < end:
                    i = (w + n) % len(locks)
                    t_req = time.monotonic()
                    await locks[i].acquire()
                    t_acq = time.monotonic()
                    read_modify_write(fds[i])
                    t_rel = time.monotonic()
                    await locks[i].release()
                    records.append((w, i, t_req, t_acq, t_rel))
                    n += 1

            workers = [asyncio.create_task(work(w)) for w in range(tasks)]
            await asyncio.sleep(0)  # every task has made its locks and waits at the start
            end = time.monotonic() + job.duration
            go.set()
            await asyncio.gather(*workers)
            return {"records": records, **counted.totals()}
    finally:
        for fd in fds:
            os.close(fd)


def process_worker(job: Job, w: int, barrier: Any) -> dict[str, Any]:
    """One blocking process of the other cell: the same loop, one client."""
    import dblock

    fds = [os.open(path, os.O_RDWR) for path in job.counters]
    records: list[Rec] = []
    try:
        with dblock.connect(job.url, table=job.table) as client:
            counted = _Counted(client._store)
            locks = [client.lock(k, ttl=60) for k in job.keys]
            barrier.wait(120)
            end = time.monotonic() + job.duration
            n = 0
            while n < job.max_ops and time.monotonic() < end:
                i = (w + n) % len(locks)
                t_req = time.monotonic()
                locks[i].acquire()
                t_acq = time.monotonic()
                read_modify_write(fds[i])
                t_rel = time.monotonic()
                locks[i].release()
                records.append((w, i, t_req, t_acq, t_rel))
                n += 1
            return {"records": records, **counted.totals()}
    finally:
        for fd in fds:
            os.close(fd)


# -- server-side counts ----------------------------------------------------------------------
class ServerWatch:
    """Connections and statements of one database while a cell runs (see the module doc)."""

    def __init__(self, shared: Targets, backend: str, database: str | None) -> None:
        self.backend, self.database = backend, database
        self.conn = servers.raw(shared, backend) if database else None
        self.ids: set[int] = set()
        self.peak = 0
        self.own = 0  # statements the counting connection sent (MariaDB counts them)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._lock = threading.Lock()

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        assert self.conn is not None
        with self._lock:
            cur = self.conn.cursor()
            cur.execute(sql, params)
            self.own += 1
            return list(cur.fetchall())

    def counters(self) -> tuple[int, int]:
        """(sessions opened so far, statements run so far); MariaDB has no session count."""
        if self.backend == "postgresql":
            ((sessions, xacts),) = self._query(
                "SELECT sessions, xact_commit + xact_rollback FROM pg_stat_database "
                "WHERE datname = %s",
                (self.database,),
            )
            return int(sessions), int(xacts)
        ((_, questions),) = self._query("SHOW GLOBAL STATUS LIKE 'Questions'")
        return 0, int(questions)

    def live(self) -> list[int]:
        if self.backend == "postgresql":
            rows = self._query(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s", (self.database,)
            )
        else:
            rows = self._query(
                "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = %s", (self.database,)
            )
        return [int(r[0]) for r in rows]

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY):
            ids = self.live()
            self.ids.update(ids)
            self.peak = max(self.peak, len(ids))

    def __enter__(self) -> ServerWatch:
        if self.conn is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self.conn is not None:
            self._thread.join(5)

    def settle(self) -> None:
        """Wait (a few seconds at most) until the clients' sessions are gone on the server."""
        if self.conn is None:
            return
        give_up = time.monotonic() + 5
        while self.live() and time.monotonic() < give_up:
            time.sleep(0.05)

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()


def private_database(t: Targets, backend: str, name: str) -> Targets | None:
    """A database of the run's own on the server (PostgreSQL, MariaDB), so that the counts
    are the bench's alone; None if it cannot be made."""
    if backend == "postgresql":
        return servers.private_pg_database(t, name)
    try:
        servers.execute(t, backend, [f"CREATE DATABASE `{name}`"])
    except Exception:
        return None
    p = urlsplit(t.mysql)
    return replace(t, mysql=urlunsplit((p.scheme, p.netloc, "/" + name, p.query, "")))


def drop_database(t: Targets, backend: str, name: str) -> None:
    if backend == "postgresql":
        servers.drop_pg_database(t, name)
    else:
        with contextlib.suppress(Exception):
            servers.execute(t, backend, [f"DROP DATABASE IF EXISTS `{name}`"])


# -- the scenario ----------------------------------------------------------------------------
def scenario_async(backends: list[str], t: Targets, b: Any, tmp: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for backend in [x for x in backends if x in BACKENDS]:
        res: dict[str, Any] = {c: {"repeats": []} for c in CELLS}
        out[backend] = res
        name = f"{t.table}_async"
        mine = private_database(t, backend, name) if backend != "sqlite" else t
        if mine is None:
            res["error"] = "cannot create a private database to count in"
            continue
        try:
            import dblock

            with dblock.connect(mine.url(backend), table=name):
                pass  # the tables exist before either cell starts
            for r in range(b.contended_repeats):
                order = list(CELLS) if r % 2 == 0 else list(CELLS)[::-1]
                for cell in order:
                    rep = run_cell(cell, t, mine, backend, name, b, tmp)
                    res[cell]["repeats"].append(rep)
                    log(
                        f"[async] round {r + 1}/{b.contended_repeats} {backend} {cell}: "
                        f"{rep['throughput']:,.0f}/s p99 {rep['wait_p99_ms']:.1f} ms, "
                        f"{rep['connections']} conn., {rep['statements_per_s']:,.0f} stmt/s"
                        + ("" if rep["exclusive"] else "  FAILING")
                    )
            for cell in CELLS:
                _summarise(res[cell])
        except Exception as exc:
            res["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
            log(f"[async] {backend}: {res['error']}")
        finally:
            if backend == "sqlite":
                pass  # the run's temporary directory goes with it
            else:
                drop_database(t, backend, name)
    return out


def run_cell(
    cell: str, shared: Targets, t: Targets, backend: str, table: str, b: Any, tmp: str
) -> dict[str, Any]:
    """One cell, once: the records' statistics and the counts."""
    keys = [f"bench-async-{uuid.uuid4().hex[:12]}" for _ in range(b.async_keys)]
    counters = [os.path.join(tmp, f"counter-{uuid.uuid4().hex[:8]}") for _ in keys]
    for path in counters:
        new_counter(path)
    url, duration = t.url(backend), b.contended
    job = Job(url, table, keys, counters, duration, b.max_ops)
    database = None if backend == "sqlite" else urlsplit(url).path.lstrip("/")
    watch = ServerWatch(shared, backend, database)
    try:
        idle_rate = 0.0
        if backend == "mysql":  # the rest of the server's load, to subtract
            own, (_, q0) = watch.own, watch.counters()
            time.sleep(1.0)
            _, q1 = watch.counters()
            idle_rate = max(0.0, q1 - q0 - (watch.own - own))
        sessions0, stmts0 = watch.counters() if database else (0, 0)
        own0, t0 = watch.own, time.monotonic()
        with watch:
            if cell == "tasks":
                results = [
                    procs.run_one(tasks_worker, (job, b.async_tasks), timeout=duration + 120)
                ]
                workers = b.async_tasks
            else:
                barrier = procs._CTX.Barrier(b.workers)
                args = [(job, w, barrier) for w in range(b.workers)]
                results = procs.run_parallel(process_worker, args, timeout=duration + 120)
                workers = b.workers
        watch.settle()
        sessions1, stmts1 = watch.counters() if database else (0, 0)
        elapsed = time.monotonic() - t0
        records = [rec for r in results for rec in r["records"]]
        stats = cell_stats(records, workers)
        lost = overlaps = 0
        for i, path in enumerate(counters):
            mine = [(w, a, c, d) for w, k, a, c, d in records if k == i]
            lo, ov = exclusion(mine, read_counter(path))
            lost, overlaps = lost + lo, overlaps + ov
        if backend == "postgresql":
            opened, statements = sessions1 - sessions0, stmts1 - stmts0
        elif backend == "mysql":
            opened = len(watch.ids)
            statements = stmts1 - stmts0 - (watch.own - own0) - round(idle_rate * elapsed)
        else:
            opened = sum(r["connections"] for r in results)
            statements = sum(r["operations"] for r in results)
        window = stats["window_s"]
        return {
            **stats,
            "lost_updates": lost,
            "overlaps": overlaps,
            "exclusive": lost == 0 and overlaps == 0,
            "connections": opened,
            "peak_connections": watch.peak if database else None,
            "statements": max(0, statements),
            "statements_per_s": max(0, statements) / window if window else 0.0,
            "statements_per_section": max(0, statements) / len(records) if records else 0.0,
        }
    finally:
        watch.close()
        for path in counters:
            with contextlib.suppress(OSError):
                os.unlink(path)


def cell_stats(records: list[Rec], workers: int) -> dict[str, Any]:
    """Sections/s over the window, waits, and fairness of the sections per worker."""
    if not records:
        return {"throughput": 0.0, "window_s": 0.0, "sections": 0}
    first = min(r[3] for r in records)
    last = max(r[4] for r in records)
    waits = [r[3] - r[2] for r in records]
    per_worker = [0] * workers
    for r in records:
        per_worker[r[0]] += 1
    total = sum(per_worker)
    squares = sum(x * x for x in per_worker)
    return {
        "sections": len(records),
        "window_s": last - first,
        "throughput": len(records) / max(last - first, 1e-9),
        "wait_p50_ms": percentile(waits, 50) * 1000,
        "wait_p99_ms": percentile(waits, 99) * 1000,
        "fairness": min(per_worker) / max(per_worker) if max(per_worker) else 0.0,
        "jain": total * total / (workers * squares) if squares else 0.0,
    }


_FIELDS = (
    "throughput",
    "wait_p50_ms",
    "wait_p99_ms",
    "fairness",
    "jain",
    "connections",
    "peak_connections",
    "statements_per_s",
    "statements_per_section",
)


def _summarise(v: dict[str, Any]) -> None:
    reps = v["repeats"]
    for field in _FIELDS:
        values = [x[field] for x in reps if x.get(field) is not None]
        v[field] = median(values) if values else None
    v["lost_updates"] = sum(x["lost_updates"] for x in reps)
    v["overlaps"] = sum(x["overlaps"] for x in reps)
    v["exclusive"] = bool(reps) and all(x["exclusive"] for x in reps)


def markdown(res: dict[str, Any], budget: dict[str, Any]) -> list[str]:
    """The scenario's table: per backend, the two cells side by side and their ratio."""
    tasks, procs_n, keys = budget["async_tasks"], budget["workers"], budget["async_keys"]
    lines = [
        f"### (async) {tasks} asyncio tasks on one async client vs {procs_n} blocking "
        f"processes, {keys} keys",
        "",
        "Each section is a read-modify-write of its key's counter file; the cells alternate, "
        f"{budget['contended']:g} s each. Connections: opened during the cell (most open at "
        "once); statements: what the server ran (SQLite: store operations).",
        "",
        "| backend | cell | sections/s | p50 wait ms | p99 wait ms | fairness | Jain "
        "| connections | statements/s | per section | exclusion |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]

    def f(x: Any, fmt: str = ",.0f") -> str:
        return "–" if x is None else format(x, fmt)

    for backend, cells in res.items():
        if "error" in cells:
            lines.append(f"| {backend} | error: {cells['error'][:80]} |||||||||")
            continue
        for cell in CELLS:
            v = cells[cell]
            if not v.get("repeats"):
                continue
            label = f"{tasks} tasks, 1 client" if cell == "tasks" else f"{procs_n} processes"
            peak = "" if v["peak_connections"] is None else f" ({v['peak_connections']:.0f})"
            status = (
                "ok"
                if v["exclusive"]
                else f"**FAILING**: {v['lost_updates']} lost, {v['overlaps']} overlaps"
            )
            lines.append(
                f"| {backend} | {label} | {f(v['throughput'])} | {f(v['wait_p50_ms'], '.1f')} "
                f"| {f(v['wait_p99_ms'], '.1f')} | {f(v['fairness'], '.2f')} "
                f"| {f(v['jain'], '.2f')} | {f(v['connections'])}{peak} "
                f"| {f(v['statements_per_s'])} | {f(v['statements_per_section'], '.2f')} "
                f"| {status} |"
            )
        a, p = cells["tasks"], cells["processes"]
        if a.get("repeats") and p.get("repeats") and p["throughput"]:
            lines.append(
                f"| {backend} | tasks / processes | {a['throughput'] / p['throughput']:.2f}× "
                "|||||||||"
            )
    lines.append("")
    return lines
