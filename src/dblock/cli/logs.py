"""The CLI's logging: warnings on stderr, once each; everything with --debug."""

from __future__ import annotations

import logging
import sys

from .output import printable

log = logging.getLogger("dblock")


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


class Logging:
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
    if Logging.handler is not None:
        Logging.handler.setFormatter(
            _EscapingFormatter("%(asctime)s dblock[%(threadName)s] %(levelname)s %(message)s")
        )
    log.setLevel(logging.DEBUG)
