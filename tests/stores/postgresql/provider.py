"""The contract suite's provider of the PostgreSQL store (collected by tests/providers.py)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import dblock
from tests._servers import POSTGRESQL_URL, raw_connect
from tests.stores._provider import (
    SERVER,
    SQL_STORE,
    Entry,
    Provider,
    check_server,
    row_lock,
    run_client,
)


def _pg_kill_tagged(provider: Provider, client: dblock.Client, tag: str) -> int:
    conn = provider.raw()
    try:
        cur = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (tag,),
        )
        return len(cur.fetchall())
    finally:
        conn.close()


def _psql_apply(url: str, script: str, _tmp: Path) -> None:
    run_client(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", url], script)


@contextlib.contextmanager
def _pg_own_database(url: str) -> Iterator[str]:
    """A fresh database (dropped afterwards)."""
    name = "dblock_cli_" + uuid.uuid4().hex[:12]
    admin = raw_connect(url)
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(urlsplit(url)._replace(path="/" + name))
    finally:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@contextlib.contextmanager
def _pg_outage(admin_url: str, url: str, _table: str) -> Iterator[None]:
    """New connections to the test's own database are refused (``ALLOW_CONNECTIONS false``,
    which binds superusers too, unlike ``CONNECTION LIMIT``) and its sessions are ended."""
    name = urlsplit(url).path.lstrip("/")
    admin = raw_connect(admin_url)  # connected elsewhere: a database cannot lock itself out
    try:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )
        yield
    finally:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        admin.close()


def _private_postgresql(_root: Path) -> contextlib.AbstractContextManager[Any]:
    from tests._private_servers import private_postgresql

    return private_postgresql()


PROVIDERS = (
    Entry(
        name="postgresql",
        store="dblock.stores.postgresql.store:PostgresStore",
        markers=SQL_STORE | SERVER | {"advisory", "bell"},
        dialect="postgresql",
        url=lambda _tmp: POSTGRESQL_URL,
        default_port=5432,
        check=check_server("postgresql"),
        q='"',
        hold_up_writes=row_lock('"'),
        private=_private_postgresql,
        tag_query=lambda tag: f"application_name={tag}",
        kill_tagged=_pg_kill_tagged,
        apply_script=_psql_apply,
        own_store=_pg_own_database,
        outage=_pg_outage,
    ),
)
