"""A worker process: confirms outbound orders from the shared order book, one strategy at a time.

Each worker opens its own database connection (and, for the dblock strategy, its own dblock
client). Orders are taken from a shared counter, so every strategy sees the same order book.
Between reading the stock and writing it, the worker "processes" the order for a millisecond
or three (validation, pick list, carrier booking), as a real service would; that is the window
in which unprotected strategies race.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import dblock

from .._url import parse_url
from ._db import SKU, WAREHOUSE, DemoDB

CONFIRMED, REJECTED, SOLD_OUT = "confirmed", "rejected", "sold_out"
LOCK_WAIT = 60.0  # seconds a worker waits for a lock before giving up on an order


@dataclass(frozen=True)
class Config:
    """What every worker needs to know (pickled to each process)."""

    url: str
    table: str
    lock_table: str
    orders: list[tuple[int, float]]  # (quantity, processing seconds)
    #: where the inventory table is: the lock store's database, or for a store that is no
    #: SQL database (Redis, ZooKeeper) an SQLite file of the run's
    inventory_url: str = ""


@dataclass
class Shared:
    """Synchronized objects inherited by every worker (multiprocessing primitives)."""

    next_order: Any  # Value('q'): index of the next order in the book
    confirmed: Any  # Value('q'): orders confirmed so far (progress)
    shipped: Any  # Value('q'): units shipped so far (progress)
    sold_out: Any  # Event: a worker saw the stock at 0
    go: Any  # Event: all workers are connected, start now
    tasks: Any  # Queue: strategy numbers, None to stop
    results: Any  # Queue: ("ready" | "done", worker, payload)


@dataclass
class Stats:
    """What one worker saw while running one strategy."""

    confirmed: int = 0
    rejected: int = 0
    shipped: int = 0
    retries: int = 0
    latencies: list[float] = field(default_factory=list)
    error: str | None = None


class Worker:
    """The per-process state: connections and the strategies as methods."""

    def __init__(self, url: str, table: str, lock_table: str, inventory_url: str = "") -> None:
        self.url = url
        self.parsed = parse_url(inventory_url or url)
        self.table = table
        self.lock_table = lock_table
        self.db: DemoDB | None = None
        self.client: dblock.Client | None = None
        self.where = "WHERE sku = %s AND warehouse = %s"
        self.row = (SKU, WAREHOUSE)
        self.lock_key = f"inventory:{WAREHOUSE}:{SKU}"

    def open(self, number: int) -> None:
        if self.db is None:
            self.db = DemoDB(self.parsed)
        # 6, and 7 (a session hold), lock through dblock
        if number in (6, 7) and self.client is None:
            self.client = dblock.connect(self.url, table=self.lock_table, create_schema=False)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.db is not None:
            self.db.close()

    def strategy(self, number: int) -> Callable[[int, float], tuple[str, int]]:
        return {
            1: self.read_write,
            2: self.read_decrement,
            3: self.guarded_update,
            4: self.for_update,
            5: self.optimistic,
            6: self.dblock_lock,
            7: self.advisory,
        }[number]

    # -- helpers ----------------------------------------------------------------------------
    @property
    def conn(self) -> DemoDB:
        if self.db is None:
            raise RuntimeError("the worker is not connected")
        return self.db

    def select(self, columns: str, suffix: str = "") -> tuple[int, ...]:
        row = self.conn.one(f"SELECT {columns} FROM {self.table} {self.where}{suffix}", self.row)
        if row is None:
            raise RuntimeError(f"the inventory row vanished from {self.table}")
        return tuple(int(v) for v in row)

    def read(self, suffix: str = "") -> int:
        return self.select("available", suffix)[0]

    def write_computed(self, value: int) -> None:
        self.conn.execute(
            f"UPDATE {self.table} SET available = %s {self.where}", (value, *self.row)
        )

    def check_then_write(self, qty: int, delay: float, suffix: str = "") -> tuple[str, int]:
        """Read, check in Python, process, write the computed value (safe only under a lock)."""
        available = self.read(suffix)
        if available <= 0:
            return SOLD_OUT, 0
        if qty > available:
            return REJECTED, 0
        time.sleep(delay)
        self.write_computed(available - qty)
        return CONFIRMED, 0

    # -- the strategies ---------------------------------------------------------------------
    def read_write(self, qty: int, delay: float) -> tuple[str, int]:
        """1: no lock; concurrent writers overwrite each other (lost update)."""
        return self.check_then_write(qty, delay)

    def read_decrement(self, qty: int, delay: float) -> tuple[str, int]:
        """2: no lock; the decrement is atomic but the check is stale (goes negative)."""
        available = self.read()
        if available <= 0:
            return SOLD_OUT, 0
        if qty > available:
            return REJECTED, 0
        time.sleep(delay)
        self.conn.execute(
            f"UPDATE {self.table} SET available = available - %s {self.where}", (qty, *self.row)
        )
        return CONFIRMED, 0

    def guarded_update(self, qty: int, delay: float) -> tuple[str, int]:
        """3: the check and the decrement in one statement; the database serializes it."""
        time.sleep(delay)
        changed = self.conn.execute(
            f"UPDATE {self.table} SET available = available - %s {self.where} AND available >= %s",
            (qty, *self.row, qty),
        )
        if changed == 1:
            return CONFIRMED, 0
        return (SOLD_OUT if self.read() <= 0 else REJECTED), 0

    def for_update(self, qty: int, delay: float) -> tuple[str, int]:
        """4: pessimistic row lock held for the whole transaction (SQLite: database lock)."""
        suffix = "" if self.conn.dialect == "sqlite" else " FOR UPDATE"
        return self.in_transaction(lambda: self.check_then_write(qty, delay, suffix))

    def optimistic(self, qty: int, delay: float) -> tuple[str, int]:
        """5: write only if the version is still the one read; otherwise read again."""
        retries = 0
        while True:
            available, version = self.select("available, version")
            if available <= 0:
                return SOLD_OUT, retries
            if qty > available:
                return REJECTED, retries
            time.sleep(delay)
            changed = self.conn.execute(
                f"UPDATE {self.table} SET available = %s, version = version + 1 "
                f"{self.where} AND version = %s",
                (available - qty, *self.row, version),
            )
            if changed == 1:
                return CONFIRMED, retries
            retries += 1

    def dblock_lock(self, qty: int, delay: float) -> tuple[str, int]:
        """6: a dblock lease on the SKU around the unprotected read-check-write of strategy 1."""
        if self.client is None:
            raise RuntimeError("the worker has no dblock client")
        with self.client.lock(self.lock_key, ttl=30, timeout=LOCK_WAIT):
            return self.check_then_write(qty, delay)

    def advisory(self, qty: int, delay: float) -> tuple[str, int]:
        """7: the database's advisory lock around read-check-write, as a dblock session hold
        (``ttl=None``: pg_advisory_lock, or MariaDB's GET_LOCK, on a connection of its own,
        with a fencing token)."""
        if self.client is None:
            raise RuntimeError("the worker has no dblock client")
        with self.client.lock(self.lock_key, ttl=None, timeout=LOCK_WAIT):
            return self.check_then_write(qty, delay)

    def in_transaction(self, body: Callable[[], tuple[str, int]]) -> tuple[str, int]:
        self.conn.begin()
        try:
            outcome = body()
        except BaseException:
            self.conn.rollback()
            raise
        self.conn.commit()
        return outcome


def run_strategy(
    worker: Worker, number: int, orders: list[tuple[int, float]], shared: Shared
) -> Stats:
    """Take orders from the shared book until it is empty or the stock is seen sold out."""
    stats = Stats()
    confirm = worker.strategy(number)
    try:
        while not shared.sold_out.is_set():
            with shared.next_order.get_lock():
                index = int(shared.next_order.value)
                if index >= len(orders):
                    break
                shared.next_order.value = index + 1
            qty, delay = orders[index]
            start = time.perf_counter()
            outcome, retries = confirm(qty, delay)
            elapsed = time.perf_counter() - start
            stats.retries += retries
            if outcome == CONFIRMED:
                stats.confirmed += 1
                stats.shipped += qty
                stats.latencies.append(elapsed)
                with shared.confirmed.get_lock():
                    shared.confirmed.value += 1
                with shared.shipped.get_lock():
                    shared.shipped.value += qty
            else:
                stats.rejected += 1
                if outcome == SOLD_OUT:
                    shared.sold_out.set()
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which fails the run
        detail = (str(exc).strip().splitlines() or [""])[0]
        stats.error = f"{type(exc).__name__}: {detail}"
    return stats


def worker_main(wid: int, config: Config, shared: Shared) -> None:
    """Process entry point: run each strategy the parent sends, until it sends None."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    worker = Worker(config.url, config.table, config.lock_table, config.inventory_url)
    orders = config.orders
    try:
        while True:
            number = shared.tasks.get()
            if number is None:
                return
            try:
                worker.open(number)
            except Exception as exc:  # noqa: BLE001 - reported to the parent
                detail = (str(exc).strip().splitlines() or [""])[0]
                shared.results.put(("ready", wid, f"{type(exc).__name__}: {detail}"))
                shared.go.wait()
                shared.results.put(("done", wid, Stats(error="could not connect")))
                continue
            shared.results.put(("ready", wid, None))
            shared.go.wait()
            shared.results.put(("done", wid, run_strategy(worker, number, orders, shared)))
    finally:
        worker.close()
