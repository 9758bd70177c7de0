"""The live "who holds it" line shown on stderr while ``dblock run`` waits for a key.

Only on a terminal: when stderr is a file or a pipe (cron, CI) nothing is shown.
"""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING, TextIO

import dblock

from .output import describe_holder, duration, printable

if TYPE_CHECKING:
    from rich.status import Status

#: how often the holder is read from the database while waiting, seconds
POLL_INTERVAL = 1.0
#: how often the line itself (the time waited) is refreshed, seconds
REFRESH_INTERVAL = 0.5


class HolderStatus:
    """Context manager: a spinner line ``waiting for KEY: held by ... for 12s`` on a terminal."""

    def __init__(
        self, client: dblock.Client, keys: str | tuple[str, ...], stream: TextIO | None = None
    ) -> None:
        self._client = client
        #: the keys waited for (``dblock run KEY KEY...``): the line shows the first one held
        self._keys = (keys,) if isinstance(keys, str) else keys
        self._key = self._keys[0]
        self._stream = stream or sys.stderr
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._status: Status | None = None
        self._started = time.monotonic()

    def _text(self, holder: str) -> str:
        waited = duration(time.monotonic() - self._started)
        return printable(f"waiting for {self._key} ({waited}): {holder}")

    def _poll(self) -> None:
        from rich.text import Text

        info: dblock.LockInfo | None = None
        error: str | None = None
        next_read = 0.0
        while True:
            if time.monotonic() >= next_read:
                try:
                    info, error = self._first_held(), None
                except dblock.DBLockError as exc:
                    error = f"cannot read the holder: {exc}"
                next_read = time.monotonic() + POLL_INTERVAL
            holder = error or describe_holder(info)  # times recomputed on every refresh
            if self._status is not None:
                self._status.update(Text(self._text(holder)))
            if self._stop.wait(REFRESH_INTERVAL):
                return

    def _first_held(self) -> dblock.LockInfo | None:
        for key in self._keys:
            info = self._client.info(key)
            if info is not None:
                self._key = key
                return info
        return None

    def __enter__(self) -> HolderStatus:
        try:
            terminal = self._stream.isatty()
        except (AttributeError, ValueError):
            terminal = False
        if not terminal:
            return self
        from rich.console import Console
        from rich.text import Text

        console = Console(file=self._stream, markup=False, emoji=False, highlight=False)
        self._status = console.status(Text(self._text("looking up the holder")))
        self._status.start()
        self._thread = threading.Thread(target=self._poll, name="dblock-status", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._status is not None:
            self._status.stop()
