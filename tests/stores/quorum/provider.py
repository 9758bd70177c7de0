"""The contract suite's providers of quorums of three stores (collected by tests/providers.py).

A quorum's URL is one string, its members separated by spaces (docs/stores/quorum.md).
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests._servers import POSTGRESQL_URL, raw_connect, require_server
from tests.stores._provider import Entry

#: the three databases of the PostgreSQL quorum on the shared server (made if missing)
QUORUM_PG_DATABASES = ("q_a", "q_b", "q_c")
_QUORUM_SETUP = threading.Lock()
_REDIS_TRIO: list[Any] = []


def _quorum_sqlite_url(tmp: Path) -> str:
    return " ".join(f"sqlite:///{tmp}/quorum{i}.sqlite3" for i in range(3))


def _quorum_pg_url(_tmp: Path) -> str:
    base = urlsplit(POSTGRESQL_URL)
    return " ".join(urlunsplit(base._replace(path="/" + db)) for db in QUORUM_PG_DATABASES)


def quorum_pg_check(_url: str | None) -> None:
    require_server("postgresql", POSTGRESQL_URL)
    with _QUORUM_SETUP:
        conn = raw_connect(POSTGRESQL_URL)
        try:
            have = {r[0] for r in conn.execute("SELECT datname FROM pg_database").fetchall()}
            for db in QUORUM_PG_DATABASES:
                if db not in have:
                    with contextlib.suppress(Exception):  # another process made it meanwhile
                        conn.execute(f'CREATE DATABASE "{db}"')
        finally:
            conn.close()


def _quorum_redis_url(tmp: Path) -> str:
    """Three private Redis servers, started once for the test session (stopped at exit)."""
    return " ".join(server.url for server in redis_trio(tmp))


def redis_trio(tmp: Path) -> list[Any]:
    """The test session's three private Redis servers (started on first use)."""
    with _QUORUM_SETUP:
        if not _REDIS_TRIO:
            import atexit

            from tests._private_servers import private_redis

            stack = contextlib.ExitStack()
            atexit.register(stack.close)
            for i in range(3):
                root = tmp.parent / f"redis-trio-{uuid.uuid4().hex[:8]}-{i}"
                root.mkdir()
                _REDIS_TRIO.append(stack.enter_context(private_redis(root)))
        return list(_REDIS_TRIO)


def _patient(monkeypatch: pytest.MonkeyPatch) -> None:
    """The contract's tests are about what a quorum does, not its answer window: a store that
    a loaded machine (eight test workers on two cores) keeps from answering a 64-key step in
    2 s must not cost its vote there. The window's own tests are tests/stores/quorum's."""
    from dblock.stores.quorum import store

    monkeypatch.setattr(store, "ANSWER_WITHIN", 15.0)


#: what a quorum client is: lock, locked, scheduled, info, list, force_release, by URL (its
#: store capabilities are QuorumStore's class line: ScheduledRuns, FairQueue, Wakeups)
_QUORUM = frozenset({"url", "processes"})
#: the command line drives the quorum client one way whatever its stores are: its runs are
#: the Redis quorum's (each store's own command-line runs are its provider's)
_QUORUM_CLI = _QUORUM | {"cli"}
_STORE = "dblock.stores.quorum.store:QuorumStore"

# a quorum's stores lease a little longer than the ttl (its clock-drift allowance)
PROVIDERS = (
    Entry(
        name="quorum-sqlite",
        store=_STORE,
        tune=_patient,
        markers=_QUORUM,
        dialect=None,
        url=_quorum_sqlite_url,
        exact_ttl=False,
        # its blocking runs repeat others' code paths: the quorum's thread fan-out is
        # quorum-postgresql's and quorum-redis's, each store's SQLite code is sqlite's own;
        # on the event loop it is the one quorum whose stores run on threads
        modes=("async",),
    ),
    Entry(
        name="quorum-postgresql",
        store=_STORE,
        tune=_patient,
        markers=_QUORUM,
        dialect=None,
        url=_quorum_pg_url,
        check=quorum_pg_check,
        exact_ttl=False,
    ),
    Entry(
        name="quorum-redis",
        store=_STORE,
        tune=_patient,
        markers=_QUORUM_CLI,
        dialect=None,
        url=_quorum_redis_url,
        exact_ttl=False,
    ),
)
