"""``dblock dashboard``: serve the live page of current holds (dblock.dashboard)."""

from __future__ import annotations

import contextlib
import re

import click

import dblock

from . import exit_codes
from .context import common_options, misconfigured, open_client

DEFAULT_PORT = 8765
#: a DNS name or an IPv4 address (an IPv6 one is its own address or loopback)
_HOST_NAME = re.compile(
    r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*\.?"
)


def _host_names(
    ctx: click.Context, param: click.Parameter, value: tuple[str, ...]
) -> tuple[str, ...]:
    """``--allowed-host`` values: host names as a ``Host`` header carries them, no port."""
    for name in value:
        if not _HOST_NAME.fullmatch(name):
            raise click.BadParameter(
                f"{name!r} is not a host name (give it as in http://NAME:PORT/, without the "
                "scheme or port)",
                ctx=ctx,
                param=param,
            )
    return tuple(name.lower().rstrip(".") for name in value)


@click.command(
    "dashboard",
    short_help="Serve a live web page of the current holds.",
    help="""Serve a live web page of every current hold (key, kind, owner, token, held for,
lease left), the once-records seen, a chart of holds per key prefix, and /metrics in the
Prometheus text format. Read-only unless --allow-force-release, which adds a button per hold
that needs the one-time secret printed at start-up. Listens on loopback unless --host says
otherwise. Answers only requests addressed to its own address, localhost or an --allowed-host
name (a page elsewhere could otherwise read it through DNS rebinding). Needs the dashboard
extra: pip install 'dblock[dashboard]'.

\b
Example:
  dblock dashboard --url postgresql://app@db/app --port 8765
  dblock dashboard --host 0.0.0.0 --allowed-host locks.example.com""",
)
@common_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT, show_default=True)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    metavar="NAME",
    multiple=True,
    callback=_host_names,
    help="A name the page may be opened by (http://NAME:PORT/), besides its address and "
    "localhost; repeatable.",
)
@click.option(
    "--allow-force-release",
    is_flag=True,
    help="Add a force-release button per hold (needs the secret printed at start-up).",
)
@click.pass_context
def dashboard_command(
    ctx: click.Context,
    host: str,
    port: int,
    allowed_hosts: tuple[str, ...],
    allow_force_release: bool,
) -> int:
    try:
        from dblock import dashboard
    except dblock.ConfigurationError as exc:  # its libraries are missing: it names the extra
        raise misconfigured(exc) from None
    client = open_client(ctx)
    settings = dashboard.Settings(
        allow_force_release=allow_force_release, host=host, allowed_hosts=allowed_hosts
    )
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"dblock dashboard: http://{shown}:{port}/  ({client.url}, table {client.table})")
    if dashboard.is_loopback(host):
        click.echo("listening on loopback only: use --host 0.0.0.0 to let other hosts see it")
    else:
        click.echo(
            f"listening on {host}: anyone who can reach it sees every key and owner", err=True
        )
        if not allowed_hosts:
            click.echo(
                "it answers requests addressed to its address or localhost; to open it by a "
                "host name, add --allowed-host NAME",
                err=True,
            )
    if allow_force_release:
        click.echo(
            "force-release is enabled; it needs this one-time secret (or open the page as "
            f"http://{shown}:{port}/?secret={settings.secret}):\n    {settings.secret}"
        )
    else:
        click.echo("read-only (--allow-force-release adds a force-release button)")
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how it is meant to stop
        dashboard.serve(client, host, port, settings)
    return exit_codes.OK


__all__ = ["dashboard_command"]
