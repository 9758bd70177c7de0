"""Database URLs: parsing, the embedded default, and redaction for messages."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

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
    """The URL without its password (best effort for unparsable input)."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        netloc = parts.netloc.rsplit("@", 1)
        user = netloc[0].split(":", 1)[0]
        return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[1]}"))
    except ValueError:
        return "<unparsable URL>"


def parse_url(url: str | None) -> DatabaseURL:
    """Parse ``url`` (None: the default); raise ConfigurationError naming what is wrong."""
    if url is None:
        url = default_url()
    if not isinstance(url, str):
        raise ConfigurationError(f"url must be a str, not {type(url).__name__}")
    safe = redact(url)
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
    except ValueError as exc:
        raise ConfigurationError(f"invalid database URL {safe!r}: {exc}") from None
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
