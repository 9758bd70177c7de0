"""How holds are shown: durations, ISO-8601 times, the table and JSON lines.

"held for" and "expires in" compare the database's timestamps with this host's clock, so they
are off by the clock difference between the two; the timestamps themselves are the database's.

Keys, owners and notes are anyone's text: whoever can take a lock chooses them. Human output
shows them through :func:`printable`, so that a key cannot move the cursor, clear the screen,
retitle the window or reorder the line (bidi overrides) on the operator's terminal; JSON output
keeps them exact (json escapes C0 itself).
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from typing import Any, TextIO

from dblock import LockInfo


def printable(text: str) -> str:
    """``text`` with every character that is not printable escaped as Python's ``repr`` would
    (``\\x1b``, ``\\u202e``, ``\\n``): C0 and C1 controls, DEL, format characters (bidi
    overrides and isolates, zero-width characters), line and paragraph separators, lone
    surrogates. Backslashes are left as they are."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class EscapingStream:
    """A text stream that passes each line of what is written through :func:`printable`: for
    messages whose text dblock does not build itself (click's usage errors quote arguments)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write("\n".join(printable(line) for line in text.split("\n")))

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()


def now_utc() -> datetime:
    return datetime.now(timezone.utc)


def duration(seconds: float) -> str:
    """A short human duration: ``850ms``, ``12s``, ``3m04s``, ``2h05m``, ``3d04h``."""
    if seconds < 0:
        seconds = 0.0
    if seconds < 1:
        return f"{int(seconds * 1000)}ms"
    whole = int(seconds)
    if whole < 60:
        return f"{seconds:.0f}s" if seconds >= 10 else f"{seconds:.1f}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def iso(moment: datetime) -> str:
    """ISO-8601 in UTC with milliseconds and an explicit ``+00:00`` offset."""
    return moment.astimezone(timezone.utc).isoformat(timespec="milliseconds")


def iso_or_none(moment: datetime | None) -> str | None:
    """:func:`iso`, or None for a session hold's ``expires_at`` (it has no lease)."""
    return None if moment is None else iso(moment)


def held_for(info: LockInfo, now: datetime) -> float:
    return (now - info.acquired_at).total_seconds()


def expires_in(info: LockInfo, now: datetime) -> str:
    """How long until the lease ends, or ``never`` for a session hold (it has no lease)."""
    if info.expires_at is None:
        return "never"
    return duration((info.expires_at - now).total_seconds())


def as_dict(info: LockInfo) -> dict[str, Any]:
    """The JSON object of one hold (times as ISO-8601 UTC strings)."""
    return {
        "key": info.key,
        "owner": info.owner,
        "token": info.token,
        "kind": info.kind,
        "acquired_at": iso(info.acquired_at),
        "expires_at": iso_or_none(info.expires_at),
    }


def json_line(info: LockInfo) -> str:
    return json.dumps(as_dict(info), ensure_ascii=False, sort_keys=False)


def describe_holder(info: LockInfo | None, now: datetime | None = None) -> str:
    """``held by OWNER (token 7) for 12s, expires in 18s`` for messages and the status line."""
    if info is None:
        return "not held right now"
    now = now or now_utc()
    return (
        f"held by {printable(info.owner)} (token {info.token}) for "
        f"{duration(held_for(info, now))}, expires in {expires_in(info, now)}"
    )


def print_table(infos: list[LockInfo], file: TextIO | None = None) -> None:
    """The holds as a table; wide and colourless when not writing to a terminal."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    out = file or sys.stdout
    terminal = out.isatty()
    console = Console(
        file=out, width=None if terminal else 10_000, highlight=False, markup=False, emoji=False
    )
    if not infos:
        console.print("no locks held")
        return
    now = now_utc()
    # plain columns when piped (grep, awk), a header rule on a terminal
    table = Table(box=box.SIMPLE_HEAD if terminal else None, pad_edge=False, show_edge=False)
    table.add_column("key", overflow="fold")
    table.add_column("kind")
    table.add_column("owner", overflow="fold")
    table.add_column("token", justify="right")
    table.add_column("held for", justify="right")
    table.add_column("expires in", justify="right")
    for info in infos:
        table.add_row(
            printable(info.key),
            info.kind,
            printable(info.owner),
            str(info.token),
            duration(held_for(info, now)),
            expires_in(info, now),
        )
    console.print(table)


def print_info(info: LockInfo, file: TextIO | None = None) -> None:
    """One hold as ``field: value`` lines."""
    out = file or sys.stdout
    now = now_utc()
    rows = [
        ("key", printable(info.key)),
        ("kind", info.kind),
        ("owner", printable(info.owner)),
        ("token", str(info.token)),
        ("acquired at", iso(info.acquired_at)),
        ("expires at", iso_or_none(info.expires_at) or "never (session hold)"),
        ("held for", duration(held_for(info, now))),
        ("expires in", expires_in(info, now)),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        out.write(f"{name + ':':<{width + 1}} {value}\n")
