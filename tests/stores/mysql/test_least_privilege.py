"""A MariaDB user with only the grants docs/stores/mysql.md lists ("Least privilege"), on
tables a DBA made with ``dblock schema``, runs every kind of hold, a wait handed over between
two clients, session holds, inspection and maintenance."""

from __future__ import annotations

import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import dblock
from tests._servers import MYSQL_URL, drop_tables, raw_connect, require_server
from tests.stores._least_privilege import dba_schema, documented_grants, every_kind
from tests.stores.mysql.provider import _mariadb_apply


def test_the_documented_grants_run_everything() -> None:
    require_server("mysql", MYSQL_URL)
    parts = urlsplit(MYSQL_URL)
    table, user = "t_" + uuid.uuid4().hex[:16], "u_" + uuid.uuid4().hex[:12]
    ddl = dba_schema("mysql", table)
    host, port = parts.hostname or "127.0.0.1", parts.port or 3306
    _mariadb_apply(MYSQL_URL, ddl, Path())
    conn = raw_connect(MYSQL_URL)
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'")
            for grant in documented_grants("mysql.md", 5, table):
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
