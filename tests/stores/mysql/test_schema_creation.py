"""Creating the schema on MariaDB while other processes already use it.

``CREATE SEQUENCE IF NOT EXISTS`` on a sequence that exists still waits for an exclusive
metadata lock: for every open statement or transaction that used the sequence (every grant
does), and every later grant queues behind it. A process that found the schema incomplete
and then waited for the creation lock while another made it must not make it again.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import dblock
from dblock.stores.mysql.statements import MysqlStatements
from tests._servers import MYSQL_URL, drop_tables, raw_connect, require_server
from tests._waiting import until


@pytest.fixture
def table() -> Iterator[str]:
    require_server("mysql", MYSQL_URL)
    name = "t_" + uuid.uuid4().hex[:16]
    yield name
    drop_tables(MYSQL_URL, name)


def _waits_for_the_creation_lock(cur: Any, name: str) -> bool:
    cur.execute(
        "SELECT 1 FROM information_schema.PROCESSLIST WHERE INFO LIKE %s",
        (f"SELECT GET_LOCK('{name}'%",),
    )
    return cur.fetchone() is not None


def test_a_schema_made_while_waiting_to_make_it_is_not_made_again(table: str) -> None:
    sql = MysqlStatements(None, table)
    creator, user, watcher = (raw_connect(MYSQL_URL).cursor() for _ in range(3))
    creator.execute("SELECT GET_LOCK(%s, 10)", (sql.ddl_lock_name,))  # another process's creation
    outcome: list[object] = []

    def connect() -> None:
        try:
            dblock.connect(MYSQL_URL, table=table, create_schema=True).close()
            outcome.append("connected")
        except Exception as exc:
            outcome.append(exc)

    late = threading.Thread(target=connect, daemon=True)
    late.start()
    until(
        lambda: _waits_for_the_creation_lock(watcher, sql.ddl_lock_name),
        "the late process waits for the creation lock",
    )
    for statement in sql.ddl:  # the other process makes everything
        creator.execute(statement)
    creator.execute(sql.create_sequence(1))
    user.execute("BEGIN")
    user.execute(f"SELECT NEXTVAL({sql.seq})")  # a grant's transaction that used the sequence
    try:
        creator.execute("SELECT RELEASE_LOCK(%s)", (sql.ddl_lock_name,))
        started = time.monotonic()
        late.join(20)
        took = time.monotonic() - started
        assert outcome == ["connected"]
        # made again, the sequence waits for the open transaction: until PyMySQL's read
        # timeout (10 s) ends the wait, and every grant on the table waits behind it
        assert took < 5, f"connect waited {took:.1f} s behind a grant's use of the sequence"
        with dblock.connect(MYSQL_URL, table=table) as client:
            lock = client.lock("k", ttl=30)
            assert lock.acquire(blocking=False)
            lock.release()
    finally:
        user.execute("COMMIT")
        late.join(150)
        for cur in (creator, user, watcher):
            cur.connection.close()


def test_looking_for_the_schema_reads_only_its_own_databases_tables(table: str) -> None:
    """The check each connect makes (which of the schema's tables exist, with their columns)
    opens only the tables of the lock table's database: joined to information_schema.tables,
    MariaDB read every table of every database, a cost that grew with the server."""
    conn = raw_connect(MYSQL_URL)
    try:
        cur = conn.cursor()
        cur.execute("SELECT VERSION()")
        if "MariaDB" not in cur.fetchone()[0]:
            pytest.skip("the plan's notes on information_schema are MariaDB's")
        sql = MysqlStatements(None, table)
        cur.execute("EXPLAIN " + sql.find_tables, (None, *sql.table_names, *sql.session_names))
        notes = [str(row[-1]) for row in cur.fetchall()]
    finally:
        conn.close()
    assert notes and not any("Scanned all databases" in note for note in notes), notes
