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
from .cmd_external import bench_command, demo_command
from .cmd_run import once_command, run_command
from .context import CliError, Settings, common_options, misconfigured, unavailable
from .output import EscapingStream, printable
from .supervisor import Interrupted

log = logging.getLogger("dblock")


@click.group(
    "dblock",
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    help="""Distributed locks kept in your database: PostgreSQL, MySQL/MariaDB or SQLite.

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
    list_command,
    info_command,
    release_command,
    purge_command,
    schema_command,
    demo_command,
    bench_command,
):
    cli.add_command(_command)


class _QuietRepeats(logging.Filter):
    """Without --debug: each warning once per message and key, so a database outage does not
    flood stderr with renewal retries; the core's lease-lost line is left to ``run``'s own."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[tuple[str, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if log.level <= logging.DEBUG:
            return True
        if str(record.msg).startswith("lost the lease of lock"):
            return False
        first = str(record.args[0]) if isinstance(record.args, tuple) and record.args else ""
        seen = (str(record.msg), first)
        if seen in self._seen:
            return False
        self._seen.add(seen)
        return True


class _EscapingFormatter(logging.Formatter):
    """Log messages quote keys and owners: escape what a terminal would act on (the traceback
    that --debug adds is left as it is)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(super().formatMessage(record))


class _Logging:
    """The CLI's log handler on stderr: warnings by default, everything with --debug."""

    handler: logging.Handler | None = None
    previous_level = logging.NOTSET

    @classmethod
    def install(cls) -> None:
        cls.handler = logging.StreamHandler(sys.stderr)
        cls.handler.setFormatter(_EscapingFormatter("dblock: %(message)s"))
        cls.handler.addFilter(_QuietRepeats())
        cls.previous_level = log.level
        log.addHandler(cls.handler)
        log.setLevel(logging.WARNING)

    @classmethod
    def uninstall(cls) -> None:
        if cls.handler is not None:
            log.removeHandler(cls.handler)
            cls.handler = None
        log.setLevel(cls.previous_level)


def enable_debug() -> None:
    """--debug: log everything dblock does, with times and threads."""
    if _Logging.handler is not None:
        _Logging.handler.setFormatter(
            _EscapingFormatter("%(asctime)s dblock[%(threadName)s] %(levelname)s %(message)s")
        )
    log.setLevel(logging.DEBUG)


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


def run_main(argv: Sequence[str] | None) -> int:
    """Parse and run; map every failure to one stderr line and an exit status."""
    settings = Settings()
    _Logging.install()
    try:
        try:
            result = cli.main(
                args=list(argv) if argv is not None else None,
                prog_name="dblock",
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
        _Logging.uninstall()


__all__ = ["cli", "enable_debug", "run_main"]
