"""Command-line options and exit statuses of ``dblock demo``."""

from __future__ import annotations

import argparse
import json
import secrets
import sys
from collections.abc import Callable

from rich.console import Console

import dblock

from .._url import DatabaseURL, default_url, quorum_urls, redact, scrub
from ..stores import parse_url
from ._db import SKUS
from ._report import (
    NoProgress,
    PlainProgress,
    RichProgress,
    conclusion,
    shows,
    table,
    to_json,
    verdict,
)
from ._runner import MAX_LINE_QTY, MAX_LINES, MAX_QTY, Demo, Result, SetupFailed, Unreachable
from ._strategies import (
    STALL_SECONDS,
    STALL_TTL,
    STALLS,
    STRATEGIES,
    Strategy,
    parse_strategies,
)

EX_OK, EX_FAILED, EX_USAGE, EX_UNAVAILABLE, EX_INTERRUPTED = 0, 1, 2, 69, 130
MAX_WORKERS = 32
MAX_STOCK = 1_000_000


def _bounded(name: str, low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, not {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{name} must be between {low} and {high}")
        return value

    return parse


def _strategies(text: str) -> list[Strategy]:
    try:
        return parse_strategies(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    numbers = "; ".join(f"{s.number} {s.slug}" for s in STRATEGIES)
    parser = argparse.ArgumentParser(
        prog="dblock demo",
        description=(
            "Warehouse inventory deduction: worker processes confirm outbound orders of one "
            "SKU at once, once per strategy, and the demo shows which oversell and what each "
            "costs; strategy 8 confirms orders of several SKUs, taking their locks with "
            "lock_many, one by one in sorted order, or one by one in arrival order with a "
            "timeout; strategy 9 stalls a few holders past a short lease and keeps their "
            "writes safe with a fencing token column or a guarded commit (lock.guard). "
            "Uses its own tables (dblock_demo_*), created and dropped by the run."
        ),
    )
    parser.add_argument(
        "--url", help="database URL (default: DBLOCK_URL, else the embedded SQLite file)"
    )
    parser.add_argument(
        "--workers",
        type=_bounded("--workers", 1, MAX_WORKERS),
        default=8,
        help="worker processes (default: 8)",
    )
    parser.add_argument(
        "--stock",
        type=_bounded("--stock", 1, MAX_STOCK),
        default=100,
        help="initial stock of the SKU (default: 100; strategy 8: a fifth of it for each SKU)",
    )
    parser.add_argument(
        "--strategies",
        type=_strategies,
        default=list(STRATEGIES),
        help=f"comma-separated numbers or names (default: all): {numbers}",
    )
    parser.add_argument(
        "--seed",
        type=_bounded("--seed", 0, 2**63 - 1),
        default=None,
        help="seed of the order quantities (default: random, printed)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    return parser


def _single_store(given: str | None) -> DatabaseURL:
    """The store the demo runs on (it needs one: its inventory lives there)."""
    if quorum_urls(given) is not None:
        raise dblock.ConfigurationError(
            "the demo runs on one store: give a single --url (not a quorum)"
        )
    return parse_url(given if given is not None else default_url())


def run(argv: list[str] | None = None) -> int:
    """Parse ``argv``, run the demo, print the results; return the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse has printed the usage error or the help
        return exc.code if isinstance(exc.code, int) else EX_USAGE
    try:
        url = _single_store(args.url)
    except dblock.ConfigurationError as exc:
        print(f"dblock demo: error: {exc}", file=sys.stderr)
        return EX_USAGE
    seed: int = args.seed if args.seed is not None else secrets.randbelow(1_000_000)
    err = Console(stderr=True, highlight=False)
    out = Console(highlight=False)
    if not out.is_terminal:
        out = Console(highlight=False, width=120)
    progress: RichProgress | PlainProgress
    if err.is_terminal:
        progress = RichProgress(err)
    elif args.json:
        progress = NoProgress(sys.stderr)
    else:
        progress = PlainProgress(sys.stderr)
    demo = Demo(url, args.workers, args.stock, seed, progress)
    results: list[Result] = []
    status = _execute(demo, args, out, results)
    if status is not None:
        return status
    failed = [r for r in results if r.failed]
    if args.json:
        payload = to_json(
            results,
            url=url.safe,
            dialect=url.dialect,
            workers=args.workers,
            stock=args.stock,
            seed=seed,
            tables=demo.object_names(),
        )
        print(json.dumps(payload, indent=2))
    else:
        _print_report(out, results, args.stock, args.workers, _several_stock(demo))
    for r in failed:
        what = r.note if r.status == "error" else f"oversold {r.oversold} units"
        if r.status != "error" and r.unaccounted:
            what += f", {r.unaccounted} units unaccounted for"
        err.print(
            f"[bold red]dblock demo: FAILED: strategy {r.number}{r.variant} ({r.title}) must be "
            f"safe but {what}[/]"
        )
    return EX_FAILED if failed else EX_OK


def _execute(
    demo: Demo, args: argparse.Namespace, out: Console, results: list[Result]
) -> int | None:
    """Set up, run every strategy into ``results``, clean up; an exit status if it failed."""
    url = demo.url
    try:
        demo.setup(args.strategies)
        if not args.json:
            _print_header(out, demo)
        with demo.progress:
            for strategy in args.strategies:
                for variant in strategy.variants:
                    results.append(demo.run(strategy, variant))
    except (Unreachable, dblock.BackendError) as exc:
        print(f"dblock demo: cannot reach the database at {url.safe}: {exc}", file=sys.stderr)
        return EX_UNAVAILABLE
    except dblock.ConfigurationError as exc:
        print(f"dblock demo: error: {exc}", file=sys.stderr)
        return EX_USAGE
    except SetupFailed as exc:
        print(f"dblock demo: cannot set up the demo's tables in {url.safe}: {exc}", file=sys.stderr)
        return EX_FAILED
    except KeyboardInterrupt:
        print("dblock demo: interrupted", file=sys.stderr)
        return EX_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - one line, no traceback, as for every command
        detail = redact((str(exc).strip().splitlines() or [type(exc).__name__])[0])
        detail = scrub(detail, url.secrets)
        print(f"dblock demo: failed: {type(exc).__name__}: {detail}", file=sys.stderr)
        return EX_FAILED
    finally:
        for warning in demo.cleanup():
            print(f"dblock demo: warning: {warning}", file=sys.stderr)
    return None


def _print_header(out: Console, demo: Demo) -> None:
    demand = sum(qty for qty, _ in demo.orders)
    out.print(
        f"[bold]dblock demo[/]: {demo.workers} worker processes confirm orders of "
        f"1-{MAX_QTY} units of one SKU (stock {demo.stock}), seed {demo.seed}"
    )
    out.print(
        f"order book: {len(demo.orders)} orders, {demand} units; each order reads the stock, "
        "takes 1-3 ms to process, then writes it",
        markup=False,
    )
    if demo.several_in_use:
        out.print(
            f"strategy 8: {len(demo.several)} orders of 1-{MAX_LINES} SKUs, "
            f"1-{MAX_LINE_QTY} units each, over {_several_stock(demo)}; each order locks "
            "its SKUs, reads them, takes 1-3 ms, then decrements them all in one transaction",
            markup=False,
        )
    if any(s.number == 9 for s in demo.strategies):
        where = {"taken": "right after taking the lock", "processing": "while processing"}
        stalls = "; ".join(f"order {i + 1} {where[w]}" for i, w in sorted(STALLS.items()))
        out.print(
            f"strategy 9: as strategy 6 with a {STALL_TTL:g} s lease; holders stall "
            f"{STALL_SECONDS:g} s ({stalls}) and another worker takes the lock meanwhile",
            markup=False,
        )
    out.print(f"database: {demo.url.safe}", markup=False)
    out.print(f"demo tables (dropped at exit): {', '.join(demo.object_names())}", markup=False)


def _several_stock(demo: Demo) -> str:
    return f"{len(SKUS)} SKUs of {demo.several_stock} units"


def _print_report(
    out: Console, results: list[Result], stock: int, workers: int, several: str
) -> None:
    out.print()
    out.print(table(results, stock, several))
    for r in results:
        if r.status != "ok":
            out.print(f"  {r.name}: {verdict(r)}: {r.note}", markup=False)
        elif r.number == 9:
            out.print(f"  {r.name}: {shows(r)}", markup=False)
    out.print()
    out.print(conclusion(results, stock, workers), markup=False)
