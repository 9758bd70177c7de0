"""Ending a loop on SIGINT, SIGTERM or SIGHUP without raising in it.

A Python signal handler runs in the main thread between two bytecodes, wherever it happens to
be: an exception raised there can land inside a library's ``with lock:``, just after a
condition's wait has let go of the lock and before it is set up to take it back, and the
``with`` then releases a lock it no longer holds (``RuntimeError: release unlocked lock``).
So these handlers raise nothing. The signal's number reaches a thread of this module through
the wakeup fd, which Python's C-level handler writes to; that thread notes it and calls
``wake`` (which may take locks: it does not run inside the interrupted code), and the loop
checks :meth:`StopSignals.stopped` after each wake-up.
"""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Callable
from types import FrameType, TracebackType

from .supervisor import FORWARDED


class StopSignals:
    """While entered (main thread only; elsewhere it does nothing): the first of
    SIGINT/SIGTERM/SIGHUP sets :attr:`signum` and calls ``wake``."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        #: the first signal received, or None
        self.signum: int | None = None
        self._previous: dict[int, object] = {}
        self._previous_fd = -1
        self._pair: tuple[socket.socket, socket.socket] | None = None
        self._reader: threading.Thread | None = None

    def stopped(self) -> bool:
        return self.signum is not None

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is not threading.main_thread():
            return self
        read, write = self._pair = socket.socketpair()
        write.setblocking(False)  # set_wakeup_fd requires it
        self._reader = threading.Thread(
            target=self._read, args=(read,), name="dblock-stop-signals", daemon=True
        )
        self._reader.start()
        self._previous_fd = signal.set_wakeup_fd(write.fileno(), warn_on_full_buffer=False)
        for signum in FORWARDED:
            self._previous[signum] = signal.signal(signum, _noted)
        return self

    def _read(self, read: socket.socket) -> None:
        while data := read.recv(64):  # b"": the write end was closed (__exit__)
            if self.signum is None:
                self.signum = next((s for s in data if s in FORWARDED), None)
            if self.signum is not None:
                self._wake()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._pair is None:
            return
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        self._previous.clear()
        signal.set_wakeup_fd(self._previous_fd)
        read, write = self._pair
        write.close()
        if self._reader is not None:
            self._reader.join()
        read.close()
        self._pair = None


def _noted(signum: int, frame: FrameType | None) -> None:
    """The Python-level handler: nothing (the wakeup fd carries the signal), so that Python's
    default for SIGINT (KeyboardInterrupt) or the signal's own (ending the process) is not
    used."""


__all__ = ["StopSignals"]
