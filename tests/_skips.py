"""A pytest plugin for ``scripts/test``: skipped tests summarised by reason in a few lines.

    python -m pytest -p tests._skips ...

The contract suite skips a test on every provider that lacks a capability it needs
(``provider redis [sync] lacks session``), over a thousand of them in a whole run; ``-ra``
lists each location on a line of its own, burying the failures. With this plugin the short
summary keeps failures, errors and xfail/xpass lines in full, and the skips become one line
per reason with its count; a missing capability is one line, naming its providers.
"""

from __future__ import annotations

import re
import textwrap
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

import pytest

_LACKS = re.compile(r"provider (?P<provider>.+?)(?: \[\w+\])? lacks (?P<what>.+)")


def summary(reasons: Iterable[str], width: int = 100) -> list[str]:
    """One reason per entry, the most frequent first: ``count  reason``; the providers that
    lack one capability share an entry (``lacks session: etcd 11, redis 15``: both client
    modes counted together), wrapped at ``width``."""
    lacking: defaultdict[str, Counter[str]] = defaultdict(Counter)
    other: Counter[str] = Counter()
    for reason in reasons:
        found = _LACKS.fullmatch(reason)
        if found:
            lacking[found["what"]][found["provider"]] += 1
        else:
            other[reason] += 1
    rows = [
        (sum(by.values()), f"lacks {what}: " + ", ".join(f"{p} {n}" for p, n in sorted(by.items())))
        for what, by in lacking.items()
    ]
    rows += [(n, reason) for reason, n in other.items()]
    rows.sort(key=lambda row: (-row[0], row[1]))
    digits = len(str(rows[0][0])) if rows else 1
    indent = " " * (digits + 2)
    lines = []
    for n, text in rows:
        first = f"{n:>{digits}}  "
        lines += textwrap.wrap(text, width, initial_indent=first, subsequent_indent=indent)
    return lines


def _reason(report: Any) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, (tuple, list)) and len(longrepr) == 3:  # (path, line, message)
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:  # not on an xdist worker
        reporter.reportchars = reporter.reportchars.replace("s", "")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if r.skipped]
    if skipped:
        terminalreporter.write_sep("=", f"{len(skipped)} skipped, by reason")
        width = max(40, terminalreporter._tw.fullwidth - 1)
        for line in summary((_reason(r) for r in skipped), width):
            terminalreporter.write_line(line)
