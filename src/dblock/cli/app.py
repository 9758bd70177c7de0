"""The ``dblock`` group, logging, and how failures become one line and an exit status."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from typing import TextIO, cast

import click

import dblock

from . import exit_codes
from .cmd_admin import info_command, list_command, purge_command, release_command, schema_command
from .cmd_dashboard import dashboard_command
from .cmd_external import bench_command, demo_command
from .cmd_lead import lead_command, leader_command
from .cmd_run import once_command, run_command
from .context import CliError, Settings, common_options, misconfigured, unavailable
from .logs import Logging
from .output import EscapingStream
from .supervisor import Interrupted

log = logging.getLogger("dblock")


@click.group(
    "dblock",
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


for _command in (
    run_command,
    once_command,
    lead_command,
    leader_command,
    list_command,
    info_command,
    release_command,
    purge_command,
    schema_command,
    demo_command,
    bench_command,
    dashboard_command,
):
    cli.add_command(_command)


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
        except dblock.DBLockError as exc:
            if settings.debug:
                traceback.print_exc()
            error = _failure(exc, settings)
            error.show()
            return error.exit_code
        except BrokenPipeError:
            # e.g. `dblock list | head`: the reader has gone; nothing more to say, and no
            # "Exception ignored" when Python flushes stdout at exit
            with contextlib.suppress(OSError, ValueError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return exit_codes.FAILURE
        except Exception as exc:  # noqa: BLE001 - any other failure: one line, no traceback
            if settings.debug:
                traceback.print_exc()
            hint = "" if settings.debug else " (run with --debug for the traceback)"
            CliError(f"{type(exc).__name__}: {_one_line(exc)}{hint}").show()
            return exit_codes.FAILURE
        return result if isinstance(result, int) else exit_codes.OK
    finally:
        Logging.uninstall()


__all__ = ["cli", "run_main"]
