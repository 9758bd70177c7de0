"""``dblock run`` and ``dblock once``: a command under a lock, like flock(1) for a fleet."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Protocol

import click

import dblock
from dblock.tools import check_key

from . import environment, exit_codes
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
from .supervisor import (
    KILL_GRACE,
    MARGIN_SECONDS,
    MARGIN_SHARE,
    Alarm,
    CannotStart,
    Child,
    Interrupted,
    SignalRelay,
    default_kill_grace,
    shortest_ttl,
    status_of,
    stop_margin,
)

log = logging.getLogger("dblock")

#: how often ``run`` checks the child and the lease, seconds
WATCH_INTERVAL = 0.1
DEFAULT_RUN_TTL = 30.0
DEFAULT_ONCE_TTL = 30.0


def say(message: str) -> None:
    click.echo(f"dblock: {printable(message)}", err=True)


def _child_env(keys: tuple[str, ...], lock: dblock.Lock) -> dict[str, str]:
    """CMD's environment: the key and its token (one key), or every key and its token."""
    env = environment.for_cmd()
    env["DBLOCK_OWNER"] = lock.owner
    tokens = getattr(lock, "tokens", None)
    if len(keys) == 1:
        env["DBLOCK_KEY"] = keys[0]
        if lock.token is not None:
            env["DBLOCK_TOKEN"] = str(lock.token)
    elif tokens is not None:
        env["DBLOCK_KEYS"] = json.dumps(list(keys))
        env["DBLOCK_TOKENS"] = json.dumps({k: tokens[k] for k in keys})
    return env


class KeysThenCommand(click.Command):
    """``KEY [KEY...] -- CMD...``: click hands every word after ``--`` to the last argument
    and drops the ``--`` itself, so which words are keys is settled here, before it parses:
    the words after the first ``--`` are CMD. Without ``--``, the first word is the one key
    and the rest CMD (``dblock run KEY CMD``)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            cut = args.index("--")
            ctx.meta["dblock.command"] = tuple(args[cut + 1 :])
            args = args[:cut]
        return super().parse_args(ctx, args)


def split_keys(
    ctx: click.Context, words: tuple[str, ...]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the keys, CMD) of ``dblock run``'s words (see KeysThenCommand); each key checked."""
    command: tuple[str, ...] | None = ctx.meta.get("dblock.command")
    keys, command = (words, command) if command is not None else (words[:1], words[1:])
    if not keys:
        raise click.UsageError("missing KEY: dblock run KEY [KEY...] -- CMD...", ctx=ctx)
    if not command:
        raise click.UsageError("missing CMD: dblock run KEY [KEY...] -- CMD...", ctx=ctx)
    try:
        checked = tuple(check_key(k) for k in keys)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param_hint="'KEY'") from None
    if len(set(checked)) != len(checked):
        raise click.BadParameter(
            "a key is given twice; give each key once", ctx=ctx, param_hint="'KEY'"
        )
    return checked, command


RUN_HELP = f"""Run CMD while holding the lock KEY, renewing its lease.

\b
Example (in the crontab of five hosts; exactly one runs the report):
  dblock run --no-wait --quiet nightly-report -- python report.py

With several keys (dblock run KEY KEY... -- CMD), holds every one of them (lock_many: all or
none, in one step of the store; CMD gets DBLOCK_KEYS and DBLOCK_TOKENS, both JSON, in place
of DBLOCK_KEY and DBLOCK_TOKEN).

Waits for KEY (forever, or --timeout S; --no-wait tries once), then runs CMD as a child with
DBLOCK_KEY, DBLOCK_TOKEN (the fencing token) and DBLOCK_OWNER in its environment, renews the
lease every ttl/3 while CMD runs, and releases KEY when CMD ends. CMD runs in a process group
of its own; SIGINT, SIGTERM and SIGHUP are forwarded to that group. While waiting on a
terminal, a status line shows who holds KEY and for how long.

Nothing CMD started outlives the lock: processes it leaves behind get SIGTERM when it exits,
and SIGKILL --kill-grace seconds later, before KEY is released (on Linux every descendant,
daemons that called setsid included; elsewhere CMD's process group).

\b
If the lease cannot be renewed (database unreachable), CMD and everything it started are dead
before the lease can end, measured from when the last renewal was sent:
  SIGTERM at  ttl - kill_grace - margin,   SIGKILL at  ttl - margin,
  margin = max({MARGIN_SECONDS:g} s, {MARGIN_SHARE:.0%} of ttl), kill_grace = --kill-grace (default
  ttl/6, at most {KILL_GRACE:g} s). A ttl shorter than 2 x (kill_grace + margin) is refused.

\b
--session holds KEY with no lease (ttl=None: docs/session-locks.md): on PostgreSQL the
server's advisory lock, kept by dblock's connection; if that connection is lost (killed,
dropped, the server restarted), CMD is stopped at once: SIGTERM, SIGKILL kill_grace later
(default {KILL_GRACE:g} s). Elsewhere it is a lease renewed as above.

\b
Exit status:
  CMD's status (128+N if CMD died of signal N)
  {exit_codes.CONFLICT} (or --conflict-exit-code) if KEY was not had
  {exit_codes.LEASE_LOST} if the lease could not be renewed in time or was lost while CMD ran
     (`dblock release --force`); CMD was stopped as above
  {exit_codes.NOT_FOUND} / {exit_codes.CANNOT_EXECUTE} if CMD was not found / could not be executed
  {exit_codes.UNAVAILABLE} if the database cannot be reached
"""


def kill_grace_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--kill-grace",
        type=WAIT,
        default=None,
        metavar="S",
        help="Seconds between SIGTERM and SIGKILL when CMD must stop "
        f"(default: ttl/6, at most {KILL_GRACE:g}).",
    )(fn)


def _session_grace(ctx: click.Context, ttl: float, kill_grace: float | None) -> float:
    """--kill-grace for --session: a session hold has no lease to stop CMD ahead of (only its
    loss); the kept-alive lease of a store without sessions has."""
    if math.isinf(ttl):
        return KILL_GRACE if kill_grace is None else kill_grace
    return kill_grace_for(ctx, ttl, kill_grace)


def kill_grace_for(ctx: click.Context, ttl: float, kill_grace: float | None) -> float:
    """--kill-grace, or its default for ``ttl``; refuse a ttl too short for it (exit 2)."""
    grace = default_kill_grace(ttl) if kill_grace is None else kill_grace
    if grace + stop_margin(ttl) > ttl / 2:
        if kill_grace is None:
            change = f"use --ttl {shortest_ttl(None):g} or more"
        else:
            shortest = math.ceil(shortest_ttl(grace) * 100) / 100
            change = f"use --ttl {shortest:g} or more, or a shorter --kill-grace"
        raise click.BadParameter(
            f"{ttl:g} s is too short for a kill grace of {grace:.3g} s: CMD gets SIGTERM "
            f"kill grace + {stop_margin(ttl):g} s before the lease can end, and renewals need "
            f"the first half of the lease; {change}",
            ctx=ctx,
            param_hint="'--ttl'",
        )
    return grace


@click.command(
    "run", cls=KeysThenCommand, help=RUN_HELP, short_help="Run CMD while holding a lock."
)
@common_options
@click.argument("words", metavar="KEY [KEY...] -- CMD...", nargs=-1, type=click.UNPROCESSED)
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
@click.option(
    "--session",
    is_flag=True,
    help="Hold KEY with no lease, as long as dblock's connection (excludes --ttl).",
)
@kill_grace_option
@click.pass_context
def run_command(
    ctx: click.Context,
    *,
    words: tuple[str, ...],
    ttl: float,
    timeout: float | None,
    no_wait: bool,
    conflict_exit_code: int,
    quiet: bool,
    session: bool,
    kill_grace: float | None,
) -> int:
    keys, command = split_keys(ctx, words)
    if no_wait and timeout is not None:
        raise click.UsageError("--timeout and --no-wait exclude each other", ctx=ctx)
    if session and ctx.get_parameter_source("ttl") is click.core.ParameterSource.COMMANDLINE:
        raise click.UsageError("--ttl and --session exclude each other", ctx=ctx)
    # a ttl too short is the user's mistake: refused before connecting
    lease_grace = None if session else kill_grace_for(ctx, ttl, kill_grace)
    client = open_client(ctx, close_on_exit=False)
    lost = Alarm()
    lock = _lock_of(ctx, client, keys, None if session else ttl, lost)
    key = ", ".join(keys)
    grace = lease_grace if lease_grace is not None else _session_grace(ctx, lock.ttl, kill_grace)
    outcome = exit_codes.FAILURE
    try:
        with SignalRelay() as relay:
            try:
                if no_wait:
                    acquired = lock.acquire(blocking=False)
                else:
                    log.debug("waiting for %r (timeout %s)", key, timeout)
                    with HolderStatus(client, keys):
                        acquired = lock.acquire(timeout=timeout)
            except Interrupted as exc:
                return exit_codes.SIGNAL_BASE + exc.signum
            if not acquired:
                if not quiet:
                    say(f"{_busy(client, keys)}; not running {command[0]}")
                return conflict_exit_code
            outcome = _run_holding(relay, lock, keys, lost, command, grace)
            return outcome
    finally:
        # After a lost lease the renewal thread may still be blocked on the unreachable
        # database, and closing would wait for it: leave the client to the process exit.
        if outcome != exit_codes.LEASE_LOST:
            if lock.held:
                with suppress(dblock.DBLockError):
                    lock.release()
            client.close()


def _lock_of(
    ctx: click.Context,
    client: dblock.Client,
    keys: tuple[str, ...],
    ttl: float | None,
    lost: Alarm,
) -> dblock.Lock:
    """The lock of one key, or of every key (lock_many), renewed, telling ``lost``."""
    if len(keys) == 1:
        return client.lock(keys[0], ttl=ttl, auto_renew=True, on_lost=lambda _: lost.set())
    try:
        return client.lock_many(keys, ttl=ttl, auto_renew=True, on_lost=lambda _: lost.set())
    except ValueError as exc:  # more keys than the store takes in one step
        client.close()
        raise click.BadParameter(str(exc), ctx=ctx, param_hint="'KEY'") from None


def _busy(client: dblock.Client, keys: tuple[str, ...]) -> str:
    """``KEY is busy (its holder)`` for the first of ``keys`` held now."""
    for key in keys:
        info = client.info(key)
        if info is not None or len(keys) == 1:
            return f"{key} is busy ({describe_holder(info)})"
    return f"{', '.join(keys)} were busy"


def _run_holding(  # noqa: PLR0917 - what the hold's run needs, each once
    relay: SignalRelay,
    lock: dblock.Lock,
    keys: tuple[str, ...],
    lost: Alarm,
    command: tuple[str, ...],
    grace: float,
) -> int:
    """Run CMD under the held ``lock``; release it after; CMD's status or LEASE_LOST."""
    relay.defer()
    try:
        _full_lease(lock)
    except dblock.LockLost:
        say(f"lost the lease of {lock.key} before {command[0]} could start; not running it")
        return exit_codes.LEASE_LOST
    log.debug("holding %r (token %s); starting %s", lock.key, lock.token, command)
    try:
        child = Child(command, env=_child_env(keys, lock))
    except CannotStart as exc:
        raise CliError(str(exc), exc.exit_code) from None
    relay.attach(child)
    guard = Guard(child, lock, lost, grace, command)
    status = guard.watch()
    if status is None:
        return exit_codes.LEASE_LOST
    try:
        lock.release()
    except dblock.LockLost:
        say(
            f"the lease of {lock.key} was lost before {command[0]} finished: it ran partly "
            "unprotected (database unreachable longer than the ttl, or force-released)"
        )
        return exit_codes.LEASE_LOST
    except dblock.BackendError as exc:
        ends = (
            "with dblock's connection" if math.isinf(lock.ttl) else f"within {duration(lock.ttl)}"
        )
        say(f"could not release {lock.key}; it ends {ends}: {exc}")
    return status


def _full_lease(lock: dblock.Lock) -> None:
    """Renew now if the lease left is short (a lock handed over by its releaser comes with
    what is left of the waiter's queue entry, at most 9 s): CMD would otherwise be stopped
    before its first renewal, the lease's end being nearer than the kill grace."""
    end = lock.lease_end
    if end is not None and end - time.monotonic() < lock.ttl * 2 / 3:
        lock.renew()


def _after(moment: float) -> str:
    """``in 1.2s`` for a ``time.monotonic()`` moment (``now`` if it has passed)."""
    left = moment - time.monotonic()
    return f"in {duration(left)}" if left > 0 else "now"


def _report_survivors(survivors: list[int], key: str) -> None:
    if survivors:
        names = ", ".join(f"group {-pid}" if pid < 0 else str(pid) for pid in survivors)
        say(
            f"could not kill {names} (stuck in the kernel, or run as another user): they may "
            f"keep running after {key} is released or its lease ends"
        )


class Leased(Protocol):
    """What Guard watches: a lock, or an election's term."""

    @property
    def key(self) -> str: ...
    @property
    def ttl(self) -> float: ...
    @property
    def lease_end(self) -> float | None: ...


@dataclass
class Guard:
    """Keeps CMD, and everything it started, inside the lease (see RUN_HELP for the rule)."""

    child: Child
    lock: Leased
    lost: Alarm
    grace: float
    command: tuple[str, ...]

    def __post_init__(self) -> None:
        # a session hold has no lease end to stop CMD ahead of: only its loss stops CMD
        self.session = math.isinf(self.lock.ttl)
        self.margin = 0.0 if self.session else stop_margin(self.lock.ttl)
        #: the latest known moment from which the lease may have ended (time.monotonic())
        self.end = self.lock.lease_end or time.monotonic()

    def _current_end(self) -> float | None:
        """The lease's end as the lock knows it now; None once it is known to be lost."""
        end = self.lock.lease_end
        if end is None or self.lost.is_set():
            return None
        self.end = end
        return end

    def _may_run(self) -> bool:
        end = self._current_end()
        return end is not None and time.monotonic() < end - self.grace - self.margin

    def watch(self) -> int | None:
        """Wait for CMD; its exit status once it and all it started are gone, or None when
        it had to be stopped because the lease was lost or could not be renewed in time."""
        self.child.ring_on_exit(self.lost)
        try:
            while True:
                returncode = self.child.poll()
                if returncode is not None:
                    self._finish()
                    return status_of(returncode)
                end = self._current_end()
                if end is None:
                    self._stop_lost()
                    return None
                stop_at = end - self.grace - self.margin
                now = time.monotonic()
                if now >= stop_at:
                    self._stop_unrenewed()
                    return None
                self.child.follow_job_control(self._may_run)
                self.child.reap_orphans()
                self.lost.wait(min(WATCH_INTERVAL, stop_at - now))
        except BaseException:
            self.child.stop(time.monotonic())  # dblock is failing: take everything down now
            raise

    def _finish(self) -> None:
        """CMD has exited: stop what it left running, before the lock is released."""
        if not self.child.remaining():
            return
        self._current_end()
        kill_at = min(time.monotonic() + self.grace, self.end - self.margin)
        say(
            f"{self.command[0]} exited leaving processes behind; stopping them before "
            f"releasing {self.lock.key}: SIGTERM now, SIGKILL {_after(kill_at)}"
        )
        _report_survivors(self.child.stop(kill_at), self.lock.key)

    def _stop_lost(self) -> None:
        kill_at = min(time.monotonic() + self.grace, self.end - self.margin)
        what = (
            "the session hold (its connection ended)"
            if self.session
            else f"the lease (ttl {duration(self.lock.ttl)})"
        )
        say(
            f"lost {what} of {self.lock.key}: another owner "
            f"may take it now; stopping {self.command[0]} (pid {self.child.pid}) and all it "
            f"started: SIGTERM now, SIGKILL {_after(kill_at)}"
        )
        _report_survivors(self.child.stop(kill_at), self.lock.key)

    def _stop_unrenewed(self) -> None:
        kill_at = self.end - self.margin
        say(
            f"lost the lease of {self.lock.key}: it could not be renewed (database unreachable?) "
            f"and may end {_after(self.end)}; stopping {self.command[0]} (pid {self.child.pid}) "
            f"and all it started: SIGTERM now, SIGKILL {_after(kill_at)}"
        )
        _report_survivors(self.child.stop(kill_at), self.lock.key)


class _CommandFailed(Exception):
    """Raised inside once() so that it records "failed"."""

    def __init__(self, status: int) -> None:
        super().__init__(f"command exited with status {status}")
        self.status = status


def _check(status: int | None) -> None:
    """Inside once(): raise so that a failed or stopped CMD is recorded as "failed"."""
    if status is None:
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
are forwarded to CMD, which gets DBLOCK_KEY and DBLOCK_TOKEN in its environment. CMD and what it
starts are kept inside the lease as by `dblock run` (see `dblock run --help`, --kill-grace).

\b
--session holds KEY with no lease (ttl=None: docs/session-locks.md): on PostgreSQL the
server's advisory lock, kept by dblock's connection; if that connection is lost (killed,
dropped, the server restarted), CMD is stopped at once: SIGTERM, SIGKILL kill_grace later
(default {KILL_GRACE:g} s). Elsewhere it is a lease renewed as above.

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
@kill_grace_option
@click.pass_context
def once_command(
    ctx: click.Context,
    *,
    key: str,
    command: tuple[str, ...],
    ttl: float,
    note: str | None,
    quiet: bool,
    kill_grace: float | None,
) -> int:
    grace = kill_grace_for(ctx, ttl, kill_grace)
    client = open_client(ctx)
    with SignalRelay() as relay:
        try:
            with client.once(key, ttl=ttl, note=note) as hold:
                relay.defer()
                _full_lease(hold)
                child = Child(command, env=_child_env((key,), hold))
                relay.attach(child)
                _check(Guard(child, hold, Alarm(), grace, command).watch())
        except dblock.AlreadyDone:
            if not quiet:
                say(f"{key} has already succeeded; not running {command[0]} again")
            return exit_codes.OK
        except dblock.InProgress:
            if not quiet:
                holder = describe_holder(client.info(key))
                say(f"{key} is being processed ({holder}); not running {command[0]}")
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
