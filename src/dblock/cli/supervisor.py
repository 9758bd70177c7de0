"""Running CMD as a child: signal forwarding, exit statuses, stopping it and all it started.

Process groups: CMD always runs in a process group of its own, and every signal dblock sends
(forwarded ones, and the stop on lease loss or at the end) goes to that whole group, so a
shell pipeline such as ``sh -c 'a | b'`` is reached too. When dblock runs in the foreground of
a terminal, CMD's group is made the terminal's foreground group while it runs (as a shell does
for a job): Ctrl-C and Ctrl-Z reach CMD's group straight from the terminal, and dblock takes
the terminal back when CMD ends. Otherwise (cron, systemd, scripts) CMD also gets a session of
its own, detached from any terminal.

Descendants: on Linux dblock is a child subreaper (``PR_SET_CHILD_SUBREAPER``), so a process
CMD started whose parent exited is re-parented to dblock instead of init, and dblock finds
every descendant, in CMD's group or not (``setsid`` included), in ``/proc``: all of them are
signalled and reaped before the lock is released or the lease can end. Elsewhere only CMD's
process group is reached. Nothing CMD started outlives ``run``, unlike ``flock(1)``, whose lock
lives as long as any process holds its descriptor.

If dblock itself dies without a chance to stop CMD (SIGKILL, the OOM killer), its lease is
no longer renewed and another host may take the lock once it runs out: so on Linux the kernel
SIGKILLs CMD the moment dblock dies (``PR_SET_PDEATHSIG``). CMD's own children are not reached
by that.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from types import FrameType, TracebackType
from typing import Final

from . import exit_codes

#: the signals dblock passes on to CMD
FORWARDED: Final = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: the longest default --kill-grace, seconds (the default is ttl/6 up to this)
KILL_GRACE: Final = 5.0
#: CMD is stopped this much before the earliest moment its lease can end: the larger of these
#: seconds (dblock's own reaction time on a busy host) and this share of the ttl (clock-rate
#: differences between hosts, which NTP keeps far below 1 %)
MARGIN_SECONDS: Final = 0.25
MARGIN_SHARE: Final = 0.01
#: how often the stop checks whether CMD and what it started are gone, seconds
_REAP_INTERVAL: Final = 0.01
#: how long SIGKILLed processes may take to go (one stuck in the kernel, or that dblock may
#: not signal, such as a command run as another user) before dblock reports them, seconds
KILL_WAIT: Final = 5.0
#: how often a signal that interrupted the wait is delivered again until the wait has ended,
#: seconds (a swallowed one ends the wait this much later; see SignalRelay)
REDELIVER_INTERVAL = 1.0
#: what a redelivery is sent as: a signal nobody sends dblock (so a second Ctrl-C is a handler
#: call of its own, never merged with a redelivery on its way) whose default action is to do
#: nothing (so one that lands after the relay restored the handlers is lost, harmlessly)
REDELIVERY: Final = signal.SIGURG


def stop_margin(ttl: float) -> float:
    """How long before the earliest possible end of a ``ttl`` lease everything CMD started
    must have been SIGKILLed."""
    return max(MARGIN_SECONDS, ttl * MARGIN_SHARE)


def default_kill_grace(ttl: float) -> float:
    """--kill-grace when not given: a sixth of the ttl, at most KILL_GRACE."""
    return min(KILL_GRACE, ttl / 6)


def shortest_ttl(kill_grace: float | None) -> float:
    """The shortest ttl that leaves renewals the first half of each lease before a stop
    begins (``kill_grace + stop_margin(ttl) <= ttl / 2``); None: the default kill grace."""
    if kill_grace is None:  # ttl/6 + MARGIN_SECONDS <= ttl/2
        return 3 * MARGIN_SECONDS
    return max(2 * (kill_grace + MARGIN_SECONDS), 2 * kill_grace / (1 - 2 * MARGIN_SHARE))


class Interrupted(BaseException):
    """Raised in the main thread when a forwarded signal arrives before CMD has started.

    A BaseException, like KeyboardInterrupt, so that no ``except Exception`` swallows it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def interrupted_by(exc: BaseException) -> Interrupted | None:
    """The :class:`Interrupted` that ``exc`` is, or was raised while handling, if any.

    The handler raises wherever the main thread happens to be, within a library's ``with
    lock:`` too: just after a condition's wait let go of the lock, the ``with`` then fails to
    release it (``RuntimeError``), and that error, or one a driver made of it, is what comes
    up, with the signal behind it. Still the signal's doing, and reported as such.
    """
    seen: set[int] = set()
    found: BaseException | None = exc
    while found is not None and id(found) not in seen:
        if isinstance(found, Interrupted):
            return found
        seen.add(id(found))
        found = found.__cause__ if found.__cause__ is not None else found.__context__
    return None


class CannotStart(Exception):
    """CMD could not be started; ``exit_code`` is 127 (not found) or 126 (not executable)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _foreground_terminal() -> int | None:
    """The fd (0, 1 or 2) of a terminal whose foreground group is dblock's, or None."""
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp():
                return fd
        except OSError:
            continue
    return None


@contextmanager
def _no_sigttou() -> Iterator[None]:
    """tcsetpgrp from a background group, or a write to the terminal there under ``stty
    tostop``, would stop the caller with SIGTTOU: block it meanwhile (main thread only)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTTOU})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


_PR_SET_PDEATHSIG: Final = 1
_PR_SET_CHILD_SUBREAPER: Final = 36
_PR_GET_CHILD_SUBREAPER: Final = 37


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # only here: `dblock run` on Linux

    try:
        fn: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return fn


def _become_subreaper() -> bool | None:
    """Linux: orphaned descendants are re-parented to this process, not to init. None where
    that is not available, else whether this process was a subreaper before."""
    prctl = _prctl()
    if prctl is None:
        return None
    import ctypes

    before = ctypes.c_int(0)
    if prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(before), 0, 0, 0) != 0:
        return None
    if prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        return None
    return bool(before.value)


def _stop_being_subreaper() -> None:
    """Undo _become_subreaper: a process that goes on after ``run`` (a test, an embedding
    program) would otherwise inherit every orphan of the system's later commands as zombies."""
    prctl = _prctl()
    if prctl is not None:
        prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def _child_setup(terminal: int | None) -> Callable[[], None]:
    """What the forked child does before exec: its own process group (and, without a
    terminal, session); the terminal's foreground if dblock had it; on Linux, SIGKILL when
    dblock dies. No locks, no allocation beyond the calls themselves."""
    prctl = _prctl()
    parent = os.getpid()

    def setup() -> None:
        if terminal is None:
            os.setsid()
        else:
            os.setpgid(0, 0)
            # before exec, so that CMD never reads the terminal from a background group
            old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTTOU})
            with suppress(OSError):  # the terminal hung up: CMD runs without it
                os.tcsetpgrp(terminal, os.getpgrp())
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:  # dblock died before the request took effect
                os.kill(os.getpid(), signal.SIGKILL)

    return setup


def descendants(root: int, skip: Collection[int] = ()) -> dict[int, bool]:
    """Linux: every descendant of ``root`` found in /proc, mapped to whether it is still
    running (False: a zombie), leaving out the processes in ``skip`` and theirs. Empty where
    there is no /proc."""
    if root == os.getpid() and not _has_children():
        return {}  # nothing to read /proc for: no child, so no descendant
    parents: dict[int, list[tuple[int, bool]]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return {}
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                data = stat.read()
        except OSError:
            continue  # gone meanwhile
        fields = data[data.rindex(b")") + 2 :].split()
        parents.setdefault(int(fields[1]), []).append((int(name), fields[0] != b"Z"))
    found: dict[int, bool] = {}
    todo = [root]
    while todo:
        for pid, running in parents.get(todo.pop(), ()):
            if pid not in found and pid not in skip:
                found[pid] = running
                todo.append(pid)
    return found


class Alarm:
    """What the watch over CMD sleeps on between its looks: set (as an Event: it stays set)
    when the lease is lost, rung when something else needs a look now (CMD has exited)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._set = False
        self._rung = False

    def set(self) -> None:
        with self._cond:
            self._set = True
            self._cond.notify_all()

    def clear(self) -> None:
        with self._cond:
            self._set = False

    def is_set(self) -> bool:
        return self._set

    def ring(self) -> None:
        with self._cond:
            self._rung = True
            self._cond.notify_all()

    def wait(self, timeout: float) -> bool:
        """Until set, or rung since the last wait, or ``timeout`` seconds; whether set."""
        with self._cond:
            if not (self._set or self._rung):
                self._cond.wait(timeout)
            self._rung = False
            return self._set


def _has_children() -> bool:
    """Whether this process has a child, running or exited and not yet reaped (True where
    that cannot be asked)."""
    if not hasattr(os, "waitid"):
        return True
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def status_of(returncode: int) -> int:
    """A child's status as a shell reports it: ``128 + N`` when it died of signal N."""
    return exit_codes.SIGNAL_BASE - returncode if returncode < 0 else returncode


class Child:
    """CMD running as a child process, in a process group of its own."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        self.terminal = _foreground_terminal()
        #: orphans CMD leaves are re-parented to dblock, so /proc shows them all
        before = _become_subreaper()
        self.subreaper = before is not None
        self._restore_subreaper = before is False
        #: processes of dblock's own from before CMD (a program that runs dblock in-process
        #: may have some): never CMD's, never signalled or reaped here
        self._theirs = frozenset(descendants(os.getpid())) if self.subreaper else frozenset()
        try:
            self.process = self._start(argv, env)
        except FileNotFoundError:
            raise CannotStart(f"{argv[0]}: command not found", exit_codes.NOT_FOUND) from None
        except PermissionError:
            raise CannotStart(f"{argv[0]}: permission denied", exit_codes.CANNOT_EXECUTE) from None
        except OSError as exc:
            raise CannotStart(f"{argv[0]}: {exc.strerror}", exit_codes.CANNOT_EXECUTE) from None
        self.pgid = self.process.pid
        if self.terminal is not None:
            # dblock is now in the background of the terminal: under `stty tostop` a message
            # would stop it with SIGTTOU just when it must stop CMD (CMD has its own default)
            with suppress(ValueError):  # not the main thread: no handlers there anyway
                signal.signal(signal.SIGTTOU, signal.SIG_IGN)

    def _start(self, argv: Sequence[str], env: Mapping[str, str] | None) -> subprocess.Popen[bytes]:
        try:
            return subprocess.Popen(  # noqa: S603 - running CMD is the point
                list(argv),
                env=env,
                preexec_fn=_child_setup(self.terminal),  # noqa: PLW1509 - no locks taken
            )
        except BaseException:
            self.close()  # no CMD: nothing to adopt
            raise

    @property
    def pid(self) -> int:
        return self.process.pid

    def send(self, signum: int) -> None:
        """Send ``signum`` to CMD's process group."""
        with suppress(ProcessLookupError, PermissionError):  # already gone
            os.killpg(self.pgid, signum)

    def forward(self, signum: int) -> None:
        """Pass on a signal dblock received. A Ctrl-C typed on the terminal has reached CMD's
        group directly; one sent to dblock alone (``kill -INT``) is passed on like the rest."""
        self.send(signum)

    def poll(self) -> int | None:
        returncode = self.process.poll()
        if returncode is not None:
            self.take_terminal()
        return returncode

    def ring_on_exit(self, alarm: Alarm) -> None:
        """Ring ``alarm`` when CMD exits, so that its end is seen at once rather than at the
        watch's next look (which remains where there is no waitid)."""
        if not hasattr(os, "waitid"):
            return
        pid = self.pid

        def wait() -> None:
            with suppress(ChildProcessError):  # reaped already: the watch has seen its end
                os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # the reaping is Popen's
            alarm.ring()

        threading.Thread(target=wait, name="dblock-cmd-exit", daemon=True).start()

    def take_terminal(self) -> None:
        """Make dblock's group the terminal's foreground again (after CMD ended or stopped)."""
        if self.terminal is None:
            return
        with _no_sigttou():
            try:
                if os.tcgetpgrp(self.terminal) == self.pgid:
                    os.tcsetpgrp(self.terminal, os.getpgrp())
            except OSError:
                pass  # the terminal is gone (hung up)

    def follow_job_control(self, may_continue: Callable[[], bool]) -> None:
        """If Ctrl-Z stopped CMD, stop dblock's own job too, as a shell expects of a job;
        when the shell continues dblock, continue CMD (in the terminal's foreground again
        after ``fg``), unless ``may_continue()`` says the lease no longer allows it."""
        if self.terminal is None or not hasattr(os, "waitid"):
            return
        try:
            info = os.waitid(os.P_PID, self.pid, os.WSTOPPED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        terminal_stops = (signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)
        if info is None or info.si_code != os.CLD_STOPPED or info.si_status not in terminal_stops:
            return
        self.take_terminal()
        os.killpg(os.getpgrp(), signal.SIGTSTP)  # returns once the shell continues dblock
        with _no_sigttou():
            try:
                if os.tcgetpgrp(self.terminal) == os.getpgrp():  # `fg`, not `bg`
                    os.tcsetpgrp(self.terminal, self.pgid)
            except OSError:
                pass
        if may_continue():
            self.send(signal.SIGCONT)

    def reap_orphans(self) -> None:
        """Reap the exited processes re-parented to dblock (never CMD: Popen reaps it), so
        that a long run does not collect zombies."""
        if not self.subreaper:
            return
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or info.si_pid == self.pid:
                return
            if info.si_pid in self._theirs:  # not ours to reap: reap CMD's the slow way
                self.remaining()
                return
            with suppress(ChildProcessError):
                os.waitpid(info.si_pid, 0)

    def remaining(self) -> dict[int, bool]:
        """Live processes of CMD's: its group (its leader's pid when the group is not empty)
        and every descendant in /proc; True for those still running. Reaps what was
        re-parented to dblock and has exited."""
        found = descendants(os.getpid(), self._theirs) if self.subreaper else {}
        for pid, running in list(found.items()):
            if not running and pid != self.pid:
                try:
                    if os.waitpid(pid, os.WNOHANG)[0] == pid:  # an orphan of ours, now reaped
                        del found[pid]
                except ChildProcessError:
                    pass  # someone else's to reap
        if self.process.returncode is None:
            found.setdefault(self.pid, True)
        else:
            found.pop(self.pid, None)
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            pass  # the group is empty
        except PermissionError:
            found.setdefault(-self.pgid, True)  # a member changed its user: still there
        else:
            found.setdefault(-self.pgid, True)
        return {pid: running for pid, running in found.items() if running}

    def signal_all(self, signum: int) -> None:
        """Send ``signum`` to CMD's group and to every descendant of dblock."""
        self.send(signum)
        for pid in self.remaining():
            if pid > 0:
                with suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signum)

    def stop(self, kill_at: float) -> list[int]:
        """Stop CMD and everything it started: SIGTERM now, SIGKILL at ``kill_at`` (a
        ``time.monotonic()`` moment) to whatever is left, and wait until all of it is gone.
        Returns what is still there KILL_WAIT seconds after the SIGKILL (pids; ``-pgid`` for
        CMD's group where /proc is not read): empty unless a process is stuck in the kernel
        or dblock may not signal it."""
        if time.monotonic() < kill_at:
            self.signal_all(signal.SIGTERM)
            self.signal_all(signal.SIGCONT)  # a stopped process acts on SIGTERM only then
            while self._running_now() and time.monotonic() < kill_at:
                time.sleep(min(_REAP_INTERVAL, max(0.0, kill_at - time.monotonic())))
        give_up = time.monotonic() + KILL_WAIT
        while self._running_now() and time.monotonic() < give_up:
            self.signal_all(signal.SIGKILL)
            time.sleep(_REAP_INTERVAL)
        self.take_terminal()
        return sorted(self.remaining())

    def _running_now(self) -> bool:
        self.process.poll()
        return bool(self.remaining())

    def close(self) -> None:
        """CMD and its descendants are gone (or given up on): stop adopting orphans."""
        if self._restore_subreaper:
            self._restore_subreaper = False
            _stop_being_subreaper()


class SignalRelay:
    """Handlers for SIGINT/SIGTERM/SIGHUP while dblock runs.

    While waiting for the lock a signal raises :class:`Interrupted` in the main thread, so the
    wait ends at once. After :meth:`defer` signals are queued, and :meth:`attach` forwards them
    and every later one to the child. Handlers are installed only in the main thread and
    restored on exit.

    A driver may swallow the exception on its way up (kazoo turns any exception raised while
    it wakes its connection thread into ``ConnectionClosedError``, which the wait retries): so
    once raised, the signal is delivered again every :data:`REDELIVER_INTERVAL` seconds (as
    :data:`REDELIVERY`) until the wait has ended, and :meth:`defer` raises it if the lock was
    granted meanwhile. A redelivery raises only where the main thread handles no exception, so
    it never cuts short the ``finally`` and ``except`` blocks the first one runs on its way up;
    a signal sent again (a second Ctrl-C) raises wherever it lands, as the first did.
    """

    def __init__(self) -> None:
        self._child: Child | None = None
        self._raise = True
        self._previous: dict[int, object] = {}
        self._queued: list[int] = []
        #: signals forwarded to the attached child (see rearm)
        self._forwarded: list[int] = []
        self._pending: int | None = None
        self._installed = False
        self._guard = threading.RLock()  # the handler takes it too, in the main thread

    def defer(self) -> None:
        """From now on queue signals until a child is attached (no more Interrupted).

        Raises :class:`Interrupted` if a signal arrived while waiting and was lost on its way.
        """
        with self._guard:
            pending, self._raise = self._pending, False
        if pending is not None:
            raise Interrupted(pending)

    def rearm(self) -> None:
        """Back to waiting (``dblock lead`` campaigns again): signals raise Interrupted.

        Raises :class:`Interrupted` if a signal came while the last child ran or was being
        stopped (forwarded to it, or queued): it asked dblock to end, and the child's stop for
        a lost lease must not swallow that request."""
        with self._guard:
            self._child, self._raise, self._pending = None, True, None
        came = self._forwarded + self._queued
        self._forwarded, self._queued = [], []
        if came:
            raise Interrupted(came[0])

    def attach(self, child: Child) -> None:
        self._child = child
        queued, self._queued = self._queued, []
        for signum in queued:
            child.forward(signum)
        self._forwarded += queued

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        child = self._child
        if child is not None:
            child.forward(signum)
            self._forwarded.append(signum)
        elif self._raise:
            with self._guard:
                pending = self._pending
                if pending is None:  # start redelivering it
                    pending = self._pending = signum
                    threading.Thread(
                        target=self._redeliver, name="dblock-signal-redelivery", daemon=True
                    ).start()
            # a signal sent again (a second Ctrl-C) raises wherever it lands, as the first
            raise Interrupted(pending)
        else:
            self._queued.append(signum)

    def _redelivered(self, signum: int, frame: FrameType | None) -> None:
        """A redelivery waits while the main thread handles an exception (the first
        Interrupted going up through the wait's cleanup, or its catcher): raising there would
        cut that cleanup short; once nothing is handled, a swallowed one is raised."""
        with self._guard:
            live = self._installed and self._raise and self._child is None
            pending = self._pending if live else None
        if pending is not None and sys.exc_info()[1] is None:
            raise Interrupted(pending)

    def _redeliver(self) -> None:
        main = threading.main_thread().ident or 0  # set: the main thread runs the handler
        while True:
            time.sleep(REDELIVER_INTERVAL)
            with self._guard:  # __exit__ takes the guard before it restores the handlers
                if not (self._installed and self._raise) or self._pending is None:
                    return
                signal.pthread_kill(main, REDELIVERY)

    def __enter__(self) -> SignalRelay:
        if threading.current_thread() is threading.main_thread():
            for signum in FORWARDED:
                self._previous[signum] = signal.signal(signum, self._handle)
            self._previous[REDELIVERY] = signal.signal(REDELIVERY, self._redelivered)
            self._installed = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with self._guard:
            self._installed = False
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        self._previous.clear()
        if self._child is not None:
            self._child.close()
