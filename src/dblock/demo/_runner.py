"""The parent side: tables, the order book, the worker pool, and the measurements."""

from __future__ import annotations

import math
import multiprocessing
import queue
import random
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import dblock
from dblock.backends import ddl_for, open_backend

from .._url import DatabaseURL, scrub
from ._db import PREFIX, DemoDB, create_inventory, drop_objects, lock_table_objects, reset_inventory
from ._db import stock_left as read_stock
from ._strategies import Strategy
from ._worker import Config, Shared, Stats, worker_main

MAX_QTY = 5
STRATEGY_DEADLINE = 300.0  # seconds; a strategy that takes longer is reported as failed
POLL = 0.05


class Unreachable(Exception):
    """The database could not be reached (exit status 69)."""


class SetupFailed(Exception):
    """The database was reached but the demo's tables could not be created (exit status 1)."""


@dataclass
class Result:
    """What one strategy did with the workload."""

    number: int
    slug: str
    title: str
    correct: bool
    status: str = "ok"  # ok | skipped | error
    note: str = ""
    confirmed: int = 0
    rejected: int = 0
    shipped: int = 0
    stock_left: int = 0
    oversold: int = 0
    unaccounted: int = 0  # units shipped but never deducted (lost updates)
    retries: int = 0
    elapsed: float = 0.0
    throughput: float = 0.0
    p99_ms: float = 0.0
    errors: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        """A correct strategy that oversold, lost an update or broke: the demo exits 1."""
        if self.status == "error":
            return True
        return self.status == "ok" and self.correct and (self.oversold > 0 or self.unaccounted != 0)


class ProgressSink(Protocol):
    """Where the runner reports progress (a rich display, plain lines, or nothing)."""

    def __enter__(self) -> object: ...

    def __exit__(self, *exc: object) -> None: ...

    def start(self, label: str, total: int) -> None: ...

    def update(self, confirmed: int, shipped: int) -> None: ...

    def finish(self, result: Result) -> None: ...


def make_orders(seed: int, stock: int) -> list[tuple[int, float]]:
    """The order book: (quantity, processing seconds) pairs, reproducible from ``seed``.

    Twice as many orders as units in stock: plenty to sell out, whatever the interleaving.
    """
    rng = random.Random(seed)
    return [(rng.randint(1, MAX_QTY), rng.uniform(0.001, 0.003)) for _ in range(2 * stock + 10)]


def p99(samples: list[float]) -> float:
    """Nearest-rank 99th percentile (0 for no samples)."""
    if not samples:
        return 0.0
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def _context() -> Any:
    methods = multiprocessing.get_all_start_methods()
    if "forkserver" in methods:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["dblock.demo._worker"])
        return ctx
    return multiprocessing.get_context("spawn")


class Demo:
    """One demo run: set up, run each strategy on a fresh stock, clean up."""

    def __init__(
        self,
        url: DatabaseURL,
        workers: int,
        stock: int,
        seed: int,
        progress: ProgressSink,
        *,
        lock_url: DatabaseURL | None = None,
    ) -> None:
        self.url = url
        #: where strategy 6's locks live: the demo's database, or a store of their own (etcd)
        self.lock_url = lock_url
        self.workers = workers
        self.stock = stock
        self.seed = seed
        self.progress = progress
        run_id = secrets.token_hex(3)
        self.table = f"{PREFIX}inventory_{run_id}"
        self.lock_table = f"{PREFIX}locks_{run_id}"
        self.orders = make_orders(seed, stock)
        self.objects: list[tuple[str, str]] = []
        self.db: DemoDB | None = None
        self.procs: list[Any] = []
        self.shared: Shared | None = None

    # -- set-up and clean-up ------------------------------------------------------------------
    def setup(self, strategies: list[Strategy]) -> None:
        """Connect, create the demo's tables, start the workers. Raises Unreachable."""
        locks = self.lock_url or self.url
        open_backend(locks, None, self.lock_table).close()  # URL parameters, driver present
        try:
            self.db = DemoDB(self.url)
        except Exception as exc:  # noqa: BLE001 - any driver error means "cannot reach"
            raise Unreachable(self._detail(exc)) from None
        try:
            self.objects.append(("TABLE", self.table))
            create_inventory(self.db, self.table, self.stock)
            if any(s.number == 6 for s in strategies):
                if self.lock_url is None:
                    ddl = ddl_for(self.url.dialect, self.lock_table)
                    self.objects.extend(lock_table_objects(ddl))
                with dblock.connect(locks.raw, table=self.lock_table):
                    pass  # creates the demo's own lock table
        except dblock.DBLockError:
            raise
        except Exception as exc:  # noqa: BLE001 - any driver error, reported in one line
            raise SetupFailed(self._detail(exc)) from None
        ctx = _context()
        self.shared = Shared(
            next_order=ctx.Value("q", 0),
            confirmed=ctx.Value("q", 0),
            shipped=ctx.Value("q", 0),
            sold_out=ctx.Event(),
            go=ctx.Event(),
            tasks=ctx.Queue(),
            results=ctx.Queue(),
        )
        lock_raw = None if self.lock_url is None else self.lock_url.raw
        config = Config(self.url.raw, self.table, self.lock_table, self.orders, lock_raw)
        for wid in range(self.workers):
            proc = ctx.Process(
                target=worker_main,
                args=(wid, config, self.shared),
                name=f"dblock-demo-worker-{wid}",
                daemon=True,
            )
            proc.start()
            self.procs.append(proc)

    def cleanup(self) -> list[str]:
        """Stop the workers and drop the demo's tables; return warnings."""
        warnings: list[str] = []
        if self.shared is not None:
            for _ in self.procs:
                self.shared.tasks.put(None)
            self.shared.sold_out.set()  # a worker still running a strategy stops at once
            self.shared.go.set()
        deadline = time.monotonic() + 10
        for proc in self.procs:
            proc.join(max(0.1, deadline - time.monotonic()))
        for proc in self.procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
        if self.shared is not None:
            for q in (self.shared.tasks, self.shared.results):
                q.close()
                q.cancel_join_thread()
        if self.lock_url is not None:
            try:  # the lock store's records of this run (its holds are all released)
                with dblock.connect(self.lock_url.raw, table=self.lock_table) as client:
                    client.purge(include_once=True)
            except dblock.DBLockError as exc:
                warnings.append(f"could not purge the demo's locks: {exc}")
        if self.db is not None:
            try:
                drop_objects(self.db, self.objects)
            except Exception as exc:  # noqa: BLE001 - report, do not mask the results
                warnings.append(f"could not drop the demo tables: {self._detail(exc)}")
            self.db.close()
        return warnings

    def object_names(self) -> list[str]:
        """The demo's own tables and sequences in this run (dropped at the end)."""
        return [name.strip('"`') for _kind, name in self.objects]

    def _detail(self, exc: BaseException) -> str:
        text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return scrub(text, self.url.secrets)

    # -- running ------------------------------------------------------------------------------
    def run(self, strategy: Strategy) -> Result:
        """Run one strategy on a fresh stock with every worker at once."""
        result = Result(
            strategy.number,
            strategy.slug,
            strategy.label(self.url.dialect),
            strategy.correct,
        )
        reason = strategy.skip_reason(self.url.dialect)
        if reason is not None:
            result.status, result.note = "skipped", reason
            result.stock_left = self.stock
            self.progress.finish(result)
            return result
        if self.db is None or self.shared is None:
            raise RuntimeError("Demo.setup() has not run")
        shared = self.shared
        reset_inventory(self.db, self.table, self.stock)
        for value in (shared.next_order, shared.confirmed, shared.shipped):
            value.value = 0
        shared.sold_out.clear()
        shared.go.clear()
        self.progress.start(result.title, self.stock)
        deadline = time.monotonic() + STRATEGY_DEADLINE
        for _ in self.procs:
            shared.tasks.put(strategy.number)
        for _wid, error in self._collect("ready", deadline):
            if error is not None:
                result.errors.append(f"worker could not connect: {error}")
        start = time.perf_counter()
        shared.go.set()
        stats: list[Stats] = [s for _wid, s in self._collect("done", deadline)]
        result.elapsed = time.perf_counter() - start
        result.stock_left = read_stock(self.db, self.table)
        for s in stats:
            result.confirmed += s.confirmed
            result.rejected += s.rejected
            result.shipped += s.shipped
            result.retries += s.retries
            if s.error is not None:
                result.errors.append(s.error)
        result.oversold = max(0, result.shipped - self.stock)
        result.unaccounted = result.shipped + result.stock_left - self.stock
        result.throughput = result.confirmed / result.elapsed if result.elapsed > 0 else 0.0
        result.p99_ms = 1000 * p99([lat for s in stats for lat in s.latencies])
        if result.errors:
            result.status = "error"
            result.note = result.errors[0]
        self.progress.finish(result)
        return result

    def _collect(self, kind: str, deadline: float) -> list[tuple[int, Any]]:
        """Wait for one ``kind`` message from every worker, updating the progress display."""
        if self.shared is None:
            raise RuntimeError("Demo.setup() has not run")
        got: list[tuple[int, Any]] = []
        while len(got) < len(self.procs):
            try:
                msg_kind, wid, payload = self.shared.results.get(timeout=POLL)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the workers did not finish within {STRATEGY_DEADLINE:.0f} s"
                    ) from None
                dead = [p.name for p in self.procs if not p.is_alive()]
                if dead:
                    raise RuntimeError(f"worker process died: {', '.join(dead)}") from None
            else:
                if msg_kind == kind:
                    got.append((wid, payload))
            self.progress.update(int(self.shared.confirmed.value), int(self.shared.shipped.value))
        return got
