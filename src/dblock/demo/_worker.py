"""A worker process: confirms outbound orders from the shared order book, one strategy at a time.

Each worker opens its own database connection (and, for the dblock strategy, its own dblock
client). Orders are taken from a shared counter, so every strategy sees the same order book.
Between reading the stock and writing it, the worker "processes" the order for a millisecond
or three (validation, pick list, carrier booking), as a real service would; that is the window
in which unprotected strategies race.

Strategy 8 confirms orders of several SKUs: under locks on the order's SKUs it reads their
stock and, if every line is in stock, processes the order and decrements every SKU in one
transaction. Its variants differ only in how they take the locks.

Strategy 9 is strategy 6 with a short lease, where a few holders stall past it (a GC pause, a
swapped-out process) and another worker takes the lock meanwhile. The lock alone no longer
serializes the writes; its variants keep them safe: a fencing token column on the row (a), or
the write's own transaction guarded by ``lock.guard`` with no token column (b).
"""

from __future__ import annotations

import contextlib
import logging
import random
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import dblock
from dblock.fencing import fenced_update

from ..stores import parse_url
from ._db import SKU, WAREHOUSE, DemoDB
from ._strategies import ARRIVAL_TIMEOUT, ARRIVAL_TRIES, STALL_SECONDS, STALL_TTL, STALLS

CONFIRMED, REJECTED, SOLD_OUT = "confirmed", "rejected", "sold_out"
LOCK_WAIT = 60.0  # seconds a worker waits for a lock before giving up on an order

#: an order of several SKUs: ((sku, quantity), ...) in the order the lines arrived, and its
#: processing seconds
Lines = tuple[tuple[str, int], ...]
SeveralOrder = tuple[Lines, float]
#: what the parent sends a worker: (strategy number, variant), or None to stop
Task = tuple[int, str]
#: what became of a stalled holder's write (strategy 9)
WRITTEN, REFUSED = "written", "refused"


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
    #: strategy 8's order book
    several: list[SeveralOrder] = field(default_factory=list)


@dataclass
class Shared:
    """Synchronized objects inherited by every worker (multiprocessing primitives)."""

    next_order: Any  # Value('q'): index of the next order in the book
    confirmed: Any  # Value('q'): orders confirmed so far (progress)
    shipped: Any  # Value('q'): units shipped so far (progress)
    sold_out: Any  # Event: a worker saw the stock at 0
    go: Any  # Event: all workers are connected, start now
    tasks: Any  # Queue: Task, None to stop
    results: Any  # Queue: ("ready" | "done", worker, payload)


@dataclass
class Stats:
    """What one worker saw while running one strategy."""

    confirmed: int = 0
    rejected: int = 0
    shipped: int = 0
    retries: int = 0
    latencies: list[float] = field(default_factory=list)
    #: strategy 9: what became of each stalled holder's write (WRITTEN or REFUSED)
    stalled: list[str] = field(default_factory=list)
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
        #: strategy 9: what became of the stalled holders' writes in this worker
        self.stalled: list[str] = []

    def open(self, number: int) -> None:
        if self.db is None:
            self.db = DemoDB(self.parsed)
        # 6, 7 (a session hold), 8 and 9 lock through dblock
        if number in (6, 7, 8, 9) and self.client is None:
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
        return self.select_row(columns, self.row, suffix)

    def select_row(self, columns: str, row: tuple[str, str], suffix: str = "") -> tuple[int, ...]:
        found = self.conn.one(f"SELECT {columns} FROM {self.table} {self.where}{suffix}", row)
        if found is None:
            raise RuntimeError(f"the inventory row of {row[0]} vanished from {self.table}")
        return tuple(int(v) for v in found)

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

    def several_skus(self, variant: str, lines: Lines, delay: float) -> tuple[str, int]:
        """8: under locks on the order's SKUs (taken as ``variant`` says), read their stock;
        if every line is in stock, process the order and decrement every SKU in one
        transaction. Variant c's lock timeouts are its retries: it gives up the locks it has
        and tries the order again, ARRIVAL_TRIES times in all, then rejects it."""
        timeouts = 0
        while True:
            try:
                with self.skus_locked(variant, [sku for sku, _ in lines]):
                    return self.confirm_lines(lines, delay), timeouts
            except dblock.LockTimeout:
                if variant != "c":
                    raise
                timeouts += 1
                if timeouts >= ARRIVAL_TRIES:
                    return REJECTED, timeouts
                time.sleep(random.uniform(0, ARRIVAL_TIMEOUT / 2))  # let the rival through

    @contextlib.contextmanager
    def skus_locked(self, variant: str, skus: Sequence[str]) -> Iterator[None]:
        """a: lock_many over the SKUs; b: a lock per SKU, in sorted order; c: a lock per SKU,
        in the order given (two orders with two SKUs in opposite orders deadlock: each holds
        one and waits for the other until its short timeout)."""
        if self.client is None:
            raise RuntimeError("the worker has no dblock client")
        keys = [f"inventory:{WAREHOUSE}:{sku}" for sku in skus]
        if variant == "a":
            with self.client.lock_many(keys, ttl=30, timeout=LOCK_WAIT):
                yield
            return
        wait = ARRIVAL_TIMEOUT if variant == "c" else LOCK_WAIT
        with contextlib.ExitStack() as held:
            for key in keys if variant == "c" else sorted(keys):
                held.enter_context(self.client.lock(key, ttl=30, timeout=wait))
            yield

    def confirm_lines(self, lines: Lines, delay: float) -> str:
        """Read each line's stock; if all are in stock, process, then decrement them all in
        one transaction (safe only while the SKUs are locked)."""
        if any(self.select_row("available", (sku, WAREHOUSE))[0] < qty for sku, qty in lines):
            left = self.conn.one(f"SELECT COUNT(*) FROM {self.table} WHERE available > 0")
            return SOLD_OUT if left is not None and int(left[0]) == 0 else REJECTED
        time.sleep(delay)

        def decrement() -> tuple[str, int]:
            for sku, qty in lines:
                self.conn.execute(
                    f"UPDATE {self.table} SET available = available - %s {self.where}",
                    (qty, sku, WAREHOUSE),
                )
            return CONFIRMED, 0

        return self.in_transaction(decrement)[0]

    def stalled_holder(self, variant: str, qty: int, delay: float, stall: str) -> tuple[str, int]:
        """9: read-check-write under a lease of STALL_TTL; the orders of STALLS stall past it
        (``stall``: "taken", right after taking the lock, or "processing", after reading
        the stock). A write refused (a: by the token column, b: by the guard) means the hold
        was stale: the order starts again under a new hold (the retries column)."""
        refused = 0
        while True:
            outcome = self.stalled_once(variant, qty, delay, stall)
            if stall:
                self.stalled.append(REFUSED if outcome is None else WRITTEN)
                stall = ""  # the order's next try runs at full speed
            if outcome is not None:
                return outcome, refused
            refused += 1

    def stalled_once(self, variant: str, qty: int, delay: float, stall: str) -> str | None:
        """One try of a strategy 9 order: its outcome, or None if its write was refused."""
        if self.client is None:
            raise RuntimeError("the worker has no dblock client")
        lock = self.client.lock(self.lock_key, ttl=STALL_TTL)
        # waiters are woken by releases, and look at a lease that simply runs out only every
        # few seconds; short waits, tried again, take a stalled holder's lock over as soon as
        # its lease is gone, which is what this strategy is about
        deadline = time.monotonic() + LOCK_WAIT
        while not lock.acquire(timeout=STALL_TTL / 2):
            if time.monotonic() > deadline:
                raise dblock.LockTimeout(f"no hold of {self.lock_key!r} within {LOCK_WAIT:g} s")
        try:
            token = lock.token
            if token is None:
                return None  # lost already (a lease this short, on a loaded machine)
            if stall == "taken":
                time.sleep(STALL_SECONDS)
            extra = STALL_SECONDS if stall == "processing" else 0.0
            if variant == "a":
                return self.fenced(token, qty, delay + extra)
            return self.guarded(lock, qty, delay + extra)
        finally:
            # a stalled lease has run out (LockLost): the write was fenced or guarded, and
            # the token column or the guard has already refused it if it was stale
            with contextlib.suppress(dblock.LockLost):
                lock.release()

    def fenced(self, token: int, qty: int, delay: float) -> str | None:
        """9a: claim the row with the hold's token, then read-check-write; every statement
        changes the row only if no newer token has been recorded on it. The claim before
        the read is what makes it safe: a newer holder claims the row before it reads, so
        a stale write that lands after that read is refused, never overwritten."""
        keys = ["sku", "warehouse"]
        claim = fenced_update(self.conn.dialect, self.table, [], keys)
        if self.conn.execute(claim.sql, claim.params([], self.row, token)) != 1:
            return None
        available = self.read()
        if available <= 0:
            return SOLD_OUT
        if qty > available:
            return REJECTED
        time.sleep(delay)
        write = fenced_update(self.conn.dialect, self.table, ["available"], keys)
        if self.conn.execute(write.sql, write.params([available - qty], self.row, token)) != 1:
            return None
        return CONFIRMED

    def guarded(self, lock: dblock.Lock, qty: int, delay: float) -> str | None:
        """9b: the read-check-write of strategy 1 in a transaction that ``lock.guard``
        opens: the guard refuses a hold that is gone (LockLost: roll back), else holds the
        lock's row still until COMMIT, so no other worker takes the lock before it."""

        def body() -> tuple[str, int]:
            lock.guard(self.conn.connection)
            return self.check_then_write(qty, delay)

        try:
            return self.in_transaction(body)[0]
        except dblock.LockLost:
            return None  # rolled back: nothing written

    def in_transaction(self, body: Callable[[], tuple[str, int]]) -> tuple[str, int]:
        self.conn.begin()
        try:
            outcome = body()
        except BaseException:
            self.conn.rollback()
            raise
        self.conn.commit()
        return outcome


def _book(
    worker: Worker, task: Task, config: Config
) -> tuple[Sequence[Any], Callable[[Any], tuple[str, int]], Callable[[Any], int]]:
    """The order book of ``task``, how an order is confirmed, and its units."""
    number, variant = task
    if number == 8:
        return (
            config.several,
            lambda o: worker.several_skus(variant, o[0], o[1]),
            lambda o: sum(qty for _, qty in o[0]),
        )
    if number == 9:
        book = [(qty, delay, STALLS.get(i, "")) for i, (qty, delay) in enumerate(config.orders)]
        return (
            book,
            lambda o: worker.stalled_holder(variant, o[0], o[1], o[2]),
            lambda o: int(o[0]),
        )
    confirm = worker.strategy(number)
    return config.orders, lambda o: confirm(o[0], o[1]), lambda o: int(o[0])


def run_strategy(worker: Worker, task: Task, config: Config, shared: Shared) -> Stats:
    """Take orders from the shared book until it is empty or the stock is seen sold out."""
    stats = Stats()
    worker.stalled = stats.stalled
    orders, confirm, units = _book(worker, task, config)
    try:
        while not shared.sold_out.is_set():
            with shared.next_order.get_lock():
                index = int(shared.next_order.value)
                if index >= len(orders):
                    break
                shared.next_order.value = index + 1
            start = time.perf_counter()
            outcome, retries = confirm(orders[index])
            elapsed = time.perf_counter() - start
            stats.retries += retries
            if outcome == CONFIRMED:
                qty = units(orders[index])
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


def _unexpected(record: logging.LogRecord) -> bool:
    """Strategy 9's stalled holders lose their leases on purpose (the report counts them):
    no warning for that on the demo's stderr."""
    return not str(record.msg).startswith("lost the ")


def worker_main(wid: int, config: Config, shared: Shared) -> None:
    """Process entry point: run each strategy the parent sends, until it sends None."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    logging.getLogger("dblock").addFilter(_unexpected)
    worker = Worker(config.url, config.table, config.lock_table, config.inventory_url)
    try:
        while True:
            task: Task | None = shared.tasks.get()
            if task is None:
                return
            try:
                worker.open(task[0])
            except Exception as exc:  # noqa: BLE001 - reported to the parent
                detail = (str(exc).strip().splitlines() or [""])[0]
                shared.results.put(("ready", wid, f"{type(exc).__name__}: {detail}"))
                shared.go.wait()
                shared.results.put(("done", wid, Stats(error="could not connect")))
                continue
            shared.results.put(("ready", wid, None))
            shared.go.wait()
            shared.results.put(("done", wid, run_strategy(worker, task, config, shared)))
    finally:
        worker.close()
