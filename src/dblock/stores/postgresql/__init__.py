"""The PostgreSQL store: a lock table, advisory locks for session holds and doorbells,
LISTEN/NOTIFY wake-ups, on psycopg 3.

``store.py`` is the store, ``statements.py`` its statements, ``session.py`` its session
holds, ``doorbell.py`` its waiters behind a crowd, ``borrowed.py`` a pool of the caller's,
``green.py`` psycopg's AsyncConnection behind the blocking interface the store uses.
This module holds only the registry's entry (no driver is imported here)."""

from __future__ import annotations

from ..._url import server_url
from .._entry import StoreEntry

ENTRY = StoreEntry(
    name="postgresql",
    title="PostgreSQL",
    schemes=("postgresql", "postgres"),
    usage="postgresql://user:password@host:port/db",
    store="dblock.stores.postgresql.store:PostgresStore",
    parse=server_url,
    extra="postgresql",
    clients=("psycopg_pool.pool.ConnectionPool", "psycopg_pool.pool_async.AsyncConnectionPool"),
    borrow="dblock.stores.postgresql.borrowed:borrow",
    client_help="a psycopg_pool.ConnectionPool (AsyncConnectionPool for connect_async)",
    drivers=("psycopg",),
    ddl_url="postgresql://localhost/db",
)
