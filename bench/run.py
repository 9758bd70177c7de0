"""Run every contender side by side, alternating them round by round; print markdown, write JSON.

    python -m bench                       # everything reachable, full budget (~25-30 min)
    python -m bench --quick               # a smoke run (~2-3 min)
    python -m bench --backends postgresql --scenarios a,b --contenders dblock,floor,pals

Scenarios (issue 6):
  a  uncontended acquire+release pairs/s on one key, one process
  b  8 processes on one key, each section a read-modify-write of a shared counter file; lost
     updates or overlapping holds make a contender FAILING; throughput, p99 wait, fairness
     (fewest/most sections per worker), ideal FIFO wait (workers-1)/throughput and p99/ideal
  c  hand-off: release -> acquisition by the (already blocked) waiter, median and p99
  d  dblock with 10 / 1,000 / 100,000 other keys held: acquire+release rate; list() and
     purge() over 100,000 rows
  e  queries/s issued by 8 blocked waiters while a holder sits on the lock: counted over 5 s,
     from 6 s after they queued
  f  dblock: 8 and 32 threads of one process, each taking and releasing keys of its own, on
     one client whose pool holds at most max_connections (10, the default, and 32) (issue 29)
  g  dblock: 20 threads of one client contend for one key: critical sections/s, with the
     default pool (max_connections 10) and 32 where the store has a pool (issue 49)
  async  dblock: 200 asyncio tasks on one async client vs 8 blocking processes, on the same
     4 keys: throughput, waits, fairness, connections opened, statements the server ran
     (bench/async_contended.py)
  many  dblock: lock_many of 5 keys vs 5 single locks in sorted order vs one single-key lock,
     uncontended, interleaved in one process, beside the store's own 5-key and 1-key steps
     (bench/many.py; issue 47)
  many-contended  dblock: 8 processes taking a random 3 of 10 keys, held 1 ms, with lock_many
     vs per-key locks in sorted order: sets/s, p50/p99 wait, exclusion per key
  guard  dblock: a transaction on the application's own connection writing one row, plain vs
     with lock.guard(conn) first vs a dblock.fencing token-column UPDATE, the lock held:
     transactions/s, the time the guard adds, its round trips (bench/guard.py; issue 50)
  scrape  dblock's metrics with 1,000 / 10,000 / 100,000 keys of distinct prefixes: memory
     kept and scrape time under the prefix cap, and without it (bench/scrape.py; issue 46)
  election  dblock: resign hand-over (leader resigns -> standby's campaign returns) and
     failover (`dblock lead --ttl 3` SIGKILLed -> the next leader's CMD starts) per store,
     beside etcdctl elect and kazoo's Election (bench/election.py; issue 48)
  cold  `dblock run --no-wait KEY -- CMD` from a fresh process, per store: exec to CMD's start
     and to exit, beside flock(1), `python -c pass` and the store's driver connecting and
     running one statement (bench/cold.py; issue 52)
  waiters  dblock: 8, 64 and 512 waiters on one key (asyncio tasks over 8 and 64 processes):
     hand-off median and p99, fairness, client CPU and the server's work per hand-off; with
     `floor`, beside PostgreSQL's and Redis's leanest fair locks and a PostgreSQL doorbell
     lease (bench/waiters.py; issue 52)
  clients  dblock: 8 processes contending on one key, alone, beside 200 processes each taking
     its own key once a second, and beside 200 running their driver's trivial request
     instead: throughput, the server's connections, CPU and work (bench/clients.py; issue 52)

Each measurement runs in fresh forked processes, contenders alternate in every round (the order
rotates each round; (a) interleaves a backend's contenders in 0.1 s slices), figures are
medians of the repeats (the minimum for (e), whose counters only pick up extra noise). A
nice-19 spinner keeps the other core awake throughout.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import (
    async_contended,
    clients,
    cold,
    election,
    guard,
    many,
    observe,
    procs,
    scrape,
    servers,
    waiters,
    workload,
)
from bench.contenders import BACKENDS, TRIP, Contender, Targets, select
from dblock.bench import handoffs, median, new_counter, percentile, read_counter

SCENARIOS = (
    "a",
    "b",
    "c",
    "d",
    "e",
    "f",
    "g",
    "async",
    "obs",
    "scrape",
    "many",
    "many-contended",
    "guard",
    "election",
    "cold",
    "waiters",
    "clients",
)
RESULTS_DIR = Path(__file__).resolve().parent / "results"


@dataclass
class Budget:
    duration: float = 2.0  # (a) window per measurement
    contended: float = 3.0  # (b) window
    handoff: float = 3.0  # (c) window
    repeats: int = 5  # (a) and (d)
    contended_repeats: int = 3  # (b) and (c): each costs process start-up
    max_ops: int = 200_000  # per process and measurement
    workers: int = 8
    hold: float = 5.0  # (e) the window counted while the holder sits on the lock
    #: (e) how long the waiters have been queued when the window starts: their joining is
    #: over, and PostgreSQL has published its counts (a backend reports the statements it ran
    #: within a second of its last report only at its next statement a second or more later,
    #: here the waiters' 3 s refresh, so a shorter settle counts their start-up in the window)
    settle: float = 6.0
    e_repeats: int = 2
    many_keys: tuple[int, ...] = (10, 1_000, 100_000)
    #: (f) threads of one process, and the pool bounds (max_connections) they are run with
    threads: tuple[int, ...] = (8, 32)
    pools: tuple[int, ...] = (10, 32)
    #: (g) threads of one client contending for one key
    contended_threads: int = 20
    handoff_hold: float = 0.01
    pause: float = 0.0  # sleep inside the critical section, between read and write
    #: (async) tasks of the one async client, and the keys both cells contend on
    async_tasks: int = 200
    async_keys: int = 4
    #: (waiters, clients) each cell forks up to 200 processes: fewer repeats
    crowd_repeats: int = 1

    @classmethod
    def quick(cls) -> Budget:
        return cls(
            duration=0.5,
            contended=1.0,
            handoff=1.0,
            repeats=2,
            contended_repeats=1,
            max_ops=2_000,
            hold=2.0,
            settle=1.0,
            e_repeats=1,
            many_keys=(10, 1_000, 10_000),
        )


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _key(tag: str) -> str:
    return f"bench-{tag}-{uuid.uuid4().hex[:12]}"


# -- scenarios ------------------------------------------------------------------------------
def scenario_a(cs: list[Contender], t: Targets, b: Budget) -> dict[str, Any]:
    """Per backend and repeat, one fresh process runs all of that backend's contenders
    interleaved in 0.1 s slices (see workload.uncontended_interleaved)."""
    out: dict[str, Any] = {c.id: {"repeats": []} for c in cs}
    backends = list(dict.fromkeys(c.backend for c in cs))
    for r in range(b.repeats):
        for backend in backends:
            group = workload.rounds([c for c in cs if c.backend == backend], r)
            try:
                res = procs.run_one(
                    workload.uncontended_interleaved,
                    (group, t, b.duration, b.max_ops),
                    timeout=b.duration * len(group) + 120,
                )
            except procs.WorkerError as exc:
                for c in group:
                    out[c.id]["error"] = str(exc).splitlines()[0]
                log(f"[a] {backend}: {str(exc).splitlines()[0]}")
                continue
            for cid, v in res.items():
                if "error" in v:
                    out[cid]["error"] = v["error"]
                    log(f"[a] {cid}: {v['error']}")
                    continue
                out[cid]["repeats"].append(v)
                log(f"[a] round {r + 1}/{b.repeats} {cid}: {v['pairs_per_s']:,.0f} pairs/s")
    for v in out.values():
        rates = [x["pairs_per_s"] for x in v["repeats"]]
        v["pairs_per_s"] = median(rates)
        v["min"] = min(rates) if rates else math.nan
        v["max"] = max(rates) if rates else math.nan
        v["cpu_us_per_pair"] = median([x["cpu_us_per_pair"] for x in v["repeats"]])
    return out


def run_contended(
    c: Contender, t: Targets, b: Budget, workers: int, duration: float, tmp: str
) -> dict[str, Any]:
    counter = os.path.join(tmp, f"counter-{uuid.uuid4().hex[:8]}")
    new_counter(counter)
    key = _key("b")
    barrier = procs._CTX.Barrier(workers)
    args = [(c, t, key, w, counter, barrier, duration, b.max_ops, b.pause) for w in range(workers)]
    try:
        results = procs.run_parallel(workload.contended_worker, args, timeout=duration + 90)
        records = [rec for rs in results for rec in rs]
        stats = workload.contended_stats(records, workers)
        stats.update(workload.check_exclusion(records, read_counter(counter)))
        return stats
    finally:
        os.unlink(counter)


def scenario_b(cs: list[Contender], t: Targets, b: Budget, tmp: str) -> dict[str, Any]:
    locks = [c for c in cs if c.is_lock]
    out: dict[str, Any] = {c.id: {"repeats": []} for c in locks}
    for r in range(b.contended_repeats):
        for c in workload.rounds(locks, r):
            try:
                res = run_contended(c, t, b, b.workers, b.contended, tmp)
            except procs.WorkerError as exc:
                out[c.id]["error"] = str(exc).splitlines()[0]
                log(f"[b] {c.id}: {out[c.id]['error']}")
                continue
            out[c.id]["repeats"].append(res)
            flag = (
                ""
                if res["exclusive"]
                else (f"  FAILING: {res['lost_updates']} lost, {res['overlaps']} overlaps")
            )
            log(
                f"[b] round {r + 1}/{b.contended_repeats} {c.id}: {res['throughput']:,.0f}/s "
                f"p99 {res['wait_p99_ms']:.1f} ms fairness {res['fairness']:.2f}{flag}"
            )
    for v in out.values():
        reps = v["repeats"]
        for field in (
            "throughput",
            "wait_p50_ms",
            "wait_p99_ms",
            "ideal_wait_ms",
            "p99_over_ideal",
            "fairness",
            "handoff_p50_ms",
            "handoff_p99_ms",
        ):
            v[field] = median([x[field] for x in reps if field in x])
        v["lost_updates"] = sum(x.get("lost_updates", 0) for x in reps)
        v["overlaps"] = sum(x.get("overlaps", 0) for x in reps)
        v["exclusive"] = bool(reps) and all(x.get("exclusive") for x in reps)
    return out


def scenario_c(cs: list[Contender], t: Targets, b: Budget, tmp: str) -> dict[str, Any]:
    locks = [c for c in cs if c.is_lock]
    out: dict[str, Any] = {c.id: {"repeats": [], "samples": []} for c in locks}
    reps = b.contended_repeats
    for r in range(reps):
        for c in workload.rounds(locks, r):
            counter = os.path.join(tmp, f"counter-{uuid.uuid4().hex[:8]}")
            new_counter(counter)
            key = _key("c")
            barrier = procs._CTX.Barrier(2)
            seq = procs._CTX.Value("q", 0, lock=False)
            args = [
                (c, t, key, w, counter, barrier, seq, b.handoff, b.max_ops, b.handoff_hold)
                for w in range(2)
            ]
            try:
                results = procs.run_parallel(workload.handoff_worker, args, timeout=b.handoff + 90)
            except procs.WorkerError as exc:
                out[c.id]["error"] = str(exc).splitlines()[0]
                log(f"[c] {c.id}: {out[c.id]['error']}")
                continue
            finally:
                value = read_counter(counter)
                os.unlink(counter)
            records = [rec for rs in results for rec in rs]
            samples = handoffs(records)[1:]  # the first one sets up LISTEN etc.
            excl = workload.check_exclusion(records, value)
            out[c.id]["samples"].extend(samples)
            out[c.id]["repeats"].append(
                {
                    "p50_ms": percentile(samples, 50) * 1000,
                    "p99_ms": percentile(samples, 99) * 1000,
                    "n": len(samples),
                    **excl,
                }
            )
            log(
                f"[c] round {r + 1}/{reps} {c.id}: hand-off p50 "
                f"{percentile(samples, 50) * 1000:.2f} ms, n={len(samples)}"
            )
    for v in out.values():
        samples = v.pop("samples")
        v["p50_ms"] = median([x["p50_ms"] for x in v["repeats"]])
        v["p99_ms"] = percentile(samples, 99) * 1000
        v["n"] = len(samples)
        v["exclusive"] = bool(v["repeats"]) and all(x["exclusive"] for x in v["repeats"])
    return out


def scenario_e(cs: list[Contender], t: Targets, b: Budget) -> dict[str, Any]:
    locks = [c for c in cs if c.is_lock and c.backend in ("postgresql", "mysql", "redis")]
    # (e) counts server queries: ZooKeeper has no such counter here
    out: dict[str, Any] = {c.id: {"repeats": []} for c in locks}
    baselines: dict[str, list[float]] = {}
    settle, window = b.settle, b.hold
    for r in range(b.e_repeats):
        for backend in sorted({c.backend for c in locks}):
            # baseline: the same window with a holder and no waiters (other clients, us)
            anchor = next(c for c in locks if c.backend == backend)
            rate = _waiting_rate(anchor, t, 0, settle, window, b)
            if rate is not None:
                baselines.setdefault(backend, []).append(rate)
                log(f"[e] round {r + 1} {backend} baseline: {rate:.1f} queries/s")
        for c in workload.rounds(locks, r):
            try:
                rate = _waiting_rate(c, t, b.workers, settle, window, b)
            except procs.WorkerError as exc:
                out[c.id]["error"] = str(exc).splitlines()[0]
                continue
            if rate is None:
                out[c.id]["error"] = "a waiter or the holder failed"
                continue
            out[c.id]["repeats"].append(rate)
            log(f"[e] round {r + 1}/{b.e_repeats} {c.id}: {rate:.1f} queries/s")
    for cid, v in out.items():
        backend = cid.split("/", 1)[0]
        base = min(baselines.get(backend, [0.0]))
        raw_rate = min(v["repeats"]) if v["repeats"] else math.nan
        v["raw_qps"] = raw_rate
        v["baseline_qps"] = base
        v["qps"] = max(0.0, raw_rate - base) if not math.isnan(raw_rate) else math.nan
        v["counter"] = servers.QueryCounter.what.get(backend, "")
    return out


def _waiting_rate(
    c: Contender, t: Targets, waiters: int, settle: float, window: float, b: Budget
) -> float | None:
    key = _key("e")
    acquired = procs._CTX.Event()
    release = procs._CTX.Event()
    ready = procs._CTX.Semaphore(0)
    counter = servers.QueryCounter(t, c.backend)
    started = []
    try:
        hold = procs.start_background(workload.holder, (c, t, key, acquired, release, 120.0))
        started.append(hold)
        if not acquired.wait(30):
            return None
        for _ in range(waiters):
            started.append(procs.start_background(workload.waiter, (c, t, key, ready)))
        for _ in range(waiters):
            if not ready.acquire(timeout=30):
                return None
        time.sleep(settle)
        q0, t0 = counter.read(), time.monotonic()
        time.sleep(window)
        q1, t1 = counter.read(), time.monotonic()
        release.set()
        deadline = time.monotonic() + 60
        for p in started:
            p.join(max(0.1, deadline - time.monotonic()))
        if any(p.exitcode != 0 for p in started):
            return None
        return (q1 - q0) / (t1 - t0)
    finally:
        release.set()
        for p in started:
            procs.stop(p, 0.1)
        counter.close()


def scenario_d(backends: list[str], t: Targets, b: Budget) -> dict[str, Any]:
    import dblock

    out: dict[str, Any] = {}
    for backend in [x for x in backends if x in ("postgresql", "mysql", "sqlite")]:
        tables = {n: f"{t.table}_m{n}" for n in b.many_keys}
        res: dict[str, Any] = {"rates": {}, "ratio": math.nan}
        out[backend] = res
        try:
            for n, table in tables.items():
                with dblock.connect(t.url(backend), table=table):
                    pass
                t0 = time.monotonic()
                servers.fill_held(t, backend, table, n)
                log(f"[d] {backend}: {n:,} held keys inserted in {time.monotonic() - t0:.1f} s")
            reps: dict[int, list[float]] = {n: [] for n in tables}
            for r in range(b.repeats):
                order = list(tables.items())
                order = order[r % len(order) :] + order[: r % len(order)]
                for n, table in order:
                    rate = procs.run_one(
                        _many_keys_rate,
                        (t, backend, table, b.duration, b.max_ops),
                        timeout=b.duration + 60,
                    )
                    reps[n].append(rate)
                    log(f"[d] round {r + 1} {backend} {n:,} held: {rate:,.0f} pairs/s")
            for n in tables:
                res["rates"][str(n)] = {"pairs_per_s": median(reps[n]), "repeats": reps[n]}
            lo, hi = min(tables), max(tables)
            res["ratio"] = (
                res["rates"][str(hi)]["pairs_per_s"] / res["rates"][str(lo)]["pairs_per_s"]
            )
            res["held_max"] = hi
            big = tables[hi]
            list_times = []
            with dblock.connect(t.url(backend), table=big) as client:
                for _ in range(3):
                    t0 = time.perf_counter()
                    rows = client.list()
                    list_times.append(time.perf_counter() - t0)
                res["list_rows"] = len(rows)
                res["list_s"] = median(list_times)
                purge_times = []
                for i in range(2 if b.repeats > 2 else 1):
                    if i:
                        servers.fill_held(t, backend, big, hi, prefix=f"again{i}-")
                    servers.expire_all(t, backend, big)
                    t0 = time.perf_counter()
                    purged = client.purge()
                    purge_times.append(time.perf_counter() - t0)
                    res["purged_rows"] = purged
                res["purge_s"] = median(purge_times)
            log(
                f"[d] {backend}: list() of {res['list_rows']:,} rows {res['list_s']:.2f} s, "
                f"purge() of {res['purged_rows']:,} rows {res['purge_s']:.2f} s"
            )
        except Exception as exc:
            res["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
            log(f"[d] {backend}: {res['error']}")
        finally:
            for table in tables.values():
                servers.drop_dblock_tables(t, backend, table)
    return out


def _many_keys_rate(t: Targets, backend: str, table: str, duration: float, max_ops: int) -> float:
    import dblock

    with dblock.connect(t.url(backend), table=table) as client:
        locks = [client.lock(f"free-{i}", ttl=60) for i in range(100)]
        for lk in locks[:20]:
            lk.acquire()
            lk.release()
        n = 0
        start = time.perf_counter()
        end = start + duration
        while n < max_ops:
            lk = locks[n % len(locks)]
            lk.acquire()
            lk.release()
            n += 1
            if time.perf_counter() >= end:
                break
        return n / (time.perf_counter() - start)


def scenario_f(backends: list[str], t: Targets, b: Budget) -> dict[str, Any]:
    """Threads of one process on one client: pairs/s by thread count and pool bound."""
    import dblock

    out: dict[str, Any] = {}
    cells = [(n, pool) for pool in b.pools for n in b.threads]
    for backend in [x for x in backends if x in ("postgresql", "mysql", "sqlite")]:
        table = f"{t.table}_f"
        res: dict[str, Any] = {}
        out[backend] = res
        try:
            with dblock.connect(t.url(backend), table=table):
                pass
            reps: dict[str, list[float]] = {f"{n}/{pool}": [] for n, pool in cells}
            opened: dict[str, int] = {}
            for r in range(b.repeats):
                order = cells[r % len(cells) :] + cells[: r % len(cells)]
                for n, pool in order:
                    rate, peak = procs.run_one(
                        _threads_rate,
                        (t, backend, table, n, pool, b.duration, b.max_ops),
                        timeout=b.duration + 60,
                    )
                    reps[f"{n}/{pool}"].append(rate)
                    opened[f"{n}/{pool}"] = max(opened.get(f"{n}/{pool}", 0), peak)
                    log(
                        f"[f] round {r + 1} {backend} {n} threads, pool {pool}: {rate:,.0f} pairs/s"
                    )
            for cell, rates in reps.items():
                res[cell] = {
                    "pairs_per_s": median(rates),
                    "repeats": rates,
                    "connections": opened[cell],
                }
        except Exception as exc:
            res["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
            log(f"[f] {backend}: {res['error']}")
        finally:
            servers.drop_dblock_tables(t, backend, table)
    return out


def _threads_rate(
    t: Targets, backend: str, table: str, threads: int, pool: int, duration: float, max_ops: int
) -> tuple[float, int]:
    """(pairs/s of all the threads, the most connections the pool had open)."""
    import threading

    import dblock

    with dblock.connect(t.url(backend), table=table, max_connections=pool) as client:
        pooled = client._store
        start_line = threading.Barrier(threads + 1)
        stop = threading.Event()
        counts = [0] * threads
        peak = 0

        def work(i: int) -> None:
            locks = [client.lock(f"f-{i}-{j}", ttl=60) for j in range(4)]
            start_line.wait()
            n = 0
            while not stop.is_set() and n < max_ops // threads:
                lk = locks[n % len(locks)]
                lk.acquire()
                lk.release()
                n += 1
            counts[i] = n

        workers = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(threads)]
        for w in workers:
            w.start()
        start_line.wait()
        start = time.perf_counter()
        end = start + duration
        while time.perf_counter() < end and any(w.is_alive() for w in workers):
            peak = max(peak, getattr(pooled, "_open", 0))
            time.sleep(0.01)
        stop.set()
        for w in workers:
            w.join(30)
        rate = sum(counts) / (time.perf_counter() - start)
        return rate, max(peak, getattr(pooled, "_open", 0))  # the pool keeps what it opened


#: the stores whose clients keep a pool of connections (``max_connections``)
POOLED = ("postgresql", "mysql", "sqlite")


def scenario_g(backends: list[str], t: Targets, b: Budget) -> dict[str, Any]:
    """Threads of one client contending for one key: sections/s by pool bound."""
    import dblock

    out: dict[str, Any] = {}
    for backend in backends:
        pools: tuple[int | None, ...] = b.pools if backend in POOLED else (None,)
        table = f"{t.table}_g"
        res: dict[str, Any] = {}
        out[backend] = res
        try:
            with dblock.connect(t.url(backend), table=table):
                pass
            reps: dict[str, list[float]] = {str(pool or "default"): [] for pool in pools}
            for r in range(b.repeats):
                for pool in pools:
                    rate = procs.run_one(
                        _contended_rate,
                        (t, backend, table, b.contended_threads, pool, b.duration),
                        timeout=b.duration + 60,
                    )
                    reps[str(pool or "default")].append(rate)
                    log(
                        f"[g] round {r + 1} {backend} {b.contended_threads} threads, pool "
                        f"{pool or 'default'}: {rate:,.0f} sections/s"
                    )
            for cell, rates in reps.items():
                res[cell] = {"sections_per_s": median(rates), "repeats": rates}
        except Exception as exc:
            res["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
            log(f"[g] {backend}: {res['error']}")
        finally:
            servers.drop_dblock_tables(t, backend, table)
    return out


def _contended_rate(
    t: Targets, backend: str, table: str, threads: int, pool: int | None, duration: float
) -> float:
    """Critical sections/s of ``threads`` threads of one client on one key."""
    import threading

    import dblock

    options = {} if pool is None else {"max_connections": pool}
    with dblock.connect(t.url(backend), table=table, **options) as client:
        start_line = threading.Barrier(threads + 1)
        stop = threading.Event()
        counts = [0] * threads

        def work(i: int) -> None:
            lock = client.lock("g", ttl=60, timeout=60)
            # one section before the start: the window counts sections, not the opening of
            # the pool's connections (on a loaded machine 20 SQLite connections took all of a
            # 0.3 s window)
            with lock:
                pass
            start_line.wait()
            while not stop.is_set():
                with lock:
                    counts[i] += 1

        workers = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(threads)]
        for w in workers:
            w.start()
        start_line.wait()
        start = time.perf_counter()
        time.sleep(duration)
        stop.set()
        elapsed = time.perf_counter() - start
        done = sum(counts)
        for w in workers:
            w.join(60)
        return done / elapsed


# -- availability ---------------------------------------------------------------------------
def _probe(c: Contender, t: Targets, key: str) -> str:
    adapter = c.factory(t, key)
    try:
        adapter.acquire()
        adapter.release()
    finally:
        adapter.close()
    return "ok"


def check_available(cs: list[Contender], t: Targets) -> tuple[list[Contender], dict[str, str]]:
    ok, unavailable = [], {}
    for c in cs:
        try:
            procs.run_one(_probe, (c, t, _key("probe")), timeout=60)
            ok.append(c)
        except procs.WorkerError as exc:
            msg = str(exc).splitlines()[0].removeprefix("worker 0: ")
            unavailable[c.id] = msg
            log(f"unavailable: {c.id}: {msg}")
    return ok, unavailable


# -- report ---------------------------------------------------------------------------------
def _f(x: Any, fmt: str = ",.0f") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return format(x, fmt)


def _by_name(results: dict[str, Any], backend: str, name: str) -> Any:
    return results.get(f"{backend}/{name}")


_KIND_ORDER = {"dblock": 0, "floor": 1, "peer": 2, "broken": 3}


def _ordered(items: dict[str, Any], kinds: dict[str, Any]) -> list[tuple[str, Any]]:
    """Rows grouped by backend: dblock, then the floors, then the peers."""
    order = [*BACKENDS, "local"]

    def rank(item: tuple[str, Any]) -> tuple[int, int, str]:
        cid = item[0]
        backend = cid.split("/", 1)[0]
        kind = kinds.get(cid, {}).get("kind", "peer")
        b = order.index(backend) if backend in order else len(order)
        return (b, _KIND_ORDER.get(kind, 9), cid)

    return sorted(items.items(), key=rank)


def markdown(report: dict[str, Any]) -> str:
    res = report["results"]
    kinds = report.get("contenders", {})
    lines: list[str] = []
    meta = report["meta"]
    lines.append(f"## dblock benchmark — {meta['started']}")
    lines.append("")
    lines.append(
        f"Machine: {meta['machine']}; Python {meta['python']}; "
        f"{'spinner on' if meta['spinner'] else 'spinner off'}; "
        f"medians of {meta['repeats']} repeats ((b), (c): "
        f"{report['budget']['contended_repeats']}; (e): smallest of "
        f"{report['budget']['e_repeats']}). Servers: "
        + ", ".join(f"{k}: {v}" for k, v in meta["servers"].items())
    )
    lines.append(f"Command: `{meta['command']}`")
    lines.append("")
    if "a" in res:
        lines += ["### (a) uncontended acquire+release, one process", ""]
        lines.append(
            "| backend | contender | pairs/s | range | vs 2×SELECT 1 | vs 1×SELECT 1 "
            "| vs lock-table floor | client CPU µs/pair |"
        )
        lines.append("|---|---|---:|---:|---:|---:|---:|---:|")
        for cid, v in _ordered(res["a"], kinds):
            backend, name = cid.split("/", 1)
            x2 = _by_name(
                res["a"],
                backend,
                "floor: " + TRIP.get(backend, "SELECT 1") + " x2",
            )
            x1 = _by_name(
                res["a"],
                backend,
                "floor: " + TRIP.get(backend, "SELECT 1") + " x1",
            )
            fl = _by_name(res["a"], backend, "floor: lock table")
            rate = v.get("pairs_per_s", math.nan)

            def ratio(other: Any, rate: float = rate) -> str:
                if not other or not other.get("pairs_per_s"):
                    return "–"
                return _f(rate / other["pairs_per_s"], ".2f") + "×"

            rng = (
                f"{_f(v.get('min'))}–{_f(v.get('max'))}" if v.get("repeats") else v.get("error", "")
            )
            lines.append(
                f"| {backend} | {name} | {_f(rate)} | {rng} | {ratio(x2)} | {ratio(x1)} "
                f"| {ratio(fl)} | {_f(v.get('cpu_us_per_pair', math.nan))} |"
            )
        lines.append("")
    if "b" in res:
        lines += [
            f"### (b) {report['budget']['workers']} processes on one key, read-modify-write "
            "of a shared counter",
            "",
            "| backend | contender | sections/s | p50 wait ms | p99 wait ms | ideal ms "
            "| p99/ideal | fairness | hand-off p50 ms | exclusion |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for cid, v in _ordered(res["b"], kinds):
            backend, name = cid.split("/", 1)
            if "error" in v and not v["repeats"]:
                status = "error: " + v["error"][:80]
            else:
                status = workload.exclusion_status(v)
            lines.append(
                f"| {backend} | {name} | {_f(v.get('throughput'))} "
                f"| {_f(v.get('wait_p50_ms'), '.1f')} "
                f"| {_f(v.get('wait_p99_ms'), '.1f')} | {_f(v.get('ideal_wait_ms'), '.1f')} "
                f"| {_f(v.get('p99_over_ideal'), '.1f')}× | {_f(v.get('fairness'), '.2f')} "
                f"| {_f(v.get('handoff_p50_ms'), '.2f')} | {status} |"
            )
        lines.append("")
    if "c" in res:
        lines += [
            "### (c) hand-off: release → acquisition by the blocked waiter",
            "",
            "| backend | contender | median ms | p99 ms | samples |",
            "|---|---|---:|---:|---:|",
        ]
        for cid, v in _ordered(res["c"], kinds):
            backend, name = cid.split("/", 1)
            extra = "" if v.get("exclusive", True) else " **FAILING**"
            if "error" in v and not v["repeats"]:
                extra = " error: " + v["error"][:80]
            lines.append(
                f"| {backend} | {name} | {_f(v.get('p50_ms'), '.2f')} "
                f"| {_f(v.get('p99_ms'), '.2f')} "
                f"| {v.get('n', 0)}{extra} |"
            )
        lines.append("")
    if "d" in res:
        lines += ["### (d) dblock with many keys held", ""]
        sizes = report["budget"]["many_keys"]
        lines.append(
            "| backend | "
            + " | ".join(f"pairs/s, {n:,} held" for n in sizes)
            + f" | {sizes[-1]:,}/{sizes[0]:,} | list() s | purge() s |"
        )
        lines.append("|---|" + "---:|" * (len(sizes) + 3))
        for backend, v in res["d"].items():
            if "error" in v:
                lines.append(f"| {backend} | error: {v['error'][:100]} |")
                continue
            cells = " | ".join(_f(v["rates"][str(n)]["pairs_per_s"]) for n in sizes)
            lines.append(
                f"| {backend} | {cells} | {_f(v['ratio'], '.2f')}× | "
                f"{_f(v.get('list_s'), '.2f')} ({v.get('list_rows', 0):,} rows) | "
                f"{_f(v.get('purge_s'), '.2f')} ({v.get('purged_rows', 0):,} rows) |"
            )
        lines.append("")
    if "f" in res:
        threads, pools = report["budget"]["threads"], report["budget"]["pools"]
        lines += [
            "### (f) dblock: threads of one process on one client, by pool bound",
            "",
            "Pairs/s of all the threads together (each on keys of its own), the median of the "
            "repeats; in brackets their range and the most connections the pool had open.",
            "",
            "| backend | max_connections | "
            + " | ".join(f"{n} threads" for n in threads)
            + f" | {threads[-1]}/{threads[0]} |",
            "|---|---:|" + "---:|" * (len(threads) + 1),
        ]
        for backend, v in res["f"].items():
            if "error" in v:
                lines.append(f"| {backend} | error: {v['error'][:100]} |")
                continue
            for pool in pools:
                row = [v[f"{n}/{pool}"] for n in threads]
                cells = " | ".join(
                    f"{_f(c['pairs_per_s'])} ({_f(min(c['repeats']))}–{_f(max(c['repeats']))}; "
                    f"{c['connections']} conn.)"
                    for c in row
                )
                ratio = row[-1]["pairs_per_s"] / row[0]["pairs_per_s"]
                lines.append(f"| {backend} | {pool} | {cells} | {ratio:.2f}× |")
        lines.append("")
    if "g" in res:
        lines += [
            f"### (g) dblock: {report['budget']['contended_threads']} threads of one client on "
            "one key",
            "",
            "Critical sections/s of all the threads together, the median of the repeats (their "
            "range in brackets), by the pool bound where the store's client keeps a pool.",
            "",
            "| backend | max_connections | sections/s |",
            "|---|---:|---:|",
        ]
        for backend, v in res["g"].items():
            if "error" in v:
                lines.append(f"| {backend} | error: {v['error'][:100]} |")
                continue
            for cell, c in v.items():
                lines.append(
                    f"| {backend} | {cell} | {_f(c['sections_per_s'])} "
                    f"({_f(min(c['repeats']))}–{_f(max(c['repeats']))}) |"
                )
        lines.append("")
    if "e" in res:
        lines += [
            f"### (e) waiting cost: {report['budget']['workers']} blocked waiters, holder sits "
            f"{report['budget']['hold']:g} s",
            "",
            f"Counted over {report['budget']['hold']:g} s, from "
            f"{report['budget']['settle']:g} s after the last waiter started waiting. "
            f"PostgreSQL counted in {report.get('e_postgresql_database', '?')}; MariaDB and "
            "Redis counters are server-wide: the smallest of the repeats, minus a baseline "
            "window with the holder alone.",
            "",
            "| backend | contender | queries/s (net) | measured | baseline | counter |",
            "|---|---|---:|---:|---:|---|",
        ]
        for cid, v in _ordered(res["e"], kinds):
            backend, name = cid.split("/", 1)
            err = f" error: {v['error'][:60]}" if "error" in v and not v["repeats"] else ""
            lines.append(
                f"| {backend} | {name} | {_f(v.get('qps'), '.1f')}{err} "
                f"| {_f(v.get('raw_qps'), '.1f')} "
                f"| {_f(v.get('baseline_qps'), '.1f')} | {v.get('counter', '')} |"
            )
        lines.append("")
    if "async" in res:
        lines += async_contended.markdown(res["async"], report["budget"])
    if "obs" in res:
        lines += observe.markdown(res["obs"])
    if "scrape" in res:
        lines += scrape.markdown(res["scrape"])
    if "many" in res:
        lines += many.markdown_many(res["many"], report["budget"]["repeats"])
    if "many-contended" in res:
        lines += many.markdown_contended(res["many-contended"], report["budget"])
    if "guard" in res:
        lines += guard.markdown(res["guard"], report["budget"]["repeats"])
    if "election" in res:
        lines += election.markdown(res["election"], report["budget"])
    if "cold" in res:
        lines += cold.markdown(res["cold"])
    if "waiters" in res:
        lines += waiters.markdown(res["waiters"])
    if "clients" in res:
        lines += clients.markdown(res["clients"])
    if report.get("unavailable"):
        lines += ["### Not run", ""]
        for cid, why in report["unavailable"].items():
            lines.append(f"- {cid}: {why}")
        lines.append("")
    if report.get("targets"):
        lines += [
            "### Targets (issue 6: dblock, default lock; (many): issue 47; (guard): issue 50; "
            "(election): issue 48; (cold): issue 52)",
            "",
            "| target | measured | met |",
            "|---|---|---|",
        ]
        for tg in report["targets"]:
            met = {True: "yes", False: "**no**", None: "n/a"}[tg["met"]]
            lines.append(f"| {tg['target']} | {tg['measured']} | {met} |")
        lines.append("")
    return "\n".join(lines)


def evaluate_targets(res: dict[str, Any], contenders: list[Contender]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def add(target: str, measured: str, met: bool | None) -> None:
        out.append({"target": target, "measured": measured, "met": met})

    peers = {c.id for c in contenders if c.kind == "peer"}
    for backend in ("postgresql", "mysql", "sqlite", "redis", "zookeeper", "etcd"):
        me = f"{backend}/dblock"
        a = res.get("a", {})
        if me in a and not math.isnan(a[me].get("pairs_per_s", math.nan)):
            rate = a[me]["pairs_per_s"]
            fl = a.get(f"{backend}/floor: lock table", {}).get("pairs_per_s")
            if fl:
                add(
                    f"(a) {backend}: ≥ 0.9× lock-table floor", f"{rate / fl:.2f}×", rate / fl >= 0.9
                )
            for pid in sorted(p for p in peers if p.startswith(backend + "/") and p in a):
                pr = a[pid].get("pairs_per_s")
                if pr and not math.isnan(pr):
                    want = 1.0 if backend == "zookeeper" else 1.3  # issue 26's for ZooKeeper
                    add(
                        f"(a) {backend}: ≥ {want:.1f}× {pid.split('/', 1)[1]}",
                        f"{rate / pr:.2f}×",
                        rate / pr >= want,
                    )
        b = res.get("b", {})
        if me in b and b[me].get("repeats"):
            v = b[me]
            out += _contended_targets(backend, v, 0.95 if backend == "zookeeper" else 0.9)
            best = max(
                (
                    b[p]["throughput"]
                    for p in peers
                    if p.startswith(backend + "/") and p in b and b[p].get("exclusive")
                ),
                default=None,
            )
            if best:
                need = 1.3 if backend == "redis" else 1.0  # issue 24's target for Redis
                add(
                    f"(b) {backend}: ≥ {need:.1f}× best database peer throughput",
                    f"{v['throughput'] / best:.2f}×",
                    v["throughput"] / best >= need,
                )
                ceiling = b.get(f"{backend}/floor: FIFO ticket lock", {}).get("throughput")
                if ceiling:  # what any lock that hands over in turn could reach here
                    add(
                        f"(b) {backend}: (the FIFO ticket floor: best peer × …)",
                        f"{ceiling / best:.2f}×",
                        None,
                    )
        c = res.get("c", {})
        if me in c and c[me].get("repeats"):
            p50 = c[me]["p50_ms"]
            if backend in ("postgresql", "redis"):
                limit = 2.0 if backend == "postgresql" else 1.0
                add(f"(c) {backend}: hand-off median < {limit:g} ms", f"{p50:.2f} ms", p50 < limit)
            else:
                best_c = min(
                    (
                        c[p]["p50_ms"]
                        for p in peers
                        if p.startswith(backend + "/") and p in c and c[p].get("repeats")
                    ),
                    default=None,
                )
                add(
                    f"(c) {backend}: hand-off median ≤ 2× best peer",
                    f"{p50:.2f} ms" + (f" vs {best_c:.2f} ms" if best_c else " (no peer)"),
                    None if best_c is None else p50 <= 2 * best_c,
                )
        d = res.get("d", {}).get(backend)
        if d and "ratio" in d and not math.isnan(d["ratio"]):
            add(
                f"(d) {backend}: rate at {d.get('held_max', 0):,} held ≥ 0.7× rate at 10",
                f"{d['ratio']:.2f}×",
                d["ratio"] >= 0.7,
            )
        e = res.get("e", {})
        if me in e and e[me].get("repeats"):
            q = e[me]["qps"]
            add(
                f"(e) {backend}: queries/s of 8 blocked waiters"
                + (" ≤ 10" if backend == "postgresql" else " (bounded, documented)"),
                f"{q:.1f}/s",
                q <= 10 if backend == "postgresql" else None,
            )
    out += _session_targets(res)
    out += _redis_floor_targets(res)
    if "obs" in res:
        out += observe.targets(res["obs"])
    if "scrape" in res:
        out += scrape.targets(res["scrape"])
    if "many" in res:
        out += many.targets(res["many"])
    if "guard" in res:
        out += guard.targets(res["guard"])
    if "election" in res:
        out += election.targets(res["election"])
    if "cold" in res:
        out += cold.targets(res["cold"])
    if "waiters" in res:
        out += waiters.targets(res["waiters"])
    if "clients" in res:
        out += clients.targets(res["clients"])
    return out


def _contended_targets(label: str, v: dict[str, Any], fair: float) -> list[dict[str, Any]]:
    """(b)'s targets every lock has: exclusion, fairness >= ``fair``, p99 <= 2x ideal FIFO."""
    return [
        {
            "target": f"(b) {label}: zero lost updates",
            "measured": f"{v['lost_updates']} lost, {v['overlaps']} overlaps",
            "met": v["exclusive"],
        },
        {
            "target": f"(b) {label}: fairness ≥ {fair:g}",
            "measured": f"{v['fairness']:.2f}",
            "met": v["fairness"] >= fair,
        },
        {
            "target": f"(b) {label}: p99 wait ≤ 2× ideal FIFO wait",
            "measured": f"{v['p99_over_ideal']:.1f}×",
            "met": v["p99_over_ideal"] <= 2.0,
        },
    ]


#: the Redis floors under dblock, each one layer less of it: what its server side allows (its
#: functions by hand), then its store's calls without the ``Lock`` and the engine
_DBLOCK_LAYERS = ("dblock's scripts by hand", "dblock's store calls")


def _redis_floor_targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 52's last steps to the floors on Redis: uncontended against redis-py's ``Lock``,
    contended against the FIFO ticket floor (its throughput and p99 wait)."""
    out: list[dict[str, Any]] = []

    def add(target: str, measured: str, met: bool | None) -> None:
        out.append({"target": f"{target} (issue 52)", "measured": measured, "met": met})

    a, b = res.get("a", {}), res.get("b", {})
    me, plain, fifo = "redis/dblock", "redis/redis-py Lock", "redis/floor: FIFO ticket lock"
    rate, peer = a.get(me, {}).get("pairs_per_s"), a.get(plain, {}).get("pairs_per_s")
    if rate and peer and not math.isnan(rate) and not math.isnan(peer):
        add("(a) redis: ≥ 0.95× redis-py Lock", f"{rate / peer:.2f}×", rate / peer >= 0.95)
        for name in _DBLOCK_LAYERS:
            under = a.get(f"redis/floor: {name}", {}).get("pairs_per_s")
            if under and not math.isnan(under):
                add(
                    f"(a) redis: ({name} ÷ redis-py Lock; dblock ÷ them)",
                    f"{under / peer:.2f}×; {rate / under:.2f}×",
                    None,
                )
    v, floor = b.get(me, {}), b.get(fifo, {})
    if v.get("repeats") and floor.get("repeats") and floor.get("throughput"):
        ratio = v["throughput"] / floor["throughput"]
        add("(b) redis: ≥ 0.9× the FIFO ticket floor", f"{ratio:.2f}×", ratio >= 0.9)
        for name in _DBLOCK_LAYERS:
            under = b.get(f"redis/floor: {name}", {}).get("throughput")
            if under:
                add(
                    f"(b) redis: ({name} ÷ the FIFO ticket floor; dblock ÷ them)",
                    f"{under / floor['throughput']:.2f}×; {v['throughput'] / under:.2f}×",
                    None,
                )
        mine, theirs = v["wait_p99_ms"], floor["wait_p99_ms"]
        add(
            "(b) redis: p99 wait ≤ 1.1× the FIFO ticket floor's",
            f"{mine:.1f} ms vs {theirs:.1f} ms",
            mine <= 1.1 * theirs,
        )
    return out


#: the server's own lock, raw, per backend: what a session hold is measured against
_RAW_LOCK = {"postgresql": "pg_advisory_lock", "mysql": "GET_LOCK"}


def _session_targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 28's targets for ``ttl=None`` (the server's own lock): against the raw lock and
    the best tooz driver of the store, uncontended (a) and 8 processes on one key (b)."""
    out: list[dict[str, Any]] = []

    def add(target: str, measured: str, met: bool | None) -> None:
        out.append({"target": target, "measured": measured, "met": met})

    for backend, raw in _RAW_LOCK.items():
        me = f"{backend}/dblock session"
        a, b = res.get("a", {}), res.get("b", {})
        tooz = [p for p in sorted({*a, *b}) if p.startswith(f"{backend}/tooz")]
        hand = f"{backend}/floor: session SQL by hand"
        if me in a and not math.isnan(a[me].get("pairs_per_s", math.nan)):
            rate = a[me]["pairs_per_s"]
            by_hand_a = a.get(hand, {}).get("pairs_per_s")
            if by_hand_a:  # issue 52: what dblock's Python costs over its own statements
                add(
                    f"(a) {backend} session: ≥ 0.9× its SQL by hand",
                    f"{rate / by_hand_a:.2f}×",
                    rate / by_hand_a >= 0.9,
                )
                store_a = a.get(f"{backend}/floor: session store calls", {}).get("pairs_per_s")
                if store_a:  # the layers between: the store's calls alone, then the Lock's
                    add(
                        f"(a) {backend} session: (its store's calls alone ÷ its SQL by hand)",
                        f"{store_a / by_hand_a:.2f}×",
                        None,
                    )
            best = max((a[p]["pairs_per_s"] for p in tooz if p in a), default=None)
            if best:
                add(
                    f"(a) {backend} session: ≥ 1.3× tooz", f"{rate / best:.2f}×", rate / best >= 1.3
                )
        if me in b and b[me].get("repeats"):
            v = b[me]
            out += _contended_targets(f"{backend} session", v, 0.9)
            rate = v["throughput"]
            by_hand_b = b.get(hand, {}).get("throughput")
            if by_hand_b:
                add(
                    f"(b) {backend} session: ≥ 0.9× its SQL by hand",
                    f"{rate / by_hand_b:.2f}×",
                    rate / by_hand_b >= 0.9,
                )
                store_b = b.get(f"{backend}/floor: session store calls", {}).get("throughput")
                if store_b:
                    add(
                        f"(b) {backend} session: (its store's calls alone ÷ its SQL by hand)",
                        f"{store_b / by_hand_b:.2f}×",
                        None,
                    )
            best = max(
                (b[p]["throughput"] for p in tooz if p in b and b[p].get("exclusive")), default=None
            )
            if best:
                add(
                    f"(b) {backend} session: ≥ 1.3× tooz", f"{rate / best:.2f}×", rate / best >= 1.3
                )
            floor = b.get(f"{backend}/{raw}", {}).get("throughput")
            if floor:
                add(
                    f"(b) {backend} session: ≥ 0.8× raw {raw}",
                    f"{rate / floor:.2f}×",
                    rate / floor >= 0.8,
                )
                if by_hand_b:  # the server's share of a session hold, without dblock's Python
                    add(
                        f"(b) {backend} session: (its SQL by hand: raw {raw} × …)",
                        f"{by_hand_b / floor:.2f}×",
                        None,
                    )
    return out


# -- main -----------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="a small budget (smoke run)")
    p.add_argument("--duration", type=float, help="seconds per measurement window (a, b, c, d)")
    p.add_argument("--repeats", type=int, help="repeats per contender (medians are quoted)")
    p.add_argument("--max-ops", type=int, help="cap on operations per process and measurement")
    p.add_argument("--workers", type=int, help="processes in (b) and waiters in (e) (default 8)")
    p.add_argument("--hold", type=float, help="(e): seconds the holder sits on the lock")
    p.add_argument(
        "--settle", type=float, help="(e): seconds the waiters wait before counting (default 6)"
    )
    p.add_argument("--many-keys", help="(d): held-key counts, e.g. 10,1000,100000")
    p.add_argument("--backends", help=f"comma list of {', '.join(BACKENDS)} (default: all)")
    p.add_argument(
        "--scenarios", default=",".join(SCENARIOS), help=f"comma list of {','.join(SCENARIOS)}"
    )
    p.add_argument("--async-tasks", type=int, help="(async): tasks on the one client (200)")
    p.add_argument("--async-keys", type=int, help="(async): keys both cells contend on (4)")
    p.add_argument(
        "--contenders",
        help="comma list of names or parts of names (e.g. dblock,floor,tooz,pals,peers)",
    )
    p.add_argument(
        "--section-pause",
        type=float,
        help="(b): seconds to sleep between the read and the write of the counter (default 0)",
    )
    p.add_argument("--no-spinner", action="store_true", help="do not keep the other core busy")
    p.add_argument("--pg-url", default=os.environ.get("DBLOCK_TEST_POSTGRESQL_URL"))
    p.add_argument("--mysql-url", default=os.environ.get("DBLOCK_TEST_MYSQL_URL"))
    p.add_argument("--redis-url", default=os.environ.get("DBLOCK_BENCH_REDIS_URL"))
    p.add_argument("--zookeeper-url", default=os.environ.get("DBLOCK_BENCH_ZOOKEEPER_URL"))
    p.add_argument("--etcd-url", default=os.environ.get("DBLOCK_BENCH_ETCD_URL"))
    p.add_argument("--json", help="where to write the JSON (default bench/results/<time>.json)")
    p.add_argument("--markdown", help="also write the markdown table to this file")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    budget = Budget.quick() if args.quick else Budget()
    if args.duration is not None:
        budget.duration = budget.contended = budget.handoff = args.duration
    if args.repeats is not None:
        budget.repeats = max(1, args.repeats)
        budget.e_repeats = max(1, min(budget.e_repeats, args.repeats))
        budget.contended_repeats = max(1, args.repeats)
    if args.max_ops is not None:
        budget.max_ops = max(1, args.max_ops)
    if args.workers is not None:
        budget.workers = max(2, args.workers)
    if args.hold is not None:
        budget.hold = max(0.5, args.hold)
    if args.settle is not None:
        budget.settle = max(0.0, args.settle)
    if args.section_pause is not None:
        budget.pause = max(0.0, args.section_pause)
    if args.async_tasks is not None:
        budget.async_tasks = max(1, args.async_tasks)
    if args.async_keys is not None:
        budget.async_keys = max(1, args.async_keys)
    if args.many_keys:
        budget.many_keys = tuple(int(x) for x in args.many_keys.split(","))
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    bad = [s for s in scenarios if s not in SCENARIOS]
    if bad:
        print(f"unknown scenario(s) {bad}; choose from {','.join(SCENARIOS)}", file=sys.stderr)
        return 2
    backends = [b.strip() for b in (args.backends or ",".join(BACKENDS)).split(",") if b.strip()]
    names = [n.strip() for n in args.contenders.split(",")] if args.contenders else None
    run_id = uuid.uuid4().hex[:8]
    tmp = tempfile.mkdtemp(prefix="dblock-bench-")
    defaults = Targets()
    targets = Targets(
        postgresql=args.pg_url or defaults.postgresql,
        mysql=args.mysql_url or defaults.mysql,
        redis=args.redis_url or defaults.redis,
        zookeeper=args.zookeeper_url or defaults.zookeeper,
        etcd=args.etcd_url or defaults.etcd,
        sqlite_dir=tmp,
        table=f"dblock_bench_{run_id}",
        floor_table=f"dblock_bench_floor_{run_id}",
    )
    try:
        return run(targets, budget, backends, scenarios, names, args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the run's SQLite files and counters


def run(
    t: Targets,
    budget: Budget,
    backends: list[str],
    scenarios: list[str],
    names: list[str] | None,
    args: argparse.Namespace,
    tmp: str,
) -> int:
    procs.install_signal_handlers()
    started = dt.datetime.now(dt.timezone.utc)
    unavailable: dict[str, str] = {}
    live_backends = []
    for backend in backends:
        why = servers.reachable(t, backend) if backend != "sqlite" else None
        if why is None:
            live_backends.append(backend)
        else:
            unavailable[backend] = f"server unreachable ({why})"
            log(f"skipping {backend}: unreachable ({why})")
    contenders = select([*live_backends, "local"], names)
    report: dict[str, Any] = {}
    private_db = False
    try:
        for backend in live_backends:
            servers.create_floor_table(t, backend)
        contenders, more = check_available(contenders, t)
        unavailable.update(more)
        results: dict[str, Any] = {}
        with procs.spinner(not args.no_spinner):
            if "a" in scenarios:
                results["a"] = scenario_a(contenders, t, budget)
            if "b" in scenarios:
                results["b"] = scenario_b(contenders, t, budget, tmp)
            if "c" in scenarios:
                results["c"] = scenario_c(contenders, t, budget, tmp)
            if "e" in scenarios:
                e_targets = t
                if "postgresql" in live_backends:
                    e_targets = servers.private_pg_database(t, t.table) or t
                    private_db = e_targets is not t
                results["e"] = scenario_e(contenders, e_targets, budget)

            if "d" in scenarios and (names is None or any("dblock" in n for n in names)):
                results["d"] = scenario_d(live_backends, t, budget)
            if "f" in scenarios and (names is None or any("dblock" in n for n in names)):
                results["f"] = scenario_f(live_backends, t, budget)
            if "g" in scenarios and (names is None or any("dblock" in n for n in names)):
                results["g"] = scenario_g(live_backends, t, budget)
            if "async" in scenarios and (names is None or any("dblock" in n for n in names)):
                results["async"] = async_contended.scenario_async(live_backends, t, budget, tmp)
            if "obs" in scenarios and (names is None or any("dblock" in n for n in names)):
                results["obs"] = observe.scenario_obs(live_backends, t, budget)
            if "scrape" in scenarios and (names is None or any("dblock" in n for n in names)):
                results["scrape"] = scrape.scenario_scrape(quick=args.quick)
            if "many" in scenarios and (names is None or any("dblock" in n for n in names)):
                results["many"] = many.scenario_many(live_backends, t, budget)
            if "many-contended" in scenarios and (
                names is None or any("dblock" in n for n in names)
            ):
                results["many-contended"] = many.scenario_many_contended(
                    live_backends, t, budget, tmp
                )
            if "guard" in scenarios and (names is None or any("dblock" in n for n in names)):
                results["guard"] = guard.scenario_guard(live_backends, t, budget)
            if "election" in scenarios and (names is None or any(_election_side(n) for n in names)):
                peers = names is None or any(_election_side(n) == "peer" for n in names)
                results["election"] = election.scenario_election(
                    live_backends, t, budget, tmp, peers
                )
            if "cold" in scenarios and (names is None or any("dblock" in n for n in names)):
                results["cold"] = cold.scenario_cold(live_backends, t, budget, tmp)
            floors = names is None or any("floor" in n.lower() for n in names)
            mine = names is None or any("dblock" in n for n in names)
            if "waiters" in scenarios and (mine or floors):
                results["waiters"] = waiters.scenario_waiters(
                    live_backends, t, budget, tmp, budget.crowd_repeats, dblock=mine, floors=floors
                )
            if "clients" in scenarios and (names is None or any("dblock" in n for n in names)):
                results["clients"] = clients.scenario_clients(
                    live_backends, t, budget, tmp, budget.crowd_repeats
                )
        report = {
            "meta": _meta(t, live_backends, started, budget, not args.no_spinner),
            "budget": {
                **asdict(budget),
                "many_keys": list(budget.many_keys),
                "threads": list(budget.threads),
                "pools": list(budget.pools),
                "contended_threads": budget.contended_threads,
            },
            "contenders": {
                c.id: {"kind": c.kind, "backend": c.backend, "note": c.note} for c in contenders
            },
            "unavailable": unavailable,
            "e_postgresql_database": (
                f"private database {t.table} (pg_stat_database counts only the bench)"
                if private_db
                else "the shared database (other clients add noise)"
            ),
            "results": results,
        }
        report["targets"] = evaluate_targets(results, contenders)
    except KeyboardInterrupt:
        log("interrupted: cleaning up")
        return 130
    finally:
        procs.kill_all()
        if private_db:
            servers.drop_pg_database(t, t.table)
        for backend in live_backends:
            servers.drop_floor_table(t, backend)
            if backend != "redis":
                servers.drop_dblock_tables(t, backend, t.table)
    text = markdown(report)
    print(text)
    path = (
        Path(args.json)
        if args.json
        else RESULTS_DIR / ("bench-" + started.strftime("%Y%m%d-%H%M%S") + ".json")
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_clean(report), indent=2, default=str) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    log(f"JSON written to {path}")
    failing = (
        [
            cid
            for cid, v in report["results"].get("b", {}).items()
            if v.get("repeats") and not v["exclusive"] and not cid.startswith("local/")
        ]
        + [
            f"{backend}/{cell}"
            for backend, cells in report["results"].get("async", {}).items()
            for cell in async_contended.CELLS
            if cells.get(cell, {}).get("repeats") and not cells[cell]["exclusive"]
        ]
        + many.failing(report["results"].get("many-contended", {}))
    )
    return 1 if failing else 0


def _election_side(name: str) -> str | None:
    """What a --contenders name picks in the election scenario: dblock's, the peers', or
    neither."""
    n = name.lower()
    if "dblock" in n:
        return "dblock"
    if n in ("peer", "peers") or "etcdctl" in n or "kazoo" in n:
        return "peer"
    return None


def _clean(x: Any) -> Any:
    """NaN (no samples) becomes null: strict JSON."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def _meta(
    t: Targets, backends: list[str], started: dt.datetime, b: Budget, spinner: bool
) -> dict[str, Any]:
    import importlib.metadata as md

    versions = {}
    for dist in (
        "dblock",
        "psycopg",
        "psycopg-binary",
        "PyMySQL",
        "psycopg2-binary",
        "redis",
        "tooz",
        "pals",
        "sherlock",
        "python-redis-lock",
        "SQLAlchemy",
        "kazoo",
        "etcd-sdk-python",
        "etcd3gw",
    ):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            versions[dist] = None
    try:
        import psycopg

        versions["psycopg.pq.__impl__"] = psycopg.pq.__impl__
    except ImportError:
        pass
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "started": started.isoformat(timespec="seconds"),
        "machine": f"{platform.system()} {platform.release()}, {os.cpu_count()} cores, {cpu}",
        "python": platform.python_version(),
        "command": "python -m bench " + " ".join(sys.argv[1:]),
        "spinner": spinner,
        "repeats": b.repeats,
        "servers": {x: servers.version(t, x) for x in backends},
        "versions": versions,
    }


if __name__ == "__main__":
    raise SystemExit(main())
