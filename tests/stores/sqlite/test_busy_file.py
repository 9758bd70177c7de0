"""A write transaction left open on the file (its process paused inside it) holds up every
other writer: an acquire no longer than its timeout, anything else the busy timeout, then
BackendError (docs/stores/sqlite.md, "Busy file")."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

import dblock


def test_an_open_write_transaction_holds_up_acquire_and_release(tmp_path: Path) -> None:
    path = tmp_path / "locks.sqlite3"
    with dblock.connect(f"sqlite:///{path}?timeout=3") as client:
        held = client.lock("held", ttl=30)
        assert held.acquire()
        paused = sqlite3.connect(path, isolation_level=None)
        paused.execute("BEGIN IMMEDIATE")  # as a process stopped inside its write
        try:
            started = time.monotonic()
            assert not client.lock("other", ttl=30).acquire(timeout=0.2)
            assert time.monotonic() - started < 2.0  # about its own timeout, not the busy one
            with pytest.raises(dblock.BackendError, match="locked"):
                held.release()
        finally:
            paused.execute("ROLLBACK")
            paused.close()
        held.release()  # the failed release left it held: it ends now
        assert client.info("held") is None
