"""The ``dblock`` group, logging, and how failures become one line and an exit status."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from typing import TextIO, cast

import click

import dblock

from . import exit_codes
from .context import CliError, Settings, common_options, misconfigured, unavailable
from .logs import Logging
from .output import EscapingStream
from .supervisor import Interrupted, interrupted_by

log = logging.getLogger("dblock")


#: each command's module (in this package) and function. A command's module is imported only
#: when that command runs or help lists it: cron starts ``dblock run`` every minute, and the
#: other commands' modules (the election's, the dashboard's) cost it their import each time.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("cmd_run", "run_command"),
    "once": ("cmd_run", "once_command"),
    "lead": ("cmd_lead", "lead_command"),
    "leader": ("cmd_lead", "leader_command"),
    "list": ("cmd_admin", "list_command"),
    "info": ("cmd_admin", "info_command"),
    "release": ("cmd_admin", "release_command"),
    "purge": ("cmd_admin", "purge_command"),
    "schema": ("cmd_admin", "schema_command"),
    "demo": ("cmd_external", "demo_command"),
    "bench": ("cmd_external", "bench_command"),
    "dashboard": ("cmd_dashboard", "dashboard_command"),
}


def command_of(name: str) -> click.Command:
    """The command ``name`` of :data:`COMMANDS`, its module imported."""
    module, function = COMMANDS[name]
    found = getattr(importlib.import_module(f"{__package__}.{module}"), function)
    return cast("click.Command", found)


class _Commands(click.Group):
    """A group whose commands (:data:`COMMANDS`) are imported when first asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            self.add_command(command_of(cmd_name), cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(
    "dblock",
    cls=_Commands,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    help="""Distributed locks kept in your database or store: PostgreSQL, MySQL/MariaDB, SQLite
(the embedded default), Redis, etcd or ZooKeeper, or a quorum of several of them.

\b
Examples:
  dblock run --no-wait nightly-report -- python report.py
  dblock list
  DBLOCK_URL=postgresql://app@db/app dblock info nightly-report

--url, --table and --debug may be given before or after the command name.""",
)
@common_options
@click.version_option(dblock.__version__, "-V", "--version", prog_name="dblock")
def cli() -> None:
    pass


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _failure(exc: dblock.DBLockError, settings: Settings) -> CliError:
    """The one line and exit status of a dblock error that no command handled itself."""
    if isinstance(exc, dblock.ConfigurationError):  # e.g. raised by a backend after connecting
        return misconfigured(exc)
    if isinstance(exc, dblock.BackendError):
        return unavailable(settings.effective_url(), exc)
    return CliError(_one_line(exc))


def run_main(
    argv: Sequence[str] | None,
    *,
    settings: Settings | None = None,
    group: click.Group = cli,
    prog_name: str = "dblock",
) -> int:
    """Parse and run; map every failure to one stderr line and an exit status.

    ``settings``, ``group`` and ``prog_name``: for a host that runs some of the commands on
    a database it configured (Django's ``manage.py dblock``)."""
    settings = settings or Settings()
    Logging.install()
    try:
        try:
            result = group.main(
                args=list(argv) if argv is not None else None,
                prog_name=prog_name,
                standalone_mode=False,
                obj=settings,
            )
        except click.ClickException as exc:
            if settings.debug:
                traceback.print_exc()
            # usage errors quote the arguments given
            exc.show(cast("TextIO", EscapingStream(sys.stderr)))
            return exc.exit_code
        except Interrupted as exc:  # a signal while `run` waited, outside its own handling
            return exit_codes.SIGNAL_BASE + exc.signum
        except click.Abort:
            click.echo("", err=True)
            return exit_codes.SIGNAL_BASE + 2  # interrupted (SIGINT) while click handled it
        except Exception as exc:  # noqa: BLE001 - every failure: one line, an exit status
            interrupted = interrupted_by(exc)
            if interrupted is None:
                return _failed(exc, settings)
            return exit_codes.SIGNAL_BASE + interrupted.signum  # the signal's doing
        return result if isinstance(result, int) else exit_codes.OK
    finally:
        Logging.uninstall()


def _failed(exc: Exception, settings: Settings) -> int:
    """Report ``exc`` on one line (its traceback too under --debug); the exit status."""
    if isinstance(exc, BrokenPipeError):
        # e.g. `dblock list | head`: the reader has gone; nothing more to say, and no
        # "Exception ignored" when Python flushes stdout at exit
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return exit_codes.FAILURE
    if settings.debug:
        traceback.print_exception(exc)
    if isinstance(exc, dblock.DBLockError):
        error = _failure(exc, settings)
    else:  # any other failure: one line, no traceback
        hint = "" if settings.debug else " (run with --debug for the traceback)"
        error = CliError(f"{type(exc).__name__}: {_one_line(exc)}{hint}")
    error.show()
    return error.exit_code


__all__ = ["COMMANDS", "cli", "command_of", "run_main"]
