"""Output: the progress display, the results table, the conclusion, and JSON."""

from __future__ import annotations

from typing import Any, TextIO

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from ._db import SKUS
from ._runner import Result, several_stock
from ._strategies import ARRIVAL_TIMEOUT, ARRIVAL_TRIES, STALL_SECONDS, STALL_TTL, STALLED_SHOWS
from ._worker import REFUSED, WRITTEN


def verdict(result: Result) -> str:
    """A one-word judgement of the strategy's run."""
    if result.status == "skipped":
        return "skipped"
    if result.status == "error":
        return "ERROR"
    if result.oversold > 0 or result.unaccounted != 0:
        return "FAILED" if result.correct else "OVERSOLD"
    return "ok" if result.correct else "lucky"


class RichProgress:
    """One progress bar per strategy, left on screen when it is done (for terminals)."""

    def __init__(self, console: Console) -> None:
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(bar_width=30),
            TextColumn("{task.fields[units]:>5} units  {task.fields[orders]:>4} orders"),
            TimeElapsedColumn(),
            console=console,
        )
        self._task: TaskID | None = None
        self._total = 0

    def __enter__(self) -> RichProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def start(self, label: str, total: int) -> None:
        self._total = total
        self._task = self._progress.add_task(f"{label:<38}", total=total, units=0, orders=0)

    def update(self, confirmed: int, shipped: int) -> None:
        if self._task is not None:
            self._progress.update(
                self._task,
                completed=min(shipped, self._total),
                units=shipped,
                orders=confirmed,
            )

    def finish(self, result: Result) -> None:
        if result.status == "skipped":
            self._progress.add_task(
                f"{result.name:<38}", total=1, units="-", orders="-", start=False
            )
            return
        if self._task is not None:
            self.update(result.confirmed, result.shipped)
            self._progress.stop_task(self._task)
            self._task = None


class PlainProgress:
    """One line per finished strategy (when not on a terminal)."""

    def __init__(self, file: TextIO) -> None:
        self._file = file

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def start(self, label: str, total: int) -> None:
        return None

    def update(self, confirmed: int, shipped: int) -> None:
        return None

    def finish(self, result: Result) -> None:
        name = f"{result.number}{result.variant}. {result.title}"
        if result.status == "skipped":
            line = f"{name}: skipped ({result.note})"
        else:
            line = (
                f"{name}: {result.confirmed} orders, "
                f"{result.shipped} units in {result.elapsed:.2f} s ({verdict(result)})"
            )
        print(line, file=self._file, flush=True)


class NoProgress(PlainProgress):
    """Nothing at all (``--json`` off a terminal)."""

    def finish(self, result: Result) -> None:
        return None


_STYLES = {
    "ok": "green",
    "lucky": "yellow",
    "OVERSOLD": "red",
    "FAILED": "bold red on white",
    "ERROR": "bold red",
    "skipped": "dim",
}


def table(results: list[Result], stock: int, several: str = "") -> Table:
    """The results table: one row per strategy (per variant for strategies 8, whose stock
    ``several`` describes, and 9)."""
    title = f"Inventory deduction, initial stock {stock}"
    if several and any(r.number == 8 for r in results):
        title += f" (8: {several})"
    t = Table(title=title, title_justify="left")
    t.add_column("strategy")
    for name in ("orders", "shipped", "left", "oversold", "retries", "orders/s", "p99 ms"):
        t.add_column(name, justify="right")
    t.add_column("verdict")
    for r in results:
        word = verdict(r)
        if r.status == "skipped":
            t.add_row(r.name, *["-"] * 7, word, style=_STYLES[word])
            continue
        t.add_row(
            r.name,
            str(r.confirmed),
            str(r.shipped),
            str(r.stock_left),
            f"[red]{r.oversold}[/]" if r.oversold else "0",
            str(r.retries),
            f"{r.throughput:.0f}",
            f"{r.p99_ms:.1f}",
            f"[{_STYLES[word]}]{word}[/]",
        )
    return t


def _names(results: list[Result]) -> str:
    names = [f"{r.title} ({r.number}{r.variant})" for r in results]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def conclusion(results: list[Result], stock: int, workers: int = 2) -> str:
    """One plain-language paragraph about what this run showed."""
    ran = [r for r in results if r.status == "ok"]
    naive = [r for r in ran if not r.correct]
    racy = [r for r in naive if r.oversold or r.unaccounted]
    lucky = [r for r in naive if r not in racy]
    failed = [r for r in results if r.failed]
    parts = [_race(r, stock) for r in racy]
    if racy:
        parts.append(
            "Without a lock each worker checked a stock level that another worker was about "
            "to change, so orders were confirmed for goods that do not exist."
        )
    if lucky and workers == 1:
        parts.append(
            f"{_names(lucky)} did not oversell because a single worker cannot race with "
            "itself; run with more --workers to see them fail."
        )
    elif lucky:
        parts.append(
            f"{_names(lucky)} got lucky this time: a race needs two orders to overlap in the "
            "few milliseconds between read and write; run again, or with more --workers, "
            "and they oversell."
        )
    if failed:
        parts.append(
            f"SOMETHING IS WRONG: {_names(failed)} should be safe but oversold, lost units or "
            "failed; this is a bug worth reporting."
        )
    else:
        parts.extend(_costs({r.number: r for r in ran if r.correct and not r.variant}))
        parts.extend(_several({r.variant: r for r in ran if r.number == 8}))
        parts.extend(_stalled({r.variant: r for r in ran if r.number == 9}))
    return " ".join(parts)


def _race(r: Result, stock: int) -> str:
    what = f"{r.title} ({r.number}) confirmed {r.shipped} units from a stock of {stock}"
    if r.stock_left < 0:
        what += f", driving the stock to {r.stock_left}"
    elif r.unaccounted > 0:
        what += (
            f" yet the books show {r.stock_left} left: {r.unaccounted} units were shipped but "
            "never deducted (lost updates)"
        )
    return what + "."


def _costs(by: dict[int, Result]) -> list[str]:
    if not by:
        return []
    parts = ["Every protected strategy shipped exactly what was in stock and oversold nothing."]
    if 3 in by:
        parts.append(
            f"The single guarded UPDATE ({by[3].throughput:.0f} orders/s) is the baseline to "
            "beat: when the whole rule fits in one statement, let the database do it."
        )
    others = []
    if 4 in by:
        others.append(
            f"{by[4].title} ({by[4].throughput:.0f} orders/s) keeps a transaction and a lock "
            "open while the order is processed"
        )
    if 5 in by:
        others.append(
            f"the optimistic version column ({by[5].throughput:.0f} orders/s) needed "
            f"{by[5].retries} retries, wasted work that grows with contention"
        )
    if 7 in by:
        others.append(f"the advisory lock runs at {by[7].throughput:.0f} orders/s")
    if 6 in by:
        others.append(
            f"a dblock lock ({by[6].throughput:.0f} orders/s) pays two extra round trips per "
            "order (take and release the lease) and a hand-off between waiters, but it "
            "serializes the read-check-write across processes and hosts without holding a "
            "database transaction open, and protects work outside this one table too (other "
            "services, files, payments)"
        )
    if others:
        parts.append(
            "When the check needs more than one statement, the read-check-write must be "
            "serialized: " + "; ".join(others) + "."
        )
    return parts


def _several(by: dict[str, Result]) -> list[str]:
    """Strategy 8's variants: what taking several locks one by one costs."""
    if not by:
        return []
    parts = [
        "Orders of several SKUs (8) need every SKU's lock at once. None of the ways to take "
        "them oversold."
    ]
    if "a" in by:
        parts.append(
            f"lock_many (8a) takes them in one step of the store, all or none, so a waiter "
            f"holds none while it waits and no two orders can deadlock: "
            f"{by['a'].confirmed} orders in {by['a'].elapsed:.2f} s."
        )
    if "b" in by:
        parts.append(
            f"A lock per SKU in sorted order (8b) cannot deadlock either, but pays a round trip "
            f"per SKU and holds the first SKUs while it waits for the others: "
            f"{by['b'].confirmed} orders in {by['b'].elapsed:.2f} s."
        )
    if "c" in by:
        parts.append(
            f"Taken in the order the lines arrived (8c), two orders can each hold a SKU the "
            f"other waits for; only a lock timeout ({ARRIVAL_TIMEOUT:g} s) ends that: "
            f"{by['c'].retries} timeouts (the retries column: deadlocks, or waits too long to "
            f"tell from one), each giving up the SKUs held and trying again (at most "
            f"{ARRIVAL_TRIES} tries an order): {by['c'].confirmed} orders in "
            f"{by['c'].elapsed:.2f} s."
        )
    return parts


def shows(r: Result) -> str:
    """Strategy 9's row in one line: what its variant shows."""
    return STALLED_SHOWS[r.variant]


def _stalled(by: dict[str, Result]) -> list[str]:
    """Strategy 9's variants: a holder stalled past its lease, and what keeps it safe."""
    if not by:
        return []
    parts = [
        f"A holder stalled past its lease (9) is the case a lock alone cannot cover: once its "
        f"{STALL_TTL:g} s lease ran out another worker took the lock, and the stalled one "
        "woke up believing it still held it. Neither way of fencing its write oversold."
    ]
    if "a" in by:
        parts.append(
            f"The token column (9a) lets the row refuse the stale write once a newer holder "
            f"has claimed it: of {len(by['a'].stalled)} stalled holders "
            f"{by['a'].stalled.count(REFUSED)} were refused (refused writes done again in "
            f"all: {by['a'].retries})."
        )
    if "b" in by:
        parts.append(
            f"The guarded commit (9b) needs no column: lock.guard(conn) in the write's own "
            f"transaction refuses a hold already gone, and otherwise keeps the lock from "
            f"being taken over until COMMIT, so a holder stalled inside it still commits "
            f"while the next one waits: of {len(by['b'].stalled)} stalled holders "
            f"{by['b'].stalled.count(WRITTEN)} committed (refused writes done again in all: "
            f"{by['b'].retries})."
        )
    return parts


def _row(r: Result) -> dict[str, Any]:
    return {
        "number": r.number,
        "name": r.slug,
        "title": r.title,
        "correct": r.correct,
        "status": r.status,
        "verdict": verdict(r),
        "note": r.note,
        "orders_confirmed": r.confirmed,
        "orders_rejected": r.rejected,
        "units_shipped": r.shipped,
        "stock_left": r.stock_left,
        "oversold_units": r.oversold,
        "unaccounted_units": r.unaccounted,
        "retries": r.retries,
        "elapsed_s": round(r.elapsed, 4),
        "throughput_orders_per_s": round(r.throughput, 1),
        "p99_latency_ms": round(r.p99_ms, 2),
    }


def to_json(
    results: list[Result],
    *,
    url: str,
    dialect: str,
    workers: int,
    stock: int,
    seed: int,
    tables: list[str],
) -> dict[str, Any]:
    """The machine-readable form of a run."""
    return {
        "url": url,
        "dialect": dialect,
        "workers": workers,
        "stock": stock,
        "seed": seed,
        "tables": tables,
        "ok": not any(r.failed for r in results),
        "strategies": [_row(r) for r in results if not r.variant],
        # strategy 9 apart: its retries are refused writes of stale holds
        "stalled_holder": {
            "lease_s": STALL_TTL,
            "stall_s": STALL_SECONDS,
            "variants": [
                {
                    **_row(r),
                    "variant": r.variant,
                    "shows": shows(r),
                    "stalled_wrote": r.stalled.count(WRITTEN),
                    "stalled_refused": r.stalled.count(REFUSED),
                }
                for r in results
                if r.number == 9
            ],
        },
        # strategy 8 apart: its stock is several SKUs', its retries are lock timeouts
        "several_skus": {
            "skus": list(SKUS),
            "stock_per_sku": several_stock(stock),
            "variants": [
                {**_row(r), "variant": r.variant, "lock_timeouts": r.retries}
                for r in results
                if r.number == 8
            ],
        },
    }
