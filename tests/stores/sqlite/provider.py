"""The contract suite's provider of the SQLite store (collected by tests/providers.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.stores._provider import SQL_STORE, Entry, locking_outage, same_store


def _sqlite_url(tmp: Path) -> str:
    return f"sqlite:///{tmp}/locks.sqlite3"


def _sqlite_hold_up_writes(cursor: Any, table: str, key: str) -> None:
    cursor.execute("BEGIN IMMEDIATE")  # holds up every writer of the file


def _sqlite_apply(url: str, script: str, _tmp: Path) -> None:
    conn = sqlite3.connect(urlsplit(url).path[1:])
    try:
        conn.executescript(script)
    finally:
        conn.close()


PROVIDERS = (
    Entry(
        name="sqlite",
        store="dblock.stores.sqlite.store:SqliteStore",
        markers=SQL_STORE | {"file"},
        dialect="sqlite",
        url=_sqlite_url,
        q='"',
        mark="?",
        hold_up_writes=_sqlite_hold_up_writes,
        apply_script=_sqlite_apply,
        own_store=same_store,
        # another process holds BEGIN EXCLUSIVE on the file, so renewals cannot write
        outage=locking_outage("BEGIN EXCLUSIVE", "ROLLBACK"),
    ),
)
