"""What the stores' least-privilege tests (tests/stores/*/test_least_privilege.py) share: the
DDL a DBA applies, the lines a store's docs list, and one pass over what a client does to its
store (each kind of hold, a wait handed over between two clients, inspection, maintenance)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from dblock import Client

DOCS = Path(__file__).resolve().parents[2] / "docs" / "stores"


def dba_schema(dialect: str, table: str) -> str:
    """``dblock schema --dialect DIALECT`` for ``table``: the DDL a DBA applies."""
    argv = [sys.executable, "-m", "dblock", "schema", "--dialect", dialect, "--table", table]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout


def documented(doc: str, start: str) -> list[str]:
    """The lines of docs/stores/``doc`` that start with ``start`` (indentation aside)."""
    text = (DOCS / doc).read_text()
    return [x.strip() for x in text.splitlines() if x.strip().startswith(start)]


def documented_grants(doc: str, count: int, table: str) -> list[str]:
    """The ``count`` GRANT lines of docs/stores/``doc``, for ``table`` instead of the
    default table, ``dblock_locks``, that they name."""
    grants = documented(doc, "GRANT ")
    assert len(grants) == count, grants
    return [g.replace("dblock_locks", table) for g in grants]


def every_kind(a: Client, b: Client, *, session: bool = False) -> None:
    """``a`` and ``b``: two clients of one table; ``session``: session holds too (ttl=None)."""
    lock = a.lock("job", ttl=5)
    assert lock.acquire()
    taken = threading.Event()

    def wait() -> None:
        with b.lock("job", ttl=5, timeout=10):
            taken.set()

    waiter = threading.Thread(target=wait)
    waiter.start()
    lock.renew()
    assert [h.key for h in a.list()] == ["job"] and a.info("job") is not None
    lock.release()
    waiter.join(10)
    assert taken.is_set(), "the waiter was handed the lock"
    with a.rwlock("doc", ttl=5).read_lock(), b.rwlock("doc", ttl=5).read_lock():
        pass
    with a.rwlock("doc", ttl=5).write_lock():
        pass
    with a.semaphore("pool", 2, ttl=5), b.semaphore("pool", 2, ttl=5):
        pass
    with a.lock_many(["x", "y"], ttl=5):
        assert not b.lock("x").acquire(blocking=False)
    with a.once("nightly", ttl=5):
        pass
    if session:
        with a.lock("session", ttl=None):
            assert not b.lock("session", ttl=None).acquire(blocking=False)
    held = a.lock("stuck", ttl=30)
    assert held.acquire()
    assert b.force_release("stuck")
    b.purge(older_than=0)
