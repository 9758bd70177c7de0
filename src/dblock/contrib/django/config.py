"""Django's ``DATABASES`` entry -> a dblock URL, so the database is configured once.

``settings.DBLOCK`` (optional) picks the entry and the table::

    DBLOCK = {"DATABASE": "default", "TABLE": "dblock_locks", "MAX_CONNECTIONS": None}

The URL is built from the connection's settings (``NAME``, ``USER``, ``PASSWORD``, ``HOST``,
``PORT``, ``OPTIONS``) as Django resolved them, so a test run uses the test database. It holds
the password: it is handed to ``dblock.connect`` only, never shown (messages use
``dblock.tools.redact``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import quote, urlencode

from django.conf import settings
from django.core import exceptions
from django.db import connections

import dblock
from dblock.tools import check_table

DEFAULTS: Final[dict[str, Any]] = {
    "DATABASE": "default",
    "TABLE": "dblock_locks",
    "MAX_CONNECTIONS": None,
}

#: Django ``OPTIONS`` that tune Django's own session (dblock sets up its connections itself)
_IGNORED: Final[dict[str, frozenset[str]]] = {
    "postgresql": frozenset({"isolation_level", "server_side_binding", "pool", "cursor_factory"}),
    "mysql": frozenset({"charset", "sql_mode", "isolation_level", "autocommit", "use_unicode"}),
    "sqlite": frozenset(
        {"init_command", "transaction_mode", "check_same_thread", "isolation_level"}
    ),
}
#: MySQL ``OPTIONS`` dblock's PyMySQL connections take as they are
_MYSQL_PASSED: Final = frozenset(
    {"unix_socket", "init_command", "connect_timeout", "read_timeout", "write_timeout"}
)
_SSL_FILES: Final = ("ca", "cert", "key")


class ImproperlyConfigured(exceptions.ImproperlyConfigured, dblock.ConfigurationError):
    """A setting dblock cannot use: Django's error, and dblock's ``ConfigurationError``."""


@dataclass(frozen=True)
class Target:
    """Where the locks live: the ``DATABASES`` alias, its dblock URL and the lock table."""

    alias: str
    url: str = field(repr=False)  # it holds the password
    table: str
    max_connections: int | None


def dblock_settings() -> dict[str, Any]:
    """``settings.DBLOCK`` over the defaults; unknown names are an error, not a silent no-op."""
    given = getattr(settings, "DBLOCK", None) or {}
    if not isinstance(given, Mapping):
        raise ImproperlyConfigured("settings.DBLOCK must be a dict, e.g. {'DATABASE': 'default'}")
    unknown = set(given) - set(DEFAULTS)
    if unknown:
        raise ImproperlyConfigured(
            f"settings.DBLOCK has unknown name(s) {sorted(unknown)}; known: {sorted(DEFAULTS)}"
        )
    merged = {**DEFAULTS, **given}
    try:
        check_table(merged["TABLE"])
    except dblock.ConfigurationError as exc:
        raise ImproperlyConfigured(f"settings.DBLOCK['TABLE']: {exc}") from None
    return merged


def target() -> Target:
    """The configured database as a dblock URL; ImproperlyConfigured for what dblock cannot use."""
    options = dblock_settings()
    alias = options["DATABASE"]
    if alias not in settings.DATABASES:
        raise ImproperlyConfigured(
            f"settings.DBLOCK['DATABASE'] is {alias!r}, which settings.DATABASES does not have"
        )
    connection = connections[alias]
    url = database_url(alias, connection.vendor, connection.settings_dict)
    return Target(alias, url, options["TABLE"], options["MAX_CONNECTIONS"])


def database_url(alias: str, vendor: str, db: Mapping[str, Any]) -> str:
    """The dblock URL of one resolved ``DATABASES`` entry of Django vendor ``vendor``."""
    if vendor == "sqlite":
        return _sqlite_url(alias, db)
    if vendor == "postgresql":
        return _server_url("postgresql", alias, db, _postgres_query(alias, db))
    if vendor == "mysql":
        return _server_url("mysql", alias, db, _mysql_query(alias, db))
    raise ImproperlyConfigured(
        f"DATABASES[{alias!r}] uses ENGINE {db.get('ENGINE')!r} ({vendor}): dblock keeps locks "
        "on PostgreSQL, MySQL/MariaDB or SQLite; point settings.DBLOCK['DATABASE'] at one of "
        "those"
    )


def _sqlite_url(alias: str, db: Mapping[str, Any]) -> str:
    name = os.fspath(db.get("NAME") or "")
    if not name or name == ":memory:" or name.startswith("file:") or "mode=memory" in name:
        raise ImproperlyConfigured(
            f"DATABASES[{alias!r}] is an in-memory or URI SQLite database ({name!r}): other "
            "processes cannot see locks kept there; give NAME (and TEST['NAME'] for tests) "
            "a file path"
        )
    _check_options(alias, "sqlite", db, frozenset({"timeout"}))
    query = {"timeout": str(db["OPTIONS"]["timeout"])} if "timeout" in db.get("OPTIONS", {}) else {}
    return "sqlite:///" + quote(os.path.abspath(name)) + _query(query)


def _postgres_query(alias: str, db: Mapping[str, Any]) -> dict[str, str]:
    if "assume_role" in db.get("OPTIONS", {}):
        raise ImproperlyConfigured(
            f"DATABASES[{alias!r}]['OPTIONS']['assume_role']: dblock's connections cannot "
            "SET ROLE; grant the lock tables to USER, or use another DATABASES entry"
        )
    # everything else is a libpq parameter (sslmode, connect_timeout, service, ...)
    ignored = _IGNORED["postgresql"]
    query = {k: str(v) for k, v in db.get("OPTIONS", {}).items() if k not in ignored}
    host = str(db.get("HOST") or "")
    if host.startswith("/"):  # a Unix socket directory: libpq's host parameter
        query["host"] = host
    return query


def _mysql_query(alias: str, db: Mapping[str, Any]) -> dict[str, str]:
    options = dict(db.get("OPTIONS", {}))
    ssl = options.pop("ssl", None) or {}
    if not isinstance(ssl, Mapping) or set(ssl) - set(_SSL_FILES):
        raise ImproperlyConfigured(
            f"DATABASES[{alias!r}]['OPTIONS']['ssl']: dblock takes only the files "
            f"{list(_SSL_FILES)} of it"
        )
    _check_options(alias, "mysql", {"OPTIONS": options}, _MYSQL_PASSED)
    query = {k: str(v) for k, v in options.items() if k in _MYSQL_PASSED}
    query.update({f"ssl_{k}": str(v) for k, v in ssl.items()})
    host = str(db.get("HOST") or "")
    if host.startswith("/"):  # Django's way to name the socket
        query["unix_socket"] = host
    return query


def _check_options(alias: str, vendor: str, db: Mapping[str, Any], passed: frozenset[str]) -> None:
    unknown = set(db.get("OPTIONS", {})) - passed - _IGNORED[vendor]
    if unknown:
        raise ImproperlyConfigured(
            f"DATABASES[{alias!r}]['OPTIONS'] has {sorted(unknown)}, which dblock cannot pass "
            f"to its own {vendor} connections; it takes {sorted(passed)} (and ignores "
            f"{sorted(_IGNORED[vendor])}, which tune Django's session)"
        )


def _server_url(scheme: str, alias: str, db: Mapping[str, Any], query: dict[str, str]) -> str:
    name = str(db.get("NAME") or "")
    if not name:
        raise ImproperlyConfigured(f"DATABASES[{alias!r}] names no database (NAME)")
    user = quote(str(db.get("USER") or ""), safe="")
    password = str(db.get("PASSWORD") or "")
    credentials = f"{user}:{quote(password, safe='')}@" if password else ""
    credentials = credentials or (f"{user}@" if user else "")
    host = str(db.get("HOST") or "")
    host = "" if host.startswith("/") else (f"[{host}]" if ":" in host else host)
    port = f":{db['PORT']}" if db.get("PORT") else ""
    return f"{scheme}://{credentials}{host}{port}/{quote(name, safe='')}{_query(query)}"


def _query(query: Mapping[str, str]) -> str:
    return "?" + urlencode(query) if query else ""


__all__ = ["DEFAULTS", "ImproperlyConfigured", "Target", "database_url", "target"]
