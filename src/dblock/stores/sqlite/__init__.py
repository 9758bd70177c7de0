"""The SQLite store: a lock table in a file, on the standard library's ``sqlite3``.

``store.py`` is the store, ``statements.py`` its statements. This module holds only the
registry's entry (no driver is imported here)."""

from __future__ import annotations

from urllib.parse import unquote

from ..._errors import ConfigurationError
from ..._url import DatabaseURL, embedded_url, split_url
from .._entry import StoreEntry


def parse(url: str, dialect: str, safe: str) -> DatabaseURL:
    """``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db``."""
    parts, _port, query, max_connections = split_url(url, safe)
    if parts.netloc:
        raise ConfigurationError(
            f"invalid SQLite URL {safe!r}: use sqlite:///relative/path.db or "
            "sqlite:////absolute/path.db"
        )
    path = unquote(parts.path[1:]) if parts.path.startswith("/") else ""
    if not path:
        raise ConfigurationError(f"SQLite URL {safe!r} names no file")
    return DatabaseURL(
        url,
        dialect,
        safe,
        database=path,
        query=query,
        max_connections=max_connections,
        private=url == embedded_url(),
    )


ENTRY = StoreEntry(
    name="sqlite",
    title="SQLite",
    schemes=("sqlite",),
    usage="sqlite:///path.db",
    store="dblock.stores.sqlite.store:SqliteStore",
    parse=parse,
    drivers=("sqlite3",),
    ddl_url="sqlite:///dblock.sqlite3",
)
