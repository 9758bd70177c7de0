"""A role with only the grants docs/stores/postgresql.md lists ("Least privilege"), on a table
a DBA made with ``dblock schema``, runs every kind of hold, a wait handed over between two
clients, session holds, inspection and maintenance."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import dblock
from tests._servers import POSTGRESQL_URL, drop_tables, raw_connect, require_server
from tests.providers import QUORUM_PG_DATABASES, quorum_pg_check
from tests.stores._least_privilege import dba_schema, documented_grants, every_kind


def _db_url(database: str, user: str = "") -> str:
    """The shared server's URL for ``database``, as ``user`` (password pw) if given."""
    parts = urlsplit(POSTGRESQL_URL)
    netloc = parts.netloc if not user else f"{user}:pw@{parts.netloc.rpartition('@')[2]}"
    return urlunsplit(parts._replace(netloc=netloc, path="/" + database))


@contextlib.contextmanager
def _granted(databases: list[str]) -> Iterator[tuple[list[str], str]]:
    """A new role with the documented grants on a DBA's new table in each of ``databases``:
    (its URLs, the table)."""
    table, role = "t_" + uuid.uuid4().hex[:16], "r_" + uuid.uuid4().hex[:12]
    ddl = dba_schema("postgresql", table)
    admins = [raw_connect(_db_url(db)) for db in databases]
    admins[0].execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw'")
    try:
        for admin in admins:
            admin.execute(ddl)
            for grant in documented_grants("postgresql.md", 2, table):
                admin.execute(grant.replace(" TO app;", f" TO {role}"))
        yield [_db_url(db, role) for db in databases], table
    finally:
        for db, admin in zip(databases, admins, strict=True):
            drop_tables(_db_url(db), table)
            admin.execute(f"DROP OWNED BY {role}")
        admins[0].execute(f"DROP ROLE {role}")
        for admin in admins:
            admin.close()


def test_the_documented_grants_run_everything() -> None:
    require_server("postgresql", POSTGRESQL_URL)
    with _granted([urlsplit(POSTGRESQL_URL).path.lstrip("/")]) as (urls, table):
        _everything(urls[0], table)


def test_a_quorum_member_needs_no_more() -> None:
    """A quorum's grants read and raise each member's token sequence (docs/stores/quorum.md)."""
    quorum_pg_check(None)
    with _granted(list(QUORUM_PG_DATABASES)) as (urls, table):
        with dblock.connect(" ".join(urls), table=table, create_schema=False) as client:
            tokens = []
            for _ in range(3):
                with client.lock("job", ttl=5) as held:
                    tokens.append(held.token)
            assert tokens == sorted(set(tokens)), tokens


def _everything(url: str, table: str) -> None:
    connect: dict[str, object] = {"table": table, "create_schema": False}
    with dblock.connect(url, **connect) as a, dblock.connect(url, **connect) as b:
        every_kind(a, b, session=True)  # session holds: pg_advisory_lock and a token
