"""The contract suite's provider of the MySQL/MariaDB store (collected by tests/providers.py).

The test server is MariaDB: the store's class line declares SessionHolds, which a MySQL 8
server withholds (no sequences), so a provider on MySQL 8 would skip those tests.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests._servers import MYSQL_URL
from tests.stores._provider import (
    SERVER,
    SQL_STORE,
    Entry,
    check_server,
    locking_outage,
    row_lock,
    run_client,
    same_store,
)


def _mariadb_apply(url: str, script: str, _tmp: Path) -> None:
    parts = urlsplit(url)
    argv = [
        "mariadb",
        f"--host={parts.hostname or '127.0.0.1'}",
        f"--port={parts.port or 3306}",
        f"--user={parts.username or 'root'}",
        *([f"--password={parts.password}"] if parts.password else []),
        parts.path.lstrip("/"),
    ]
    run_client(argv, script)


def _private_mariadb(root: Path) -> contextlib.AbstractContextManager[Any]:
    from tests._private_servers import private_mariadb

    return private_mariadb(root)


PROVIDERS = (
    Entry(
        name="mysql",
        store="dblock.stores.mysql.store:MysqlStore",
        markers=SQL_STORE | SERVER | {"advisory", "bell"},
        dialect="mysql",
        url=lambda _tmp: MYSQL_URL,
        default_port=3306,
        check=check_server("mysql"),
        q="`",
        hold_up_writes=row_lock("`"),
        private=_private_mariadb,
        # every session of a MySQL client is in its pool (the doorbell is a pooled one too)
        kill_tagged=lambda provider, client, _tag: provider.kill_sessions(client),
        apply_script=_mariadb_apply,
        own_store=same_store,
        # another session holds LOCK TABLES <table> WRITE, so renewals block
        outage=locking_outage("LOCK TABLES `{table}` WRITE", "UNLOCK TABLES"),
    ),
)
