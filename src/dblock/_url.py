"""Database URLs: parsing, the embedded default, and redaction for messages."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from ._errors import ConfigurationError

SCHEMES = {
    "sqlite": "sqlite",
    "postgresql": "postgresql",
    "postgres": "postgresql",
    "mysql": "mysql",
    "mariadb": "mysql",
}


@dataclass(frozen=True)
class DatabaseURL:
    """A parsed database URL. ``safe`` is the URL with its password replaced by ``***``."""

    raw: str
    dialect: str
    safe: str
    host: str | None = None
    port: int | None = None
    user: str | None = None
    password: str | None = None
    database: str = ""
    query: dict[str, str] = field(default_factory=dict)


def default_url() -> str:
    """``DBLOCK_URL``, else the embedded SQLite file in the user's state directory."""
    env = os.environ.get("DBLOCK_URL")
    if env:
        return env
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return "sqlite:///" + str(Path(state) / "dblock" / "locks.sqlite3")


def redact(url: str) -> str:
    """The URL with anything that may be a password replaced by ``***``.

    It does not trust a URL parser (malformed URLs are exactly where parsers and drivers
    disagree): everything between the first ``:`` of the user part and the last ``@`` goes.
    """
    head, at, tail = url.rpartition("@")
    if not at:
        return url
    start = head.find("//") + 2 if "//" in head else head.find(":") + 1
    colon = head.find(":", start)
    if colon < 0:
        return url
    return f"{head[: colon + 1]}***@{tail}"


def parse_url(url: str | None) -> DatabaseURL:
    """Parse ``url`` (None: the default); raise ConfigurationError naming what is wrong."""
    if url is None:
        url = default_url()
    if not isinstance(url, str):
        raise ConfigurationError(f"url must be a str, not {type(url).__name__}")
    safe = redact(url)
    if any(ord(c) < 32 or ord(c) == 127 for c in url):
        raise ConfigurationError(f"database URL {safe!r} contains control characters")
    scheme, sep, _ = url.partition("://")
    dialect = SCHEMES.get(scheme.lower()) if sep else None
    if dialect is None:
        raise ConfigurationError(
            f"unsupported database URL {safe!r}: use sqlite:///path.db, "
            "postgresql://user:password@host:port/db or mysql://user:password@host:port/db"
        )
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        # urllib's message would quote the bad part, which may be the password
        raise ConfigurationError(
            f"invalid database URL {safe!r}: the host:port part does not parse; "
            "percent-encode '/', '?', '#', '@' and ':' in the user name and password"
        ) from None
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    if dialect == "sqlite":
        if parts.netloc:
            raise ConfigurationError(
                f"invalid SQLite URL {safe!r}: use sqlite:///relative/path.db or "
                "sqlite:////absolute/path.db"
            )
        path = unquote(parts.path[1:]) if parts.path.startswith("/") else ""
        if not path:
            raise ConfigurationError(f"SQLite URL {safe!r} names no file")
        return DatabaseURL(url, dialect, safe, database=path, query=query)
    return DatabaseURL(
        url,
        dialect,
        safe,
        host=parts.hostname,
        port=port,
        user=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password is not None else None,
        database=unquote(parts.path.lstrip("/")),
        query=query,
    )
