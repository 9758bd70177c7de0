"""What every command shares: --url/--table/--debug, opening the client, one-line errors."""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import click

import dblock
from dblock.tools import (
    MAX_TTL,
    DatabaseURL,
    MissingTable,
    check_key,
    check_seconds,
    check_table,
    default_url,
    parse_url,
    quorum_urls,
    redact,
    scrub,
)

from . import exit_codes
from .logs import enable_debug

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_TABLE = "dblock_locks"


@dataclass
class Settings:
    """Options given to the group or to a subcommand (the subcommand's win)."""

    url: str | None = None
    table: str = DEFAULT_TABLE
    debug: bool = False
    #: the warning about a password in --url has been given
    warned: bool = False

    def effective_url(self) -> str:
        """--url, else DBLOCK_URL, else the embedded SQLite default."""
        return self.url or default_url()

    def safe_url(self) -> str:
        return redact(self.effective_url())


class CliError(click.ClickException):
    """A failure reported as one line ``dblock: message`` with its own exit status."""

    def __init__(self, message: str, exit_code: int = exit_codes.FAILURE) -> None:
        super().__init__(message)
        # click >= 8.5 declares exit_code a ClassVar; click reads it from the instance
        setattr(self, "exit_code", exit_code)  # noqa: B010

    def show(self, file: Any = None) -> None:
        from .output import printable  # messages quote keys, owners and notes

        click.echo(f"dblock: {printable(self.format_message())}", file=file or sys.stderr)


def settings_of(ctx: click.Context) -> Settings:
    return ctx.ensure_object(Settings)


#: query parameters that hold a password (libpq's, ZooKeeper's user:password; MySQL's none)
_SECRET_PARAMETERS = frozenset({"password", "sslpassword", "digest"})
EXPOSED_URL_WARNING = (
    "dblock: warning: --url holds a password, which every local user can read in the process "
    "list while dblock runs; put the URL in DBLOCK_URL, or the password in ~/.pgpass "
    "(PostgreSQL; or PGPASSFILE)"
)


def _has_password(url: DatabaseURL) -> bool:
    return bool(url.password) or any(
        name.lower() in _SECRET_PARAMETERS and value for name, value in url.query.items()
    )


def _stores(value: str) -> list[str]:
    """The URLs in one ``--url`` value: several separated by spaces (a quorum), or one (a
    SQLite path may hold a space)."""
    parts = value.split()
    return parts if len(parts) > 1 and all("://" in p for p in parts) else [value]


def _store(name: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if value is None or value is False:
            return
        settings = settings_of(ctx)
        if name == "table":
            try:
                check_table(value)
            except dblock.ConfigurationError as exc:
                raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
        if name == "url":
            if not value:
                return
            # --url given several times (or one value of URLs separated by spaces, as in
            # DBLOCK_URL): the stores of a quorum, in order, before and after the command name
            urls = [one for given in value for one in _stores(given)]
            for url in urls:
                try:
                    parsed = parse_url(url)
                except dblock.ConfigurationError as exc:
                    raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
                if not settings.warned and _has_password(parsed):
                    settings.warned = True
                    click.echo(EXPOSED_URL_WARNING, err=True)
            # the same URL given again (before and after the command name) is one store
            given = [*(_stores(settings.url) if settings.url else []), *urls]
            value = " ".join(dict.fromkeys(given))
        setattr(settings, name, value)
        if name == "debug":
            enable_debug()

    return callback


def common_options(fn: F) -> F:
    """``--url``, ``--table`` and ``--debug``, accepted by the group and by every command."""
    options = [
        click.option(
            "--url",
            metavar="URL",
            multiple=True,
            expose_value=False,
            callback=_store("url"),
            help="Store URL: postgresql://, mysql://, sqlite:///, redis://, etcd://, "
            "zookeeper:// (default: $DBLOCK_URL, else the embedded SQLite file "
            "~/.local/state/dblock/locks.sqlite3). Given three or more times: a quorum of "
            "independent stores (docs/stores/quorum.md).",
        ),
        click.option(
            "--table",
            metavar="NAME",
            expose_value=False,
            callback=_store("table"),
            help=f"Lock table, optionally schema.table (default: {DEFAULT_TABLE}).",
        ),
        click.option(
            "--debug",
            is_flag=True,
            default=False,
            expose_value=False,
            callback=_store("debug"),
            help="Log what dblock does and show tracebacks.",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


if TYPE_CHECKING:
    _FloatParam = click.ParamType[float]
else:  # generic only since click 8.2
    _FloatParam = click.ParamType


class Seconds(_FloatParam):
    """A finite number of seconds: > 0 (a lease) or >= 0 (a wait), as dblock validates them."""

    name = "seconds"

    def __init__(self, *, allow_zero: bool, maximum: float = math.inf) -> None:
        self.allow_zero = allow_zero
        self.maximum = maximum

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, float):
            return value
        try:
            number = float(value)
        except ValueError:
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        try:
            return check_seconds(number, "value", allow_zero=self.allow_zero, maximum=self.maximum)
        except ValueError as exc:
            self.fail(str(exc).replace("value ", "", 1), param, ctx)


LEASE = Seconds(allow_zero=False, maximum=MAX_TTL)
WAIT = Seconds(allow_zero=True)
#: how far back ``purge --older-than`` may look: a century (a time before the databases'
#: calendars would be an error of the database, exit 69, for a mistake in an option)
AGE = Seconds(allow_zero=True, maximum=100 * 365.25 * 86400)


def validate_key(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """Click callback: a lock key as the library allows it (see check_key)."""
    try:
        return check_key(value)
    except (TypeError, ValueError) as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


def validate_prefix(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """Click callback: a key prefix (empty: every key) follows the rules of a key."""
    return validate_key(ctx, param, value) if value else value


def validate_note(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Click callback: a note is text any database can store (no NUL, valid Unicode)."""
    if value is None:
        return None
    if "\x00" in value:
        raise click.BadParameter("must not contain NUL characters", ctx=ctx, param=param)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # bytes of the command line that are not UTF-8
        raise click.BadParameter(
            "must be valid Unicode text (it contains bytes that are not UTF-8)",
            ctx=ctx,
            param=param,
        ) from None
    return value


def unavailable(url: str, exc: BaseException) -> CliError:
    """The one-line error for a database that cannot be reached; never shows the password."""
    lines = str(exc).strip().splitlines()
    detail = lines[0] if lines else type(exc).__name__
    try:
        stores = quorum_urls(url) or [url]  # a quorum's, each
    except dblock.ConfigurationError:
        stores = [url]
    safe = " ".join(redact(one) for one in stores)
    if safe not in detail:
        detail = f"{safe}: {detail}"
    secrets: list[str] = []
    for one in stores:
        with contextlib.suppress(dblock.ConfigurationError):
            secrets += parse_url(one).secrets
    detail = scrub(detail, secrets)
    return CliError(f"database unavailable: {detail}", exit_codes.UNAVAILABLE)


def misconfigured(exc: dblock.ConfigurationError) -> CliError:
    """Exit 2 with one line: a setting that retrying will not fix (not 69, "try again later")."""
    lines = str(exc).strip().splitlines()
    return CliError(lines[0] if lines else "invalid configuration", exit_codes.USAGE)


def open_client(ctx: click.Context, *, close_on_exit: bool = True) -> dblock.Client:
    """Connect as the options say, creating the lock table if need be; exit 2 for
    a configuration mistake, 69 if the database cannot be reached."""
    settings = settings_of(ctx)
    url = settings.effective_url()
    try:
        client = dblock.connect(url, table=settings.table)
    except dblock.ConfigurationError as exc:
        raise misconfigured(exc) from exc
    except dblock.BackendError as exc:
        raise unavailable(url, exc) from exc
    if close_on_exit:
        ctx.call_on_close(client.close)
    return client


def open_reader(ctx: click.Context) -> dblock.Client | None:
    """Like open_client, for the commands that only look: they never create or alter
    anything. None when the lock table does not exist yet (nothing was ever held in it)."""
    settings = settings_of(ctx)
    url = settings.effective_url()
    try:
        client = dblock.connect(url, table=settings.table, create_schema=False)
    except MissingTable:
        return None
    except dblock.ConfigurationError as exc:
        raise misconfigured(exc) from exc
    except dblock.BackendError as exc:
        raise unavailable(url, exc) from exc
    ctx.call_on_close(client.close)
    return client
