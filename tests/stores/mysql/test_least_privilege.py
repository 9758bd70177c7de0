"""A MariaDB user with only the grants docs/stores/mysql.md lists ("Least privilege"), on
tables a DBA made with ``dblock schema``, runs every kind of hold, a wait handed over between
two clients, session holds, inspection and maintenance."""

from __future__ import annotations

import uuid
from urllib.parse import urlsplit, urlunsplit

import dblock
from tests._servers import MYSQL_URL, drop_tables, raw_connect, require_server
from tests.stores._least_privilege import dba_schema, documented, every_kind
from tests.stores._provider import run_client


def _documented_grants(table: str) -> list[str]:
    """The GRANT lines of the docs, for ``table`` instead of ``dblock_locks``."""
    grants = documented("mysql.md", "GRANT ")
    assert len(grants) == 5, grants
    return [g.replace("dblock_locks", table) for g in grants]


def test_the_documented_grants_run_everything() -> None:
    require_server("mysql", MYSQL_URL)
    parts = urlsplit(MYSQL_URL)
    table, user = "t_" + uuid.uuid4().hex[:16], "u_" + uuid.uuid4().hex[:12]
    ddl = dba_schema("mysql", table)
    host, port = parts.hostname or "127.0.0.1", parts.port or 3306
    admin = f"--user={parts.username or 'root'}"
    run_client(["mariadb", f"--host={host}", f"--port={port}", admin, parts.path[1:]], ddl)
    conn = raw_connect(MYSQL_URL)
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'")
            for grant in _documented_grants(table):
                cur.execute(grant.replace(" TO app;", f" TO '{user}'@'%'"))
        url = urlunsplit(parts._replace(netloc=f"{user}:pw@{host}:{port}"))
        connect: dict[str, object] = {"table": table, "create_schema": False}
        with dblock.connect(url, **connect) as a, dblock.connect(url, **connect) as b:
            every_kind(a, b, session=True)
    finally:
        drop_tables(MYSQL_URL, table)
        with conn.cursor() as cur:
            cur.execute(f"DROP USER IF EXISTS '{user}'@'%'")
        conn.close()
