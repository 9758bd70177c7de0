"""``dblock run`` and ``dblock once``: a command under a lock, like flock(1) for a fleet."""

from __future__ import annotations

import logging
import os
import threading
from contextlib import suppress

import click

import dblock

from . import exit_codes
from .context import (
    LEASE,
    WAIT,
    CliError,
    common_options,
    open_client,
    validate_key,
    validate_note,
)
from .output import describe_holder, duration, printable
from .status_line import HolderStatus
from .supervisor import KILL_GRACE, CannotStart, Child, Interrupted, SignalRelay, status_of

log = logging.getLogger("dblock")

#: how often ``run`` checks the child and the lease, seconds
WATCH_INTERVAL = 0.1
DEFAULT_RUN_TTL = 30.0
DEFAULT_ONCE_TTL = 30.0


def _say(message: str) -> None:
    click.echo(f"dblock: {printable(message)}", err=True)


def _child_env(key: str, lock: dblock.Lock) -> dict[str, str]:
    env = dict(os.environ)
    env["DBLOCK_KEY"] = key
    env["DBLOCK_OWNER"] = lock.owner
    if lock.token is not None:
        env["DBLOCK_TOKEN"] = str(lock.token)
    return env


RUN_HELP = f"""Run CMD while holding the lock KEY, renewing its lease.

\b
Example (in the crontab of five hosts; exactly one runs the report):
  dblock run --no-wait --quiet nightly-report -- python report.py

Waits for KEY (forever, or --timeout S; --no-wait tries once), then runs CMD as a child with
DBLOCK_KEY, DBLOCK_TOKEN (the fencing token) and DBLOCK_OWNER in its environment, renews the
lease every ttl/3 while CMD runs, and releases KEY when CMD ends. SIGINT, SIGTERM and SIGHUP are
forwarded to CMD. While waiting on a terminal, a status line shows who holds KEY and for how
long.

\b
Exit status:
  CMD's status (128+N if CMD died of signal N)
  {exit_codes.CONFLICT} (or --conflict-exit-code) if KEY was not had
  {exit_codes.LEASE_LOST} if the lease was lost while CMD ran (database unreachable longer than
     the ttl, or `dblock release --force`): CMD then gets SIGTERM, and SIGKILL
     {KILL_GRACE:g} s later if it is still running
  {exit_codes.NOT_FOUND} / {exit_codes.CANNOT_EXECUTE} if CMD was not found / could not be executed
  {exit_codes.UNAVAILABLE} if the database cannot be reached
"""


@click.command("run", help=RUN_HELP, short_help="Run CMD while holding a lock.")
@common_options
@click.argument("key", callback=validate_key)
@click.argument("command", metavar="-- CMD...", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option(
    "--ttl",
    type=LEASE,
    metavar="S",
    default=DEFAULT_RUN_TTL,
    show_default=True,
    help="Lease in seconds; if dblock cannot renew it for this long, CMD is stopped.",
)
@click.option(
    "--timeout",
    type=WAIT,
    default=None,
    metavar="S",
    help="Wait at most S seconds for KEY (default: wait forever).",
)
@click.option("--no-wait", is_flag=True, help="Try once; do not wait for KEY.")
@click.option(
    "--conflict-exit-code",
    type=click.IntRange(0, 255),
    default=exit_codes.CONFLICT,
    show_default=True,
    metavar="N",
    help="Exit status when KEY was not had.",
)
@click.option("-q", "--quiet", is_flag=True, help="No message when KEY was not had.")
@click.pass_context
def run_command(
    ctx: click.Context,
    *,
    key: str,
    command: tuple[str, ...],
    ttl: float,
    timeout: float | None,
    no_wait: bool,
    conflict_exit_code: int,
    quiet: bool,
) -> int:
    if no_wait and timeout is not None:
        raise click.UsageError("--timeout and --no-wait exclude each other", ctx=ctx)
    client = open_client(ctx, close_on_exit=False)
    lost = threading.Event()
    lock = client.lock(key, ttl=ttl, auto_renew=True, on_lost=lambda _lock: lost.set())
    outcome = exit_codes.FAILURE
    try:
        with SignalRelay() as relay:
            try:
                if no_wait:
                    acquired = lock.acquire(blocking=False)
                else:
                    log.debug("waiting for %r (timeout %s)", key, timeout)
                    with HolderStatus(client, key):
                        acquired = lock.acquire(timeout=timeout)
            except Interrupted as exc:
                return exit_codes.SIGNAL_BASE + exc.signum
            if not acquired:
                if not quiet:
                    holder = describe_holder(client.info(key))
                    _say(f"{key} is busy ({holder}); not running {command[0]}")
                return conflict_exit_code
            outcome = _run_holding(relay, lock, lost, command)
            return outcome
    finally:
        # After a lost lease the renewal thread may still be blocked on the unreachable
        # database, and closing would wait for it: leave the client to the process exit.
        if outcome != exit_codes.LEASE_LOST:
            if lock.held:
                with suppress(dblock.DBLockError):
                    lock.release()
            client.close()


def _run_holding(
    relay: SignalRelay, lock: dblock.Lock, lost: threading.Event, command: tuple[str, ...]
) -> int:
    """Run CMD under the held ``lock``; release it after; CMD's status or LEASE_LOST."""
    relay.defer()
    log.debug("holding %r (token %s); starting %s", lock.key, lock.token, command)
    try:
        child = Child(command, env=_child_env(lock.key, lock))
    except CannotStart as exc:
        raise CliError(str(exc), exc.exit_code) from None
    relay.attach(child)
    status = _watch(child, lock, lost)
    if status is None:
        _stop_after_loss(child, lock, command)
        return exit_codes.LEASE_LOST
    try:
        lock.release()
    except dblock.LockLost:
        _say(
            f"the lease of {lock.key} was lost before {command[0]} finished: it ran partly "
            "unprotected (database unreachable longer than the ttl, or force-released)"
        )
        return exit_codes.LEASE_LOST
    except dblock.BackendError as exc:
        _say(f"could not release {lock.key}; it expires within {duration(lock.ttl)}: {exc}")
    return status


def _stop_after_loss(child: Child, lock: dblock.Lock, command: tuple[str, ...]) -> None:
    _say(
        f"lost the lease of {lock.key} (ttl {duration(lock.ttl)}): another owner may take it "
        f"now; stopping {command[0]} (pid {child.pid}) with SIGTERM, SIGKILL after "
        f"{KILL_GRACE:g} s"
    )
    child.terminate()


def _watch(child: Child, lock: dblock.Lock, lost: threading.Event) -> int | None:
    """Wait for CMD; its exit status, or None as soon as the lease is known to be lost.

    ``lock.held`` turns False when the lease's local deadline passes even while the renewal
    thread is still blocked on an unreachable database, so CMD never outlives the lease by
    more than WATCH_INTERVAL plus the kill grace.
    """
    while True:
        returncode = child.poll()
        if returncode is not None:
            return status_of(returncode)
        if lost.wait(WATCH_INTERVAL) or not lock.held:
            return None


class _CommandFailed(Exception):
    """Raised inside once() so that it records "failed"."""

    def __init__(self, status: int) -> None:
        super().__init__(f"command exited with status {status}")
        self.status = status


def _check(status: int | None, child: Child, hold: dblock.Lock, command: tuple[str, ...]) -> None:
    """Inside once(): raise so that a failed or stopped CMD is recorded as "failed"."""
    if status is None:
        _stop_after_loss(child, hold, command)
        raise _LeaseLost
    if status != exit_codes.OK:
        raise _CommandFailed(status)


class _LeaseLost(Exception):
    """Raised inside once() when CMD was stopped because the lease was lost."""


ONCE_HELP = f"""Run CMD at most once successfully for KEY.

\b
Example (a payout that must never run twice; safe to retry after a failure):
  dblock once payout:2024-06-01 -- python payout.py 2024-06-01

Claims KEY when it has no record, when its record is "failed", or when a "processing" record's
lease has expired (its holder crashed); runs CMD while renewing the lease; records "succeeded"
if CMD exits 0, else "failed" (a later `dblock once` may retry it). SIGINT, SIGTERM and SIGHUP
are forwarded to CMD, which gets DBLOCK_KEY and DBLOCK_TOKEN in its environment.

\b
Exit status:
  CMD's status (128+N if CMD died of signal N)
  0 with a message if KEY has already succeeded (CMD is not run)
  {exit_codes.CONFLICT} if KEY is being processed right now
  {exit_codes.LEASE_LOST} if the lease was lost while CMD ran: CMD is stopped as by `dblock run`
  {exit_codes.UNAVAILABLE} if the database cannot be reached
"""


@click.command("once", help=ONCE_HELP, short_help="Run CMD at most once successfully.")
@common_options
@click.argument("key", callback=validate_key)
@click.argument("command", metavar="-- CMD...", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option(
    "--ttl",
    type=LEASE,
    metavar="S",
    default=DEFAULT_ONCE_TTL,
    show_default=True,
    help="Lease of the processing record in seconds, renewed while CMD runs: how long a "
    "crashed holder blocks a retry.",
)
@click.option("--note", default=None, callback=validate_note, help="A note stored with the record.")
@click.option("-q", "--quiet", is_flag=True, help="No message when CMD is not run.")
@click.pass_context
def once_command(
    ctx: click.Context,
    *,
    key: str,
    command: tuple[str, ...],
    ttl: float,
    note: str | None,
    quiet: bool,
) -> int:
    client = open_client(ctx)
    with SignalRelay() as relay:
        try:
            with client.once(key, ttl=ttl, note=note) as hold:
                relay.defer()
                child = Child(command, env=_child_env(key, hold))
                relay.attach(child)
                _check(_watch(child, hold, threading.Event()), child, hold, command)
        except dblock.AlreadyDone:
            if not quiet:
                _say(f"{key} has already succeeded; not running {command[0]} again")
            return exit_codes.OK
        except dblock.InProgress:
            if not quiet:
                holder = describe_holder(client.info(key))
                _say(f"{key} is being processed ({holder}); not running {command[0]}")
            return exit_codes.CONFLICT
        except _CommandFailed as exc:
            return exc.status
        except (_LeaseLost, dblock.LockLost):
            return exit_codes.LEASE_LOST
        except CannotStart as exc:
            raise CliError(str(exc), exc.exit_code) from None
        except Interrupted as exc:
            return exit_codes.SIGNAL_BASE + exc.signum
    return exit_codes.OK


__all__ = ["once_command", "run_command"]
