"""Backends by URL scheme. Drivers are imported only when their URL is used."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .._errors import ConfigurationError
from ._contract import CAPABILITIES, SchemaScript, Store, Subscription, capabilities, lacking

if TYPE_CHECKING:
    from .._runtime import Runtime
    from .._url import DatabaseURL

# dialect -> (module, class, the extra that installs its driver)
BACKENDS: dict[str, tuple[str, str, str | None]] = {
    "sqlite": ("dblock.backends.sqlite", "SqliteBackend", None),
    "postgresql": ("dblock.backends.postgresql", "PostgresBackend", "postgresql"),
    "mysql": ("dblock.backends.mysql", "MysqlBackend", "mysql"),
    "redis": ("dblock.backends.redis", "RedisBackend", "redis"),
    "zookeeper": ("dblock.backends.zookeeper", "ZookeeperBackend", "zookeeper"),
    "etcd": ("dblock.backends.etcd", "EtcdBackend", "etcd"),
}


def is_engine(candidate: object) -> bool:
    """True for a SQLAlchemy object (an Engine, an AsyncEngine), without importing SQLAlchemy."""
    return type(candidate).__module__.startswith("sqlalchemy.")


def open_backend(
    url: DatabaseURL, schema: str | None, table: str, runtime: Runtime | None = None
) -> Store:
    """Instantiate the backend for ``url``; name the extra to install if its driver is missing.

    ``runtime``: the async client's (its connections are the driver's asyncio ones)."""
    module_name, class_name, extra = BACKENDS[url.dialect]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(
            f"the {url.dialect} backend needs its driver ({exc.name}): "
            f"pip install 'dblock[{extra}]'"
        ) from exc
    store: Store = getattr(module, class_name)(url, schema, table)
    if runtime is not None:
        if not store.serves_async:
            store.close()
            raise ConfigurationError(
                f"the {store.name} store does not serve the async client yet: use "
                "dblock.connect(...) (its calls in a worker thread, e.g. asyncio.to_thread)"
            )
        store.rt = runtime
    return store


__all__ = [
    "BACKENDS",
    "CAPABILITIES",
    "Store",
    "Subscription",
    "capabilities",
    "ddl_for",
    "is_engine",
    "open_backend",
    "schema_script",
]


def ddl_for(dialect: str, table: str = "dblock_locks") -> list[str]:
    """The DDL that ``connect(create_schema=True)`` runs for ``dialect``, without connecting."""
    return _schema_store(dialect, table).ddl()


def schema_script(dialect: str, table: str = "dblock_locks") -> str:
    """``ddl_for`` as a script for the dialect's command-line client."""
    return _schema_store(dialect, table).script()


def _schema_store(dialect: str, table: str) -> SchemaScript:
    from .._url import parse_url
    from .._validate import check_table

    placeholder = {
        "sqlite": "sqlite:///dblock.sqlite3",
        "postgresql": "postgresql://localhost/db",
        "mysql": "mysql://localhost/db",
    }
    if dialect not in placeholder:
        raise ConfigurationError(f"unknown dialect {dialect!r}: use {', '.join(placeholder)}")
    schema, name = check_table(table)
    store = open_backend(parse_url(placeholder[dialect]), schema, name)
    if not isinstance(store, SchemaScript):
        raise lacking(store, SchemaScript, "dblock schema")
    return store
