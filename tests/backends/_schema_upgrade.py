"""A lock table of an earlier dblock version, upgraded by ``connect(create_schema=True)``:
each client-server store's columns and collations as they were (see the stores' tests)."""

from __future__ import annotations

import uuid

import pytest

import dblock
from dblock.backends._names import aux_name
from dblock.cli import main
from tests._servers import columns, drop_tables, execute, raw_connect

#: columns later dblock versions added to tables an earlier one made: (table suffix, column)
_ADDED_COLUMNS = {
    "postgresql": [("_holders", "lease"), ("", "joins")],
    "mysql": [("", "queued_until"), ("_holders", "lease"), ("_holders", "bell")],
}


def check_upgrade(dialect: str, server_db_url: str, key: str) -> None:
    """connect(create_schema=True) upgrades a table an earlier dblock version made."""
    table = "t_" + uuid.uuid4().hex[:16]
    dblock.connect(server_db_url, table=table).close()
    conn = raw_connect(server_db_url)
    try:
        cur = conn.cursor()
        for suffix, column in _ADDED_COLUMNS[dialect]:
            cur.execute(
                f"ALTER TABLE {aux_name(table, suffix) if suffix else table} DROP COLUMN {column}"
            )
        if dialect == "mysql":  # the key collation of earlier versions, which pads
            for name in (table, aux_name(table, "_holders")):
                cur.execute(
                    f"ALTER TABLE {name} MODIFY lock_key VARCHAR(255) CHARACTER SET utf8mb4 "
                    "COLLATE utf8mb4_bin NOT NULL"
                )
        with pytest.raises(dblock.ConfigurationError, match="dblock schema"):
            dblock.connect(server_db_url, table=table, create_schema=False)
        with dblock.connect(server_db_url, table=table) as client:
            holder, waiter = client.lock(key), client.lock(key, reentrant=False)
            assert holder.acquire()
            assert not waiter.acquire(timeout=0.2), "a waiter queues on the upgraded table"
            holder.release()
            assert waiter.acquire(timeout=5)
            waiter.release()
            with client.lock(key, timeout=0), client.lock(key + " ", timeout=0):
                pass  # two keys: the upgraded key columns do not pad
        dblock.connect(server_db_url, table=table, create_schema=False).close()
    finally:
        conn.close()
        drop_tables(server_db_url, table)


#: columns later dblock versions added to tables an earlier one made: (table suffix, column)
READ_ONLY_ADDED = {
    "postgresql": [("_holders", "lease"), ("", "joins")],
    "mysql": [("", "queued_until"), ("_holders", "bell")],
}


def check_read_only_commands_never_upgrade(
    dialect: str, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``list`` and ``info`` refuse a table of an earlier version and leave it as it is."""
    table = "t_" + uuid.uuid4().hex[:16]
    dblock.connect(url, table=table).close()
    try:
        q = "`" if dialect == "mysql" else '"'
        execute(
            url,
            *[
                f"ALTER TABLE {q}{aux_name(table, suffix) if suffix else table}{q} "
                f"DROP COLUMN {column}"
                for suffix, column in READ_ONLY_ADDED[dialect]
            ],
        )
        before = {s: columns(url, aux_name(table, s) if s else table) for s in ("", "_holders")}
        for args in (["list"], ["info", "k"]):
            assert main(["--url", url, "--table", table, *args]) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and "earlier dblock" in err, err
        after = {s: columns(url, aux_name(table, s) if s else table) for s in ("", "_holders")}
        assert after == before, "a read-only command altered the table"
        # a command that writes upgrades it
        assert main(["--url", url, "--table", table, "purge"]) == 0
        assert main(["--url", url, "--table", table, "list"]) == 0
        assert "no locks held" in capsys.readouterr().out
    finally:
        drop_tables(url, table)
