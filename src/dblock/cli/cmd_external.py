"""``dblock demo`` and ``dblock bench``: thin launchers for modules shipped separately.

Each imports ``dblock.demo`` / ``dblock.bench`` only when run and calls its
``main(argv) -> int`` with the arguments that follow the command name.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence

import click

from . import exit_codes
from .context import DEFAULT_TABLE, CliError, common_options, settings_of


def _launch(module_name: str, argv: Sequence[str]) -> int:
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CliError(f"{module_name} is not available in this installation ({exc})") from None
    entry: Callable[[list[str]], object] | None = getattr(module, "main", None)
    if entry is None:
        raise CliError(f"{module_name} has no main()")
    try:
        result = entry(list(argv))
    except SystemExit as exc:
        result = exc.code
    if result is None:
        return exit_codes.OK
    if isinstance(result, int):
        return result
    click.echo(str(result), err=True)
    return exit_codes.FAILURE


_PASS_THROUGH = {"ignore_unknown_options": True, "allow_extra_args": True}


def _with_url(ctx: click.Context, args: tuple[str, ...], *, table: bool = False) -> list[str]:
    """ARGS, preceded by ``--url URL`` when --url was given to dblock and not in ARGS (and by
    ``--table NAME`` with ``table``: click takes both options for dblock's own)."""
    settings = settings_of(ctx)
    argv = list(args)
    if table and settings.table != DEFAULT_TABLE and "--table" not in argv:
        argv = ["--table", settings.table, *argv]
    if settings.url is not None and "--url" not in argv:
        argv = ["--url", settings.url, *argv]
    return argv


@click.command(
    "demo",
    context_settings=_PASS_THROUGH,
    short_help="The inventory deduction demo.",
    help="""The warehouse inventory deduction demo: several worker processes confirm orders of
one SKU at once, once per strategy (no lock, SELECT ... FOR UPDATE, optimistic version column,
a dblock lock, an advisory lock), and the oversold units of each are shown. Runs on the
embedded default database unless --url is given; ARGS go to the demo (`dblock demo -- --help`
lists them: --workers N, --stock N, --strategies LIST, --seed N, --json).

\b
Example:
  dblock demo --workers 16""",
)
@common_options
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def demo_command(ctx: click.Context, args: tuple[str, ...]) -> int:
    return _launch("dblock.demo", _with_url(ctx, args))


@click.command(
    "bench",
    context_settings=_PASS_THROUGH,
    short_help="Measure lock throughput and latency.",
    help="""Measure acquire/release rate, contended throughput and hand-off latency on your own
database, with progress. ARGS go to the benchmark (--duration S, ...; `dblock bench -- --help`
lists them).

\b
Example:
  dblock bench --url postgresql://app@db/app --duration 10""",
)
@common_options
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def bench_command(ctx: click.Context, args: tuple[str, ...]) -> int:
    return _launch("dblock.bench", _with_url(ctx, args, table=True))


__all__ = ["bench_command", "demo_command"]
