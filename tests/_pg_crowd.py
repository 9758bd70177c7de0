"""The test suite's PostgreSQL waiters wait at the key's doorbell however short its queue
(``DBLOCK_TEST_PG_CROWD``, default 0 here; dblock's own default waits there only behind a
crowd, stores/postgresql/doorbell.py): the contract suite's few waiters then run the doorbell's
code, the newer of the two ways to wait; tests of the other way set it back (CROWD)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the workers import this module: pytest costs each ~95 ms to import
    import pytest

#: dblock's own threshold, for the tests of the listener's way
CROWD = 8


def apply(command: Sequence[str] | None = None) -> None:
    """Set this process's threshold from the environment (where PostgreSQL's driver is).
    A worker passes its ``command``: one that names no PostgreSQL server sets nothing, as
    importing the driver would cost it ~140 ms (thousands of workers run in a suite)."""
    value = os.environ.get("DBLOCK_TEST_PG_CROWD")
    if value is None:
        return
    if command is not None and not any("postgres" in word.lower() for word in command):
        return
    try:
        from dblock.stores.postgresql import doorbell
    except ImportError:  # no psycopg: no PostgreSQL store to set
        return
    doorbell.CROWD = int(value)


def dblocks_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """dblock's own threshold for this test, in this process and its workers: a few waiters
    hear releases on their client's listener."""
    monkeypatch.setenv("DBLOCK_TEST_PG_CROWD", str(CROWD))
    try:
        from dblock.stores.postgresql import doorbell
    except ImportError:
        return
    monkeypatch.setattr(doorbell, "CROWD", CROWD)
