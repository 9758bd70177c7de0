"""Scenario ``clients``: many clients (issue 52, point 2).

Per store, two cells of the same window alternate (alone, crowd, crowd, alone): **alone**, 8
processes contend on one key (a blocking client each; every section a read-modify-write of a
counter file, FAILING on a lost update or an overlap); **crowd**, the same 8 beside 200 more
processes, each holding a client of its own and taking its own key once a second (a random
phase each, so their takes spread over the second). The crowd is forked, connected and has
taken its key once before the window starts, and stays until it ends. A third cell, **floor**,
runs the same crowd with the store's least lock instead of dblock (``FLOOR_LOCK``: the
hand-written durable lock table on the SQL stores, redis-py's ``Lock``, kazoo's ``Lock``,
the etcd driver's own ``Lock``): what such a crowd costs the 8 whatever takes the keys. On
PostgreSQL two more: **waited**, a crowd each of whose clients first waited once for its key (so
it opened a connection to listen for wake-ups), measured at once; and **idled**, the same
crowd measured ``Listener.idle_close`` + 1 s later, when unused listeners have closed.

Reported per cell (medians of the repeats): the contenders' sections/s and p99 wait, and what
the crowd costs them (crowd ÷ alone); the server's connections (the most seen, sampled every
0.25 s), its CPU (cores: CPU seconds per second of the window, its whole process tree) and the
work it counted per second (``bench/crowd_servers.py``); the crowd's own takes per second.
PostgreSQL, MariaDB and ZooKeeper run on private servers that take the connections.

Where PostgreSQL's cost would grow: a NOTIFY signals every backend of the database that
LISTENs, and each of them runs a transaction to read it. A dblock client LISTENs only once it
has waited (its listener is made on first use), so a crowd that takes free keys adds no
listener; one that waited closes its listener once unused for ``Listener.idle_close`` s
(the waited and idled cells).
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from bench import procs, servers
from bench.contenders import Targets, select
from bench.crowd_servers import (
    Work,
    connections,
    each_store,
    fmt,
    listener_pid,
    log,
    port_of,
    summarise,
    tree_cpu,
)
from dblock.bench import exclusion, new_counter, percentile, read_counter, read_modify_write
from dblock.stores._listener import Listener

CROWD = 200
CONTENDERS = 8
CELLS = ("alone", "crowd", "floor", "waited", "idled")
#: where a listening connection costs every other client: PostgreSQL signals each LISTENing
#: backend of the database at every NOTIFY (Redis only those subscribed to its channel)
LISTENING = ("postgresql",)
#: target: the contenders keep this share of their throughput beside the crowd
KEEP = 0.8


@dataclass(frozen=True)
class Job:
    url: str
    table: str
    key: str
    counter: str
    duration: float


def contender(job: Job, w: int, barrier: Any) -> dict[str, Any]:
    import dblock

    fd = os.open(job.counter, os.O_RDWR)
    records = []
    try:
        with dblock.connect(job.url, table=job.table) as client:
            lock = client.lock(job.key, ttl=60)
            with client.lock(f"{job.key}-warm-{w}", ttl=60):
                pass
            barrier.wait(300)
            end = time.monotonic() + job.duration
            while time.monotonic() < end:
                t_req = time.monotonic()
                lock.acquire()
                t_acq = time.monotonic()
                read_modify_write(fd)
                t_rel = time.monotonic()
                lock.release()
                records.append((w, t_req, t_acq, t_rel))
        return {"records": records}
    finally:
        os.close(fd)


def crowd_member(
    t: Targets, backend: str, table: str, i: int, ready: Any, stop: Any, takes: Any
) -> None:
    """One of the crowd: its own key, once a second, until ``stop``."""
    import dblock

    with dblock.connect(t.url(backend), table=table) as client:
        lock = client.lock(f"bench-crowd-{i}", ttl=30)

        def take() -> None:
            with lock:
                pass

        _every_second(take, ready, stop, takes)


def waited_member(
    t: Targets, backend: str, table: str, i: int, ready: Any, stop: Any, takes: Any
) -> None:
    """One of the crowd that first waits for its key once (another client holds it for
    0.2 s), which makes its client listen for wake-ups; then as ``crowd_member``."""
    import dblock

    with dblock.connect(t.url(backend), table=table) as client:
        lock = client.lock(f"bench-crowd-{i}", ttl=30)
        other = dblock.connect(t.url(backend), table=table)
        try:
            held = threading.Event()

            def block() -> None:  # a hold is its thread's: taken and released here
                with other.lock(f"bench-crowd-{i}", ttl=30):
                    held.set()
                    time.sleep(0.2)

            blocker = threading.Thread(target=block)
            blocker.start()
            held.wait(30)
            if not lock.acquire(timeout=30):
                raise RuntimeError("the crowd member's wait timed out")
            lock.release()
            blocker.join()
        finally:
            other.close()

        def take() -> None:
            with lock:
                pass

        _every_second(take, ready, stop, takes)


#: the crowd's floor per store: the least lock that takes a key the same way (a durable row
#: for the SQL stores; redis-py's and kazoo's own locks)
FLOOR_LOCK = {
    "postgresql": "floor: lock table",
    "mysql": "floor: lock table",
    "sqlite": "floor: lock table",
    "redis": "redis-py Lock",
    "zookeeper": "kazoo Lock",
    "etcd": "etcd3 Lock",  # the driver's own recipe (pyetcd's Lock), not a bench contender
}


class _EtcdLock:
    """pyetcd's own Lock (a key with a lease, taken by a transaction), on the URL's first
    endpoint."""

    def __init__(self, t: Targets, key: str) -> None:
        import pyetcd

        p = urlsplit(t.etcd)
        self._client = pyetcd.client(p.hostname or "127.0.0.1", p.port or 2379)
        self._lock = self._client.lock(key, ttl=30)

    def acquire(self) -> None:
        self._lock.acquire()

    def release(self) -> None:
        self._lock.release()

    def close(self) -> None:
        self._client.close()


def floor_member(
    t: Targets, backend: str, table: str, i: int, ready: Any, stop: Any, takes: Any
) -> None:
    """The crowd's floor: the same process and pace, each take by the store's least lock
    (``FLOOR_LOCK``): what 200 processes taking a key cost without dblock."""
    name, key = FLOOR_LOCK[backend], f"bench-crowd-floor-{i}"
    if backend == "etcd":
        adapter: Any = _EtcdLock(t, key)
    else:
        (floor,) = [c for c in select([backend], [name]) if c.name == name]
        adapter = floor.factory(t, key)

    def take() -> None:
        adapter.acquire()
        adapter.release()

    try:
        _every_second(take, ready, stop, takes)
    finally:
        adapter.close()


def _every_second(take: Any, ready: Any, stop: Any, takes: Any) -> None:
    take()
    ready.release()
    tick = time.monotonic() + random.random()
    while not stop.is_set():
        if stop.wait(max(0.0, tick - time.monotonic())):
            break
        take()
        with takes.get_lock():
            takes.value += 1
        tick += 1.0


class _Sampler:
    """The server's connections, sampled while the window runs."""

    def __init__(self, t: Targets, backend: str, work: Work) -> None:
        self.t, self.backend, self.work = t, backend, work
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            with contextlib.suppress(Exception):
                n = connections(self.t, self.backend, self.work)
                self.peak = max(self.peak, n or 0)

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.work.close()


def run_cell(
    t: Targets, backend: str, table: str, cell: str, crowd: int, duration: float, tmp: str
) -> dict[str, Any]:
    key = f"bench-clients-{uuid.uuid4().hex[:10]}"
    counter = os.path.join(tmp, f"counter-{uuid.uuid4().hex[:8]}")
    new_counter(counter)
    job = Job(t.url(backend), table, key, counter, duration)
    ctx = procs._CTX
    ready, stop, takes = ctx.Semaphore(0), ctx.Event(), ctx.Value("l", 0)
    members = []
    work = Work(t, backend)
    port = port_of(t, backend)
    pid = listener_pid(port) if port else None
    try:
        member = {"floor": floor_member, "waited": waited_member, "idled": waited_member}.get(
            cell, crowd_member
        )
        crowd = 0 if cell == "alone" else crowd
        for i in range(crowd):
            members.append(
                procs.start_background(member, (t, backend, table, i, ready, stop, takes))
            )
        give_up = time.monotonic() + 300
        for _ in range(crowd):
            if not ready.acquire(timeout=max(0.0, give_up - time.monotonic())):
                raise RuntimeError("the crowd did not connect within 300 s")
        time.sleep(1.0 if crowd else 0.0)  # the crowd's takes are under way
        if cell == "idled":  # the listeners the crowd's waits opened have closed
            time.sleep(Listener.idle_close + 1.0)
        barrier = ctx.Barrier(CONTENDERS + 1)
        start: dict[str, Any] = {}

        def window_starts() -> None:  # with the contenders, past their start-up
            barrier.wait(300)
            start.update(w=work.read(), cpu=tree_cpu(pid), takes=takes.value, t=time.monotonic())

        opener = threading.Thread(target=window_starts, daemon=True)
        opener.start()
        with _Sampler(t, backend, Work(t, backend)) as sampler:
            results = procs.run_parallel(
                contender,
                [(job, w, barrier) for w in range(CONTENDERS)],
                timeout=duration + 240,
            )
            opener.join(10)
            elapsed = time.monotonic() - start["t"]
            w1, cpu1, takes1 = work.read(), tree_cpu(pid), takes.value
            w0, cpu0, takes0 = start["w"], start["cpu"], start["takes"]
        records = [r for res in results for r in res["records"]]
        lost, overlaps = exclusion(records, read_counter(counter))
        done = work.delta(w0, w1)
        waits = [r[2] - r[1] for r in records]
        first = min(r[2] for r in records)
        last = max(r[3] for r in records)
        return {
            "throughput": len(records) / max(last - first, 1e-9),
            "wait_p99_ms": percentile(waits, 99) * 1000,
            "connections": sampler.peak if backend != "sqlite" else None,
            "server_cores": None if cpu0 is None or cpu1 is None else (cpu1 - cpu0) / elapsed,
            "work_per_s": None if done is None else done / elapsed,
            "crowd_takes_per_s": (takes1 - takes0) / elapsed,
            "lost_updates": lost,
            "overlaps": overlaps,
            "exclusive": lost == 0 and overlaps == 0,
        }
    finally:
        stop.set()
        for proc in members:
            procs.stop(proc, 5.0)
        work.close()
        with contextlib.suppress(OSError):
            os.unlink(counter)


_FIELDS = (
    "throughput",
    "wait_p99_ms",
    "connections",
    "server_cores",
    "work_per_s",
    "crowd_takes_per_s",
)


def scenario_clients(
    backends: list[str], t: Targets, b: Any, tmp: str, repeats: int = 2
) -> dict[str, Any]:
    duration = 2.0 if b.duration < 1 else 5.0  # --quick
    crowd = 40 if b.duration < 1 else CROWD
    table = f"{t.table}_clients"

    def measure(there: Targets, backend: str, cells: dict[str, Any]) -> None:
        cells.update({c: {"repeats": []} for c in CELLS})
        servers.create_floor_table(there, backend)
        for r in range(repeats):
            cells_here = [
                c
                for c in CELLS
                if (c != "floor" or backend in FLOOR_LOCK)
                and (c not in ("waited", "idled") or backend in LISTENING)
            ]
            for cell in cells_here if r % 2 == 0 else cells_here[::-1]:
                rep = run_cell(there, backend, table, cell, crowd, duration, tmp)
                cells[cell]["repeats"].append(rep)
                log(
                    f"[clients] {backend} {cell}: {rep['throughput']:,.0f}/s, "
                    f"{rep['connections']} connections, server "
                    f"{fmt(rep['server_cores'], '.2f')} cores, "
                    f"{fmt(rep['work_per_s'])} work/s" + ("" if rep["exclusive"] else "  FAILING")
                )
        for cell in CELLS:
            summarise(cells[cell], _FIELDS)
        cells["crowd_size"] = crowd

    return each_store("clients", t, backends, tmp, table, measure)


def markdown(res: dict[str, Any]) -> list[str]:
    lines = [
        "### (clients) 8 contenders on one key, alone and beside a crowd of clients (issue 52)",
        "",
        "The crowd: that many processes, a client each, each taking its own key once a "
        "second. Connections: the most the server had open; server CPU in cores; work: what "
        "the server counted per second.",
        "",
        "| store | cell | sections/s | p99 wait ms | crowd ÷ alone | connections | server CPU "
        "| server work/s | crowd takes/s | exclusion |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for store, cells in res.items():
        if "error" in cells:
            lines.append(f"| {store} | error: {cells['error'][:90]} |||||||||")
            continue
        alone = cells["alone"].get("throughput")
        for cell in CELLS:
            v = cells[cell]
            if not v.get("repeats"):
                continue
            size = cells.get("crowd_size", CROWD)
            label = {
                "crowd": f"crowd of {size}",
                "floor": f"floor crowd of {size}",
                "waited": f"crowd of {size}, each waited once",
                "idled": f"the same, {Listener.idle_close + 1:g} s later",
            }.get(cell, cell)
            share = f"{v['throughput'] / alone:.2f}×" if cell != "alone" and alone else ""
            status = "ok" if v["exclusive"] else f"**FAILING** {v['lost_updates']} lost"
            lines.append(
                f"| {store} | {label} | {fmt(v['throughput'])} | {fmt(v['wait_p99_ms'], '.1f')} "
                f"| {share} | {fmt(v['connections'])} | {fmt(v['server_cores'], '.2f')} "
                f"| {fmt(v['work_per_s'])} | {fmt(v['crowd_takes_per_s'])} | {status} |"
            )
    lines.append("")
    return lines


def ratio(cell: str, cells: dict[str, Any], alone: float) -> float | None:
    v = cells.get(cell, {}).get("throughput")
    return None if v is None else float(v) / alone


def targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for store, cells in res.items():
        if "error" in cells or not cells["alone"].get("throughput"):
            continue
        alone = cells["alone"]["throughput"]

        crowd, floor = ratio("crowd", cells, alone), ratio("floor", cells, alone)
        beside = "" if floor is None else f"; the floor crowd {floor:.2f}×"
        if crowd is not None:
            out.append(
                {
                    "target": f"(clients) {store}: 8 contenders beside the crowd keep ≥ {KEEP}× "
                    "their throughput",
                    "measured": f"{crowd:.2f}×{beside}",
                    "met": crowd >= KEEP,
                }
            )
        waited, idled = ratio("waited", cells, alone), ratio("idled", cells, alone)
        if waited is not None and idled is not None:
            out.append(
                {
                    "target": f"(clients) {store}: beside a crowd that once waited, once its "
                    f"listeners closed, ≥ {KEEP}×",
                    "measured": f"{idled:.2f}× (while they listened: {waited:.2f}×)",
                    "met": idled >= KEEP,
                }
            )
    return out
