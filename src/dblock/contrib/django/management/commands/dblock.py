"""``manage.py dblock list|info|release|purge``: the ``dblock`` commands of the same names, on
the database and table of ``settings.DBLOCK`` (no ``--url`` to repeat, no password on the
command line). Output and exit statuses are the CLI's (docs/cli.md)."""

from __future__ import annotations

import argparse
import copy
import os
import sys
from typing import Any

import click
from django.core.management.base import BaseCommand, CommandError, CommandParser

from dblock.cli.app import run_main
from dblock.cli.cmd_admin import info_command, list_command, purge_command, release_command
from dblock.cli.context import Settings
from dblock.cli.exit_codes import USAGE
from dblock.contrib.django.config import ImproperlyConfigured, target


def _on_settings(command: click.Command) -> click.Command:
    """``command`` with ``--url`` hidden from its help: the database is settings.DBLOCK's."""
    params = [copy.copy(p) for p in command.params]
    for param in params:
        if param.name == "url" and isinstance(param, click.Option):
            param.hidden = True
    shown = copy.copy(command)
    shown.params = params
    return shown


GROUP = click.Group(
    "dblock",
    commands=[
        _on_settings(c) for c in (list_command, info_command, release_command, purge_command)
    ],
    help="Inspect and maintain the locks of settings.DBLOCK's database (docs/cli.md).",
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)


class Command(BaseCommand):
    help = (
        "dblock's list, info, release and purge on the database settings.DBLOCK names; "
        "`manage.py dblock COMMAND --help` for each."
    )
    # the command checks what it needs itself; a project's unrelated check errors must not
    # keep an operator from freeing a lock
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "args",
            nargs=argparse.REMAINDER,
            metavar="{list,info,release,purge} ...",
            help="the dblock command and its options, e.g. `list --json`, `release KEY --force`",
        )

    def handle(self, *args: str, **options: Any) -> None:
        try:
            where = target()
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc), returncode=USAGE) from None
        called = getattr(self, "_called_from_command_line", False)
        prog = f"{os.path.basename(sys.argv[0])} dblock" if called else "dblock"
        status = run_main(
            list(args),
            settings=Settings(url=where.url, table=where.table),
            group=GROUP,
            prog_name=prog,
        )
        if status and called:
            sys.exit(status)  # the message is out already; keep the CLI's status
        if status:
            raise CommandError(f"dblock {' '.join(args[:1])} exited {status}", returncode=status)
