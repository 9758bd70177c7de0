"""The settings dblock gives its own PostgreSQL sessions, and what they are for."""

from __future__ import annotations

import itertools
from typing import Any
from urllib.parse import quote

import pytest

import dblock
from dblock.stores.postgresql.store import PostgresStore
from tests._internals import store_of
from tests._servers import POSTGRESQL_URL, raw_connect


def _setting(client: dblock.Client, name: str) -> str:
    backend = store_of(client)
    assert isinstance(backend, PostgresStore)
    return str(backend.run("show", lambda conn: conn.execute(f"SHOW {name}").fetchone()[0]))


def test_the_urls_own_options_apply_and_dblocks_settings_still_hold(pg_table: str) -> None:
    options = quote("-c statement_timeout=12345 -c synchronous_commit=off")
    with dblock.connect(f"{POSTGRESQL_URL}?options={options}", table=pg_table) as client:
        assert _setting(client, "statement_timeout") == "12345ms"
        # every statement that issues a token must wait for the disk, whatever the URL says
        assert _setting(client, "synchronous_commit") == "on"
        assert _setting(client, "enable_bitmapscan") == "off"


def _entries_returned(conn: Any, sql: str, params: dict[str, Any], index: str) -> list[int]:
    """Index entries each of three runs of ``sql`` is handed by ``index`` (dead ones
    included: a scan learns that an entry is dead from the table). One transaction, so that
    the session's counts are not flushed, and reset, between the runs."""
    counts = []
    with conn.transaction():
        for _ in range(4):
            row = conn.execute("SELECT pg_stat_get_xact_tuples_returned(%s::regclass)", (index,))
            counts.append(int(row.fetchone()[0]))
            if len(counts) < 4:
                conn.execute(sql, params)
    return [after - before for before, after in itertools.pairwise(counts)]


@pytest.mark.serial  # another session's open snapshot keeps dead entries unmarkable
def test_a_queue_scan_walks_the_entries_a_busy_key_churned_through_once(pg_table: str) -> None:
    # Each waiter of a busy key adds a queue entry and the hand-over to it deletes it: a key
    # busy for a while leaves thousands of dead entries in the queue's index until a vacuum
    # (which may be off, or minutes away). A plain index scan marks those it meets, so the
    # next scan skips them; a bitmap scan does not, and every hand-over paid for all of them.
    with dblock.connect(POSTGRESQL_URL, table=pg_table) as client:
        backend = store_of(client)
        assert isinstance(backend, PostgresStore)
        churn = raw_connect(POSTGRESQL_URL)
        try:
            holders = f'"{pg_table}_holders"'
            churn.execute(
                f"INSERT INTO {holders} (lock_key, holder, kind, waiting, token, acquired_at, "
                "expires_at) SELECT 'busy', 'waiter-' || g, 'lock', 1, 0, now(), "
                "now() + interval '9 seconds' FROM generate_series(1, 5000) g"
            )
            churn.execute(f"DELETE FROM {holders} WHERE lock_key = 'busy'")
        finally:
            churn.close()
        params = {"key": "busy", "owner": "newcomer"}
        index = f'"{pg_table}_holders_pkey"'

        first, *later = backend.run(
            "probe", lambda conn: _entries_returned(conn, backend.sql.probe, params, index)
        )
        assert first >= 5000, "the first scan meets every dead entry"
        assert later == [0, 0], f"later scans walked the dead entries again: {first}, {later}"
