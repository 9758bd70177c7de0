"""Running CMD as a child: signal forwarding, exit statuses, termination on lease loss.

Process groups: when dblock runs in the foreground of a terminal, CMD stays in dblock's
process group so it can use the terminal, and a Ctrl-C typed there reaches CMD directly (dblock
does not send SIGINT a second time). Otherwise (cron, systemd, scripts) CMD gets a session and
process group of its own, and signals go to that whole group, so ``sh -c 'a; b'`` and the
children CMD starts are stopped too.

If dblock itself dies without a chance to stop CMD (SIGKILL, the OOM killer), its lease is
no longer renewed and another host may take the lock once it runs out: so on Linux the kernel
SIGKILLs CMD the moment dblock dies (``PR_SET_PDEATHSIG``). Processes CMD started are not
reached by that; elsewhere, CMD outlives a killed dblock.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from types import FrameType, TracebackType
from typing import Final

from . import exit_codes

#: the signals dblock passes on to CMD
FORWARDED: Final = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: seconds between SIGTERM and SIGKILL when CMD must stop because the lease was lost
KILL_GRACE: Final = 5.0


class Interrupted(BaseException):
    """Raised in the main thread when a forwarded signal arrives before CMD has started.

    A BaseException, like KeyboardInterrupt, so that no ``except Exception`` swallows it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class CannotStart(Exception):
    """CMD could not be started; ``exit_code`` is 127 (not found) or 126 (not executable)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _in_terminal_foreground() -> bool:
    """True if dblock's process group is the foreground group of a terminal on fd 0, 1 or 2."""
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp():
                return True
        except OSError:
            continue
    return False


_PR_SET_PDEATHSIG: Final = 1


def _dies_with_parent() -> Callable[[], None] | None:
    """Linux: a function for the forked child, before exec, that has the kernel SIGKILL it
    when dblock dies; None where that is not available."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # only here: `dblock run` on Linux

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def arm() -> None:  # in the child: no locks, no allocation beyond the call itself
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # dblock died before the request took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return arm


def status_of(returncode: int) -> int:
    """A child's status as a shell reports it: ``128 + N`` when it died of signal N."""
    return exit_codes.SIGNAL_BASE - returncode if returncode < 0 else returncode


class Child:
    """CMD running as a child process."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        self.foreground = _in_terminal_foreground()
        try:
            self.process = subprocess.Popen(  # noqa: S603 - running CMD is the point
                list(argv),
                env=env,
                start_new_session=not self.foreground,
                preexec_fn=_dies_with_parent(),  # noqa: PLW1509 - one prctl call, no locks
            )
        except FileNotFoundError:
            raise CannotStart(f"{argv[0]}: command not found", exit_codes.NOT_FOUND) from None
        except PermissionError:
            raise CannotStart(f"{argv[0]}: permission denied", exit_codes.CANNOT_EXECUTE) from None
        except OSError as exc:
            raise CannotStart(f"{argv[0]}: {exc.strerror}", exit_codes.CANNOT_EXECUTE) from None

    @property
    def pid(self) -> int:
        return self.process.pid

    def send(self, signum: int) -> None:
        """Send ``signum`` to CMD (to its whole process group when it has its own)."""
        try:
            if self.foreground:
                if self.process.returncode is None:
                    self.process.send_signal(signum)
            else:
                os.killpg(self.process.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass  # already gone

    def forward(self, signum: int) -> None:
        """Pass on a signal dblock received (a terminal's Ctrl-C has reached CMD already)."""
        if self.foreground and signum == signal.SIGINT:
            return
        self.send(signum)

    def poll(self) -> int | None:
        return self.process.poll()

    def terminate(self, grace: float = KILL_GRACE) -> int:
        """SIGTERM, then SIGKILL after ``grace`` seconds; return the child's returncode."""
        self.send(signal.SIGTERM)
        try:
            return self.process.wait(grace)
        except subprocess.TimeoutExpired:
            self.send(signal.SIGKILL)
            return self.process.wait()
        finally:
            if not self.foreground:
                self.send(signal.SIGKILL)  # whatever CMD left behind in its group


class SignalRelay:
    """Handlers for SIGINT/SIGTERM/SIGHUP while dblock runs.

    While waiting for the lock a signal raises :class:`Interrupted` in the main thread, so the
    wait ends at once. After :meth:`defer` signals are queued, and :meth:`attach` forwards them
    and every later one to the child. Handlers are installed only in the main thread and
    restored on exit.
    """

    def __init__(self) -> None:
        self._child: Child | None = None
        self._raise = True
        self._previous: dict[int, object] = {}
        self._queued: list[int] = []

    def defer(self) -> None:
        """From now on queue signals until a child is attached (no more Interrupted)."""
        self._raise = False

    def attach(self, child: Child) -> None:
        self._child = child
        queued, self._queued = self._queued, []
        for signum in queued:
            child.forward(signum)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        child = self._child
        if child is not None:
            child.forward(signum)
        elif self._raise:
            raise Interrupted(signum)
        else:
            self._queued.append(signum)

    def __enter__(self) -> SignalRelay:
        if threading.current_thread() is threading.main_thread():
            for signum in FORWARDED:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        self._previous.clear()
