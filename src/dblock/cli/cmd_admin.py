"""Inspection and maintenance: ``list``, ``info``, ``release``, ``purge``, ``schema``."""

from __future__ import annotations

import click

import dblock
from dblock.tools import check_parameter_names, parse_url, quorum_urls, schema_script

from . import exit_codes
from .context import (
    AGE,
    CliError,
    common_options,
    misconfigured,
    open_client,
    open_reader,
    settings_of,
    validate_key,
    validate_prefix,
)
from .output import describe_holder, json_line, print_info, print_table, printable


@click.command(
    "list",
    short_help="Show current holds.",
    help="""Show the current holds, sorted by key: a table (key, kind, owner, token, held for,
expires in; characters a terminal would act on are shown escaped, as \\x1b), or with --json
one JSON object per line (exact; times in ISO-8601 UTC).

\b
Example:
  dblock list --prefix nightly-
  dblock list --json | jq -r .owner""",
)
@common_options
@click.option(
    "--prefix", default="", metavar="P", callback=validate_prefix, help="Only keys starting with P."
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_context
def list_command(ctx: click.Context, prefix: str, as_json: bool) -> int:
    client = open_reader(ctx)
    infos = [] if client is None else client.list(prefix)
    if as_json:
        for info in infos:
            click.echo(json_line(info))
    else:
        print_table(infos)
    return exit_codes.OK


@click.command(
    "info",
    short_help="Show the hold of one key.",
    help="""Show the current hold of KEY. Exits 1 (printing nothing on stdout) if it is not held.

\b
Example:
  dblock info nightly-report --json""",
)
@common_options
@click.argument("key", callback=validate_key)
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
@click.pass_context
def info_command(ctx: click.Context, key: str, as_json: bool) -> int:
    client = open_reader(ctx)
    info = None if client is None else client.info(key)
    if info is None:
        click.echo(f"dblock: {printable(key)} is not held", err=True)
        return exit_codes.FAILURE
    if as_json:
        click.echo(json_line(info))
    else:
        print_info(info)
    return exit_codes.OK


@click.command(
    "release",
    short_help="Free a key held by someone else (operator's override).",
    help="""Free KEY whoever holds it (operator's override); refused without --force.

The holder learns it on its next renewal: `dblock run` then stops its command. Exits 0 if
KEY was held, 1 if it was not.

\b
Example:
  dblock release nightly-report --force""",
)
@common_options
@click.argument("key", callback=validate_key)
@click.option("--force", is_flag=True, help="Really free another owner's hold.")
@click.pass_context
def release_command(ctx: click.Context, key: str, force: bool) -> int:
    if not force:
        raise click.UsageError(
            f"releasing {key!r} frees another owner's hold while its work may still run; "
            "add --force to do it anyway",
            ctx=ctx,
        )
    client = open_client(ctx)
    before = client.info(key)
    if client.force_release(key):
        click.echo(f"released {printable(key)} ({describe_holder(before)})")
        return exit_codes.OK
    click.echo(f"dblock: {printable(key)} was not held", err=True)
    return exit_codes.FAILURE


@click.command(
    "purge",
    short_help="Delete rows of locks not held now.",
    help="""Delete the rows of locks not held now: released or expired more than S seconds ago.

Fencing tokens stay monotonic. `once` records are kept unless --include-once is given (then
finished ones go too, so their keys may run again).

\b
Example:
  dblock purge --older-than 86400""",
)
@common_options
@click.option(
    "--older-than",
    type=AGE,
    default=0.0,
    show_default=True,
    metavar="S",
    help="Only rows released or expired more than S seconds ago.",
)
@click.option(
    "--include-once",
    is_flag=True,
    help="Also delete finished `once` records (their keys may then run again).",
)
@click.pass_context
def purge_command(ctx: click.Context, older_than: float, include_once: bool) -> int:
    count = open_client(ctx).purge(older_than, include_once=include_once)
    click.echo(f"purged {count} row{'' if count == 1 else 's'}")
    return exit_codes.OK


DIALECTS = ("postgresql", "mysql", "sqlite")


@click.command(
    "schema",
    short_help="Print the DDL of the lock table.",
    help="""Print the DDL that dblock runs to create its tables, for a DBA to apply by hand.
The dialect defaults to that of --url / DBLOCK_URL; no connection is made. Redis, etcd and
ZooKeeper need no DDL: dblock makes what it keeps there itself.

\b
Examples:
  dblock schema --dialect postgresql | psql -v ON_ERROR_STOP=1 "$DATABASE_URL"
  dblock schema --dialect mysql --table locks | mariadb mydb
  dblock schema --dialect sqlite | sqlite3 locks.sqlite3""",
)
@common_options
@click.option("--dialect", type=click.Choice(DIALECTS), default=None, help="SQL dialect.")
@click.pass_context
def schema_command(ctx: click.Context, dialect: str | None) -> int:
    settings = settings_of(ctx)
    try:
        effective = settings.effective_url()
        urls = [parse_url(one) for one in quorum_urls(effective) or [effective]]
        for url in urls:
            # what connect() would refuse: schema connects to nothing, but a wrong URL is wrong
            check_parameter_names(url)
    except dblock.ConfigurationError as exc:  # DBLOCK_URL's (--url's is parsed on entry)
        raise misconfigured(exc) from exc
    # the stores that have no DDL (Redis, etcd, ZooKeeper) make their lock table themselves:
    # a marker that connect() and the commands that take locks create
    dialects = sorted({url.dialect for url in urls if url.dialect in DIALECTS})
    if dialect is None and not dialects:
        names = sorted({url.dialect for url in urls})
        stores = (
            f"{names[0]} store needs"
            if len(names) == 1
            else f"{', '.join(names[:-1])} and {names[-1]} stores need"
        )
        click.echo(
            f"-- the {stores} no DDL: connect() and the commands that take locks (run, once) "
            "make the lock table themselves; nothing to apply"
        )
        return exit_codes.OK
    if dialect is None and len(dialects) > 1:  # a quorum of different SQL stores
        raise misconfigured(
            dblock.ConfigurationError(
                f"the quorum's stores are {', '.join(dialects)}: give --dialect for each"
            )
        )
    dialect = dialect or dialects[0]
    try:
        script = schema_script(dialect, settings.table)
    except ImportError as exc:
        raise CliError(f"the {dialect} backend is not available: {exc}") from exc
    click.echo(f"-- dblock {settings.table} ({dialect}): apply once; connect() checks for it")
    click.echo(script, nl=False)
    return exit_codes.OK


__all__ = [
    "info_command",
    "list_command",
    "purge_command",
    "release_command",
    "schema_command",
]
