# ruff: noqa: PLR0917 - worker entry points take their arguments positionally (spawn)
"""``dblock bench``: what dblock gives on *your* database, before you adopt it.

Three measurements, each for ``--duration`` seconds (split into ``--repeats`` runs whose median
is shown):

(a) uncontended acquire+release pairs per second on one key, one process;
(b) ``--workers`` processes on one key, each critical section a read-modify-write of a counter
    file: sections per second, wait p50/p99, fairness (fewest/most sections per worker), the
    ideal FIFO wait ``(workers - 1) / throughput`` and p99 over it, and a mutual-exclusion check
    (the counter must equal the number of sections, and no two holds may overlap);
(c) hand-off latency: from one holder's release to the acquisition by a waiter that was
    already blocked, median and p99.

It uses keys named ``dblock-bench:<random>`` in the lock table (``--table``, default the
library's own), leaves one released row per key behind, and never purges anything.

Only dblock, the standard library and rich are imported: this ships with dblock.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ._client import connect
from ._errors import BackendError, ConfigurationError

EX_UNAVAILABLE = 69
EX_USAGE = 2

#: (worker, t_request, t_acquired, t_release_called), time.monotonic() (system-wide on Linux)
Record = tuple[int, float, float, float]
#: how long a worker waits at the start barrier for the others, seconds
BARRIER_WAIT = 120


# -- statistics (``python -m bench`` in the repository reports the same) ----------------------
def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def median(values: Sequence[float]) -> float:
    """The median of the values that are not NaN; NaN if none are."""
    kept = [v for v in values if not math.isnan(v)]
    return statistics.median(kept) if kept else math.nan


def handoffs(records: list[Record]) -> list[float]:
    """Release-to-next-acquisition gaps where the lock passed to another worker."""
    ordered = sorted(records, key=lambda r: r[2])
    return [b[2] - a[3] for a, b in itertools.pairwise(ordered) if a[0] != b[0] and b[2] >= a[3]]


def exclusion(records: list[Record], counter: int) -> tuple[int, int]:
    """(lost updates, overlapping holds) — both 0 for a lock that excludes. An overlap is a
    proof: a later acquisition returned before an earlier holder had even started its release."""
    overlaps = 0
    latest_release = -math.inf
    for _, _, t_acq, t_rel in sorted(records, key=lambda r: r[2]):
        if t_acq < latest_release:
            overlaps += 1
        latest_release = max(latest_release, t_rel)
    return len(records) - counter, overlaps


def contended_stats(records: list[Record], workers: int) -> dict[str, Any]:
    """Throughput of critical sections, waits against the ideal FIFO wait, and fairness
    (fewest/most sections per worker)."""
    if not records:
        return {"throughput": 0.0}
    first = min(r[2] for r in records)
    last = max(r[3] for r in records)
    throughput = len(records) / max(last - first, 1e-9)
    waits = [r[2] - r[1] for r in records]
    per_worker = [sum(1 for r in records if r[0] == w) for w in range(workers)]
    ideal = (workers - 1) / throughput
    p99 = percentile(waits, 99)
    return {
        "throughput": throughput,
        "wait_p50_ms": percentile(waits, 50) * 1000,
        "wait_p99_ms": p99 * 1000,
        "ideal_wait_ms": ideal * 1000,
        "p99_over_ideal": p99 / ideal if ideal else math.nan,
        "fairness": min(per_worker) / max(per_worker) if max(per_worker) else 0.0,
    }


# -- the counter file -----------------------------------------------------------------------
def read_modify_write(fd: int, pause: float = 0.0) -> None:
    """Add one to the counter file, ``pause`` seconds between the read and the write."""
    value = int(os.pread(fd, 32, 0).strip(b"\x00 \n") or b"0")
    if pause:
        time.sleep(pause)
    os.pwrite(fd, b"%-20d\n" % (value + 1), 0)


def read_counter(path: str) -> int:
    with open(path, "rb") as f:
        return int(f.read().strip() or b"0")


def new_counter(path: str) -> None:
    with open(path, "wb") as f:
        f.write(b"%-20d\n" % 0)


# -- the loops each worker process runs -----------------------------------------------------
class Acquirable(Protocol):
    """What the loops need of a lock: blocking ``acquire()`` and ``release()``."""

    def acquire(self) -> object: ...

    def release(self) -> object: ...


def section_loop(
    lock: Acquirable,
    fd: int,
    worker: int,
    barrier: Any,
    duration: float,
    max_ops: int,
    pause: float = 0.0,
) -> list[Record]:
    """Once all workers are at ``barrier``: acquire, read-modify-write the counter file
    ``fd``, release; until ``duration`` seconds or ``max_ops`` sections have passed."""
    records: list[Record] = []
    barrier.wait(BARRIER_WAIT)
    end = time.monotonic() + duration
    while len(records) < max_ops and time.monotonic() < end:
        t_req = time.monotonic()
        lock.acquire()
        t_acq = time.monotonic()
        read_modify_write(fd, pause)
        t_rel = time.monotonic()
        lock.release()
        records.append((worker, t_req, t_acq, t_rel))
    return records


def handoff_loop(
    lock: Acquirable,
    fd: int,
    worker: int,
    barrier: Any,
    seq: Any,
    duration: float,
    max_ops: int,
    hold: float,
) -> list[Record]:
    """Two workers ping-pong one key. After releasing, a worker waits until the other one has
    acquired (``seq``, a shared counter, moves on) before it competes again, so every hand-off
    goes to a waiter that was already blocked (a poller cannot be overtaken by the releaser
    coming straight back)."""
    records: list[Record] = []
    barrier.wait(BARRIER_WAIT)
    end = time.monotonic() + duration
    while len(records) < max_ops:
        t_req = time.monotonic()
        lock.acquire()
        t_acq = time.monotonic()
        seq.value += 1
        mine = seq.value
        time.sleep(hold)  # the other one is blocked in acquire() by now
        read_modify_write(fd)
        t_rel = time.monotonic()
        lock.release()
        records.append((worker, t_req, t_acq, t_rel))
        if time.monotonic() >= end:
            break
        give_up = time.monotonic() + 30
        while seq.value == mine and time.monotonic() < give_up:
            time.sleep(0.0002)
        if seq.value == mine:
            break
    return records


# -- worker processes (module level: started with "spawn") ----------------------------------
def _section_worker(
    url: str | None,
    table: str,
    key: str,
    worker: int,
    counter: str,
    barrier: Any,
    duration: float,
    max_ops: int,
    results: Any,
) -> None:
    records: list[Record] = []
    error = None
    try:
        fd = os.open(counter, os.O_RDWR)
        try:
            with connect(url, table=table) as client:
                lock = client.lock(key, ttl=60)
                records = section_loop(lock, fd, worker, barrier, duration, max_ops)
        finally:
            os.close(fd)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which decides
        error = f"{type(exc).__name__}: {exc}"
    results.put((worker, records, error))


def _handoff_worker(
    url: str | None,
    table: str,
    key: str,
    worker: int,
    counter: str,
    barrier: Any,
    seq: Any,
    duration: float,
    hold: float,
    results: Any,
) -> None:
    records: list[Record] = []
    error = None
    try:
        fd = os.open(counter, os.O_RDWR)
        try:
            with connect(url, table=table) as client:
                lock = client.lock(key, ttl=60)
                records = handoff_loop(lock, fd, worker, barrier, seq, duration, 100_000, hold)
        finally:
            os.close(fd)
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        error = f"{type(exc).__name__}: {exc}"
    results.put((worker, records, error))


def _new_counter_in(directory: str) -> str:
    path = os.path.join(directory, f"counter-{uuid.uuid4().hex[:8]}")
    new_counter(path)
    return path


class _Failed(Exception):
    pass


def _run_workers(
    target: Callable[..., None],
    argsets: list[tuple[Any, ...]],
    results: Any,
    timeout: float,
    tick: Callable[[], None],
) -> list[Record]:
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=target, args=(*a, results), daemon=True) for a in argsets]
    for p in procs:
        p.start()
    records: list[Record] = []
    errors: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        for _ in procs:
            while True:
                tick()
                with contextlib.suppress(Exception):
                    _, recs, error = results.get(timeout=0.1)
                    break
                if time.monotonic() > deadline:
                    raise _Failed(f"workers did not finish within {timeout:.0f} s")
                if not any(p.is_alive() for p in procs) and results.empty():
                    raise _Failed("a worker process died")
            records.extend(recs)
            if error:
                errors.append(error)
    finally:
        for p in procs:
            p.join(1.0)
            if p.is_alive():
                p.terminate()
                p.join(1.0)
    if errors:
        raise _Failed(errors[0])
    return records


# -- the three measurements -----------------------------------------------------------------
def _uncontended(
    url: str | None, table: str, seconds: float, max_ops: int, tick: Callable[[], None]
) -> float:
    with connect(url, table=table) as client:
        lock = client.lock(f"dblock-bench:{uuid.uuid4().hex[:12]}", ttl=60)
        for _ in range(10):
            lock.acquire()
            lock.release()
        n = 0
        start = time.perf_counter()
        last_tick = start
        while n < max_ops:
            lock.acquire()
            lock.release()
            n += 1
            now = time.perf_counter()
            if now - last_tick > 0.1:
                tick()
                last_tick = now
            if now - start >= seconds:
                break
        return n / (time.perf_counter() - start)


def _contended(
    url: str | None,
    table: str,
    workers: int,
    seconds: float,
    max_ops: int,
    tmp: str,
    tick: Callable[[], None],
) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    counter = _new_counter_in(tmp)
    key = f"dblock-bench:{uuid.uuid4().hex[:12]}"
    barrier = ctx.Barrier(workers)
    argsets = [(url, table, key, w, counter, barrier, seconds, max_ops) for w in range(workers)]
    records = _run_workers(_section_worker, argsets, ctx.Queue(), seconds + 180, tick)
    lost, overlaps = exclusion(records, read_counter(counter))
    return {
        "sections": len(records),
        **contended_stats(records, workers),
        "lost_updates": lost,
        "overlaps": overlaps,
    }


def _handoff(
    url: str | None, table: str, seconds: float, tmp: str, tick: Callable[[], None]
) -> list[float]:
    ctx = mp.get_context("spawn")
    counter = _new_counter_in(tmp)
    key = f"dblock-bench:{uuid.uuid4().hex[:12]}"
    barrier = ctx.Barrier(2)
    seq = ctx.Value("q", 0, lock=False)
    argsets = [(url, table, key, w, counter, barrier, seq, seconds, 0.01) for w in range(2)]
    records = _run_workers(_handoff_worker, argsets, ctx.Queue(), seconds + 180, tick)
    lost, overlaps = exclusion(records, read_counter(counter))
    if lost or overlaps:
        raise _Failed(f"mutual exclusion violated: {lost} lost updates, {overlaps} overlaps")
    return handoffs(records)[1:]  # the first sets up the waiter's wake-up channel


# -- command line ---------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dblock bench",
        description="Measure dblock's acquire/release rate, contended throughput and hand-off "
        "latency on your own database.",
    )
    p.add_argument("--url", help="database URL (default: $DBLOCK_URL, else the embedded SQLite)")
    p.add_argument("--table", default="dblock_locks", help="lock table (default dblock_locks)")
    p.add_argument(
        "--duration", type=float, default=5.0, help="seconds per measurement (default 5)"
    )
    p.add_argument("--repeats", type=int, default=3, help="runs per measurement (median shown)")
    p.add_argument("--workers", type=int, default=8, help="processes in (b) (default 8)")
    p.add_argument("--max-ops", type=int, default=1_000_000, help="cap per process and run")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run ``dblock bench`` with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EX_USAGE
    if not (args.duration > 0 and math.isfinite(args.duration)) or args.repeats < 1:
        print("dblock bench: --duration must be > 0 and --repeats >= 1", file=sys.stderr)
        return EX_USAGE
    if args.workers < 2 or args.max_ops < 1:
        print("dblock bench: --workers must be >= 2 and --max-ops >= 1", file=sys.stderr)
        return EX_USAGE
    try:
        with connect(args.url, table=args.table) as client:
            where = client.url
            dialect = client.dialect
    except BackendError as exc:
        print(f"dblock bench: {str(exc).splitlines()[0]}", file=sys.stderr)
        return EX_UNAVAILABLE
    except ConfigurationError as exc:
        print(f"dblock bench: {str(exc).splitlines()[0]}", file=sys.stderr)
        return EX_USAGE
    try:
        result = _measure(args, where, dialect)
    except BackendError as exc:
        print(f"dblock bench: {str(exc).splitlines()[0]}", file=sys.stderr)
        return EX_UNAVAILABLE
    except _Failed as exc:
        print(f"dblock bench: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _show(result)
    return 1 if result["contended"]["lost_updates"] or result["contended"]["overlaps"] else 0


def _measure(args: argparse.Namespace, where: str, dialect: str) -> dict[str, Any]:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    repeats = args.repeats
    per_run = args.duration / repeats
    result: dict[str, Any] = {"url": where, "dialect": dialect, "duration": args.duration}
    console = Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), TimeRemainingColumn())
    with (
        tempfile.TemporaryDirectory(prefix="dblock-bench-") as tmp,
        Progress(
            *columns, console=console, transient=True, disable=args.json and not console.is_terminal
        ) as progress,
    ):

        def timed(description: str) -> tuple[Callable[[], None], Callable[[], None]]:
            task = progress.add_task(description, total=args.duration)
            start = time.monotonic()

            def tick() -> None:
                progress.update(task, completed=min(args.duration, time.monotonic() - start))

            def done() -> None:
                progress.update(task, completed=args.duration)

            return tick, done

        tick, done = timed("(a) uncontended acquire+release")
        rates = [
            _uncontended(args.url, args.table, per_run, args.max_ops, tick) for _ in range(repeats)
        ]
        done()
        result["uncontended"] = {"pairs_per_s": median(rates), "runs": rates}

        tick, done = timed(f"(b) {args.workers} processes on one key")
        runs = [
            _contended(args.url, args.table, args.workers, per_run, args.max_ops, tmp, tick)
            for _ in range(repeats)
        ]
        done()
        summary = {
            k: median([r[k] for r in runs])
            for k in runs[0]
            if k not in ("sections", "lost_updates", "overlaps")
        }
        summary["sections"] = sum(r["sections"] for r in runs)
        summary["lost_updates"] = sum(r["lost_updates"] for r in runs)
        summary["overlaps"] = sum(r["overlaps"] for r in runs)
        summary["workers"] = args.workers
        result["contended"] = summary

        tick, done = timed("(c) hand-off latency")
        samples: list[float] = []
        for _ in range(repeats):
            samples += _handoff(args.url, args.table, per_run, tmp, tick)
        done()
        result["handoff"] = {
            "p50_ms": percentile(samples, 50) * 1000,
            "p99_ms": percentile(samples, 99) * 1000,
            "samples": len(samples),
        }
    return result


def _show(r: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    c = r["contended"]
    h = r["handoff"]
    exclusion = (
        "ok (0 lost updates, 0 overlapping holds)"
        if not (c["lost_updates"] or c["overlaps"])
        else f"VIOLATED: {c['lost_updates']} lost updates, {c['overlaps']} overlapping holds"
    )
    table = Table(title=f"dblock bench — {r['url']} ({r['dialect']})", show_header=True)
    table.add_column("measurement")
    table.add_column("result", justify="right")
    table.add_row("(a) uncontended acquire+release", f"{r['uncontended']['pairs_per_s']:,.0f}/s")
    table.add_row(f"(b) {c['workers']} processes: critical sections", f"{c['throughput']:,.0f}/s")
    table.add_row("    wait p50 / p99", f"{c['wait_p50_ms']:.1f} / {c['wait_p99_ms']:.1f} ms")
    table.add_row(
        "    ideal FIFO wait, p99 / ideal",
        f"{c['ideal_wait_ms']:.1f} ms, {c['p99_over_ideal']:.1f}x",
    )
    table.add_row("    fairness (fewest/most per worker)", f"{c['fairness']:.2f}")
    table.add_row("    mutual exclusion", exclusion)
    table.add_row(
        "(c) hand-off median / p99",
        f"{h['p50_ms']:.2f} / {h['p99_ms']:.2f} ms ({h['samples']} samples)",
    )
    Console().print(table)


if __name__ == "__main__":
    raise SystemExit(main())
