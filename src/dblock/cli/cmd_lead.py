"""``dblock lead`` (run a command while leading an election) and ``dblock leader`` (who leads)."""

from __future__ import annotations

import json
import logging
from contextlib import suppress
from typing import Any

import click

import dblock
from dblock.tools import Term, check_leader_value

from . import environment, exit_codes
from .cmd_run import Guard, kill_grace_for, kill_grace_option, say
from .context import LEASE, CliError, common_options, open_client, open_reader, validate_key
from .output import duration, iso, now_utc, printable
from .status_line import HolderStatus
from .stop_signals import StopSignals
from .supervisor import Alarm, CannotStart, Child, Interrupted, SignalRelay

log = logging.getLogger("dblock")

DEFAULT_LEAD_TTL = 15.0

LEAD_HELP = """Run CMD while this process leads election NAME; campaign again if leadership is lost.

\b
Example (one scheduler for the fleet; the other hosts stand by and take over):
  dblock lead scheduler --value "$(hostname):8080" -- python scheduler.py

Campaigns for NAME (candidates lead in the order they started), then runs CMD with
DBLOCK_ELECTION, DBLOCK_TOKEN (the term's fencing token: pass it with the leader's writes) and
DBLOCK_LEADER_VALUE in its environment. The term's lease (--ttl) is renewed while CMD runs. If
leadership is lost, or cannot be renewed in time (store unreachable), CMD and everything it
started are stopped before the lease could end (SIGTERM, then SIGKILL --kill-grace later), and
dblock campaigns again. When CMD exits on its own, dblock resigns, so the next candidate leads
at once, and exits with CMD's status. SIGINT, SIGTERM and SIGHUP are forwarded to CMD; while
campaigning they end dblock. A leader killed outright is replaced within --ttl.

\b
Exit status:
  CMD's status (128+N if CMD died of signal N)
  128+N if dblock was ended by signal N while campaigning
  69 if the store cannot be reached
"""


def _check_value(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    try:
        return check_leader_value(value)
    except (TypeError, ValueError) as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


def _child_env(term: Term) -> dict[str, str]:
    """CMD's environment: the election, the term's token and the leader's value."""
    env = environment.for_cmd()
    env["DBLOCK_ELECTION"] = term.name
    env["DBLOCK_TOKEN"] = str(term.token)
    env["DBLOCK_LEADER_VALUE"] = term.value or ""
    return env


@click.command("lead", help=LEAD_HELP, short_help="Run CMD while leading an election.")
@common_options
@click.argument("name", callback=validate_key)
@click.argument("command", metavar="-- CMD...", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option(
    "--value",
    default=None,
    metavar="V",
    callback=_check_value,
    help="What the leader proclaims, e.g. its address (at most 1,024 characters).",
)
@click.option(
    "--ttl",
    type=LEASE,
    metavar="S",
    default=DEFAULT_LEAD_TTL,
    show_default=True,
    help="The term's lease in seconds: a dead leader is replaced within it.",
)
@kill_grace_option
@click.pass_context
def lead_command(
    ctx: click.Context,
    *,
    name: str,
    command: tuple[str, ...],
    value: str | None,
    ttl: float,
    kill_grace: float | None,
) -> int:
    grace = kill_grace_for(ctx, ttl, kill_grace)
    client = open_client(ctx, close_on_exit=False)
    lost = Alarm()
    election = client.election(name, ttl=ttl, on_lost=lambda _term: lost.set())
    stuck = False
    try:
        with SignalRelay() as relay:
            while True:
                try:
                    log.debug("campaigning for %r", name)
                    with HolderStatus(client, name):
                        term = election.campaign(value=value)
                except Interrupted as exc:
                    return exit_codes.SIGNAL_BASE + exc.signum
                status = _lead(relay, term, lost, command, grace)
                if status is not None:
                    return status
                stuck = True  # a renewal may still hang on the unreachable store
                # quietly: CMD was stopped for the loss, or for want of a renewal, which the
                # resign may only now find lost (LockLost): either way, campaign again
                with suppress(dblock.LockLost):
                    term.resign()
                lost.clear()
                try:
                    relay.rearm()
                except Interrupted as exc:  # it came for CMD's term: end, do not campaign
                    return exit_codes.SIGNAL_BASE + exc.signum
                say(f"campaigning for {printable(name)} again")
    finally:
        if not stuck:
            client.close()


def _lead(
    relay: SignalRelay,
    term: Term,
    lost: Alarm,
    command: tuple[str, ...],
    grace: float,
) -> int | None:
    """Run CMD for one term: its status when it ended on its own (the term resigned), or
    None when it was stopped because the term was lost."""
    relay.defer()
    log.debug("leading %r (token %s); starting %s", term.name, term.token, command)
    try:
        child = Child(command, env=_child_env(term))
    except CannotStart as exc:
        term.resign()
        raise CliError(str(exc), exc.exit_code) from None
    relay.attach(child)
    status = Guard(child, term, lost, grace, command).watch()
    child.close()
    if status is None:
        return None
    try:
        term.resign()
    except dblock.LockLost:
        say(
            f"the term of {printable(term.name)} was lost before {command[0]} finished: it ran "
            "partly unprotected (store unreachable longer than the ttl, or force-released)"
        )
        return exit_codes.LEASE_LOST
    except dblock.BackendError as exc:
        say(f"could not resign {printable(term.name)}; it ends within {duration(term.ttl)}: {exc}")
    return status


@click.command(
    "leader",
    short_help="Show who leads an election.",
    help="""Show the leader of election NAME: its value, its term's token, since when.
Exits 1 (printing nothing on stdout) if nobody leads. With --watch, print the leader now and
then every change (a new term, a new value, nobody), until interrupted.

\b
Example:
  dblock leader scheduler --json""",
)
@common_options
@click.argument("name", callback=validate_key)
@click.option("--watch", is_flag=True, help="Follow every change of leader.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line (null: nobody).")
@click.pass_context
def leader_command(ctx: click.Context, name: str, watch: bool, as_json: bool) -> int:
    if not watch:
        client = open_reader(ctx)
        leader = None if client is None else client.election(name).leader()
        if leader is None:
            click.echo(f"dblock: nobody leads {printable(name)}", err=True)
            return exit_codes.FAILURE
        click.echo(_line(name, leader, as_json))
        return exit_codes.OK
    election = open_client(ctx).election(name)
    changes = election.watch()
    try:
        # signals only end the loop (see stop_signals: a raise could land anywhere)
        with StopSignals(wake=changes.event.set) as stop:
            last: object = _NOT_YET  # differs from any reading: the first is shown
            while True:
                leader = election.next_change(last, changes, stop.stopped)
                if stop.stopped():
                    break
                click.echo(_line(name, leader, as_json))
                last = leader
    finally:
        changes.close()
    return exit_codes.OK


_NOT_YET = object()


def _line(name: str, leader: dblock.LeaderInfo | None, as_json: bool) -> str:
    if as_json:
        found: dict[str, Any] | None = None
        if leader is not None:
            found = {
                "name": leader.name,
                "value": leader.value,
                "token": leader.token,
                "since": iso(leader.since),
            }
        return json.dumps(found)
    if leader is None:
        return f"{printable(name)}: nobody leads"
    age = duration((now_utc() - leader.since).total_seconds())
    value = "(no value)" if leader.value is None else printable(leader.value)
    return f"{printable(name)}: {value}  token {leader.token}  since {iso(leader.since)} ({age})"


__all__ = ["lead_command", "leader_command"]
