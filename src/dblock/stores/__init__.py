"""The stores, one package each (``sqlite``, ``postgresql``, ``mysql``, ``redis``,
``zookeeper``, ``etcd``, ``quorum``), and what they share (``_pool``, ``_watchdog``,
``_listener``, ``_sessions``, ``_sql_holders``, ``_schema``, ``_names``). The registry
(``_registry``) finds a URL's store; its driver is imported only when its URL is opened."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._contract import (
    CAPABILITIES,
    SchemaScript,
    Store,
    Subscription,
    capabilities,
    lacking,
    provides,
)
from .._errors import ConfigurationError
from ._registry import entries, entry, parse_url

if TYPE_CHECKING:
    from .._runtime import Runtime
    from .._url import DatabaseURL


def is_engine(candidate: object) -> bool:
    """True for a SQLAlchemy object (an Engine, an AsyncEngine), without importing SQLAlchemy."""
    return type(candidate).__module__.startswith("sqlalchemy.")


def open_url(
    url: DatabaseURL, schema: str | None, table: str, runtime: Runtime | None = None
) -> Store:
    """Instantiate the store for ``url``; name the extra to install if its driver is missing.

    ``runtime``: the async client's (its connections are the driver's asyncio ones)."""
    store = entry(url.dialect).open(url, schema, table)
    if runtime is not None:
        try:
            store.use_runtime(runtime)
        except BaseException:
            store.close()
            raise
    return store


__all__ = [
    "CAPABILITIES",
    "Store",
    "Subscription",
    "capabilities",
    "ddl_for",
    "is_engine",
    "open_url",
    "parse_url",
    "schema_script",
]


def ddl_for(dialect: str, table: str = "dblock_locks") -> list[str]:
    """The DDL that ``connect(create_schema=True)`` runs for ``dialect``, without connecting."""
    return _schema_store(dialect, table).ddl()


def schema_script(dialect: str, table: str = "dblock_locks") -> str:
    """``ddl_for`` as a script for the dialect's command-line client."""
    return _schema_store(dialect, table).script()


def _schema_store(dialect: str, table: str) -> SchemaScript:
    from .._validate import check_table

    placeholder = {e.name: e.ddl_url for e in entries() if e.ddl_url is not None}
    if dialect not in placeholder:
        raise ConfigurationError(f"unknown dialect {dialect!r}: use {', '.join(placeholder)}")
    schema, name = check_table(table)
    store = open_url(parse_url(placeholder[dialect]), schema, name)
    if not provides(store, SchemaScript):
        raise lacking(store, SchemaScript, "dblock schema")
    return store
