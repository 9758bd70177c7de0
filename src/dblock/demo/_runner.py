"""The parent side: tables, the order book, the worker pool, and the measurements."""

from __future__ import annotations

import math
import multiprocessing
import queue
import random
import secrets
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import dblock
from dblock.stores import ddl_for, open_url, parse_url

from .._url import DatabaseURL, scrub
from ._db import (
    PREFIX,
    SKUS,
    DemoDB,
    create_inventory,
    drop_objects,
    lock_table_objects,
    reset_inventory,
    stocks_left,
)
from ._db import stock_left as read_stock
from ._strategies import Strategy
from ._worker import Config, SeveralOrder, Shared, Stats, worker_main

#: stores that are SQL databases: the demo's inventory table lives beside their locks
SQL_DIALECTS = ("sqlite", "postgresql", "mysql")

MAX_QTY = 5
#: strategy 8: the most SKUs in an order, and the most units of one SKU in it
MAX_LINES, MAX_LINE_QTY = 5, 3
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
    #: strategy 8's variant ("a", "b", "c") or 9's ("a", "b"), "" for the others
    variant: str = ""
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
    #: strategy 9: what became of each stalled holder's write ("written" or "refused")
    stalled: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        """The row's name: the strategy's number (and variant) and title."""
        return f"{self.number}{self.variant} {self.title}"

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


def several_stock(stock: int) -> int:
    """Strategy 8's stock of each of its SKUs: a tenth of ``stock``, so that its three
    variants together take about as long as one of strategies 1-7 (variant c spends most of
    its time in lock timeouts)."""
    return max(1, stock // 10)


def make_several_orders(seed: int, stock: int) -> list[SeveralOrder]:
    """Strategy 8's order book: orders of 1-5 distinct SKUs (in the order the lines arrived),
    1-3 units of each, reproducible from ``seed``; enough that every SKU's demand is twice
    its stock (``several_stock(stock)``)."""
    rng = random.Random(f"several-{seed}")
    each = several_stock(stock)
    demand = dict.fromkeys(SKUS, 0)
    orders: list[SeveralOrder] = []
    while min(demand.values()) < 2 * each:
        skus = rng.sample(SKUS, rng.randint(1, MAX_LINES))
        lines = tuple((sku, rng.randint(1, MAX_LINE_QTY)) for sku in skus)
        for sku, qty in lines:
            demand[sku] += qty
        orders.append((lines, rng.uniform(0.001, 0.003)))
    return orders


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
        self, url: DatabaseURL, workers: int, stock: int, seed: int, progress: ProgressSink
    ) -> None:
        self.url = url
        #: the inventory's database: the lock store's, or an SQLite file of the run's for a
        #: store that is no SQL database (its own directory, removed at the end)
        self.inventory = url
        self._scratch: str | None = None
        if url.dialect not in SQL_DIALECTS:
            self._scratch = tempfile.mkdtemp(prefix="dblock-demo-")
            self.inventory = parse_url(f"sqlite:///{self._scratch}/inventory.sqlite3")
        self.workers = workers
        self.stock = stock
        self.seed = seed
        self.progress = progress
        run_id = secrets.token_hex(3)
        self.table = f"{PREFIX}inventory_{run_id}"
        self.lock_table = f"{PREFIX}locks_{run_id}"
        self.orders = make_orders(seed, stock)
        self.several = make_several_orders(seed, stock)
        #: strategy 8's stock of each of its SKUs
        self.several_stock = several_stock(stock)
        #: strategy 8 is among the strategies set up
        self.several_in_use = False
        #: the strategies set up
        self.strategies: list[Strategy] = []
        self.objects: list[tuple[str, str]] = []
        self.db: DemoDB | None = None
        self.procs: list[Any] = []
        self.shared: Shared | None = None

    # -- set-up and clean-up ------------------------------------------------------------------
    def setup(self, strategies: list[Strategy]) -> None:
        """Connect, create the demo's tables, start the workers. Raises Unreachable."""
        open_url(self.url, None, self.lock_table).close()  # URL parameters, driver present
        self.several_in_use = any(s.number == 8 for s in strategies)
        self.strategies = list(strategies)
        try:
            self.db = DemoDB(self.inventory)
        except Exception as exc:  # noqa: BLE001 - any driver error means "cannot reach"
            raise Unreachable(self._detail(exc)) from None
        try:
            self.objects.append(("TABLE", self.table))
            create_inventory(self.db, self.table, self.stock)
            if any(s.number in (6, 8, 9) for s in strategies):
                if self.url.dialect in SQL_DIALECTS:
                    self.objects.extend(
                        lock_table_objects(ddl_for(self.url.dialect, self.lock_table))
                    )
                with dblock.connect(self.url.raw, table=self.lock_table):
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
        config = Config(
            self.url.raw,
            self.table,
            self.lock_table,
            self.orders,
            self.inventory.raw,
            self.several if self.several_in_use else [],
        )
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
        if self.db is not None:
            try:
                drop_objects(self.db, self.objects)
            except Exception as exc:  # noqa: BLE001 - report, do not mask the results
                warnings.append(f"could not drop the demo tables: {self._detail(exc)}")
            self.db.close()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
        return warnings

    def object_names(self) -> list[str]:
        """The demo's own tables and sequences in this run (dropped at the end)."""
        return [name.strip('"`') for _kind, name in self.objects]

    def _detail(self, exc: BaseException) -> str:
        text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return scrub(text, self.url.secrets)

    # -- running ------------------------------------------------------------------------------
    def run(self, strategy: Strategy, variant: str = "") -> Result:
        """Run one strategy (its ``variant``) on a fresh stock with every worker at once."""
        result = Result(
            strategy.number,
            strategy.slug,
            strategy.label(self.inventory.dialect, variant),
            strategy.correct,
            variant,
        )
        reason = strategy.skip_reason(
            self.inventory.dialect, variant, self.url.dialect in SQL_DIALECTS
        )
        if reason is not None:
            result.status, result.note = "skipped", reason
            result.stock_left = self.stock
            self.progress.finish(result)
            return result
        if self.db is None or self.shared is None:
            raise RuntimeError("Demo.setup() has not run")
        shared = self.shared
        multi = strategy.number == 8
        stock = self._restock(multi)
        for value in (shared.next_order, shared.confirmed, shared.shipped):
            value.value = 0
        shared.sold_out.clear()
        shared.go.clear()
        self.progress.start(result.name, stock)
        deadline = time.monotonic() + STRATEGY_DEADLINE
        for _ in self.procs:
            shared.tasks.put((strategy.number, variant))
        for _wid, error in self._collect("ready", deadline):
            if error is not None:
                result.errors.append(f"worker could not connect: {error}")
        start = time.perf_counter()
        shared.go.set()
        stats: list[Stats] = [s for _wid, s in self._collect("done", deadline)]
        result.elapsed = time.perf_counter() - start
        self._count(result, stats, stock, multi)
        self.progress.finish(result)
        return result

    def _restock(self, multi: bool) -> int:
        """Put the stock back (strategy 8's SKUs if ``multi``); return its units in all."""
        if self.db is None:
            raise RuntimeError("Demo.setup() has not run")
        if multi:
            reset_inventory(self.db, self.table, self.several_stock, SKUS)
            return self.several_stock * len(SKUS)
        reset_inventory(self.db, self.table, self.stock)
        return self.stock

    def _count(self, result: Result, stats: list[Stats], stock: int, multi: bool) -> None:
        """Fill ``result`` from the workers' ``stats`` and the stock left."""
        if self.db is None:
            raise RuntimeError("Demo.setup() has not run")
        for s in stats:
            result.confirmed += s.confirmed
            result.rejected += s.rejected
            result.shipped += s.shipped
            result.retries += s.retries
            result.stalled.extend(s.stalled)
            if s.error is not None:
                result.errors.append(s.error)
        if multi:
            left = stocks_left(self.db, self.table, SKUS)
            result.stock_left = sum(left.values())
            # every SKU's units sold below zero (decrements cannot lose an update)
            result.oversold = sum(-n for n in left.values() if n < 0)
        else:
            result.stock_left = read_stock(self.db, self.table)
            result.oversold = max(0, result.shipped - stock)
        result.unaccounted = result.shipped + result.stock_left - stock
        result.throughput = result.confirmed / result.elapsed if result.elapsed > 0 else 0.0
        result.p99_ms = 1000 * p99([lat for s in stats for lat in s.latencies])
        if result.errors:
            result.status = "error"
            result.note = result.errors[0]

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
