"""The process's one dblock client for Django: created on first use, closed at exit.

Created lazily (not when the app loads) so that ``manage.py`` commands that never lock open no
connection, and a test run connects to the test database Django set up. It does not create
tables: the app's migration does (``manage.py migrate dblock``). A forked worker (gunicorn
``--preload``, Celery prefork) keeps using it: dblock clients are fork-safe.
"""

from __future__ import annotations

import atexit
import os
import threading

import dblock
from dblock.tools import MissingTable

from .config import ImproperlyConfigured, target

_client: dblock.Client | None = None
_guard = threading.Lock()


def _new_guard_in_child() -> None:
    # a fork while another thread held the guard would leave the child's copy locked forever
    global _guard  # noqa: PLW0603 - the one place the guard is replaced
    _guard = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_guard_in_child)


def get_client() -> dblock.Client:
    """The dblock client on the database ``settings.DBLOCK`` names (default: ``default``)."""
    global _client  # noqa: PLW0603 - the process's one client
    with _guard:
        if _client is None:
            _client = _connect()
        return _client


def close_client() -> None:
    """Close the client (if one was made); the next ``get_client()`` makes a new one."""
    global _client
    with _guard:
        client, _client = _client, None
    if client is not None:
        client.close()


def _connect() -> dblock.Client:
    where = target()
    try:
        return dblock.connect(
            where.url,
            table=where.table,
            create_schema=False,
            max_connections=where.max_connections,
        )
    except MissingTable:
        raise ImproperlyConfigured(
            f"the lock table {where.table} does not exist in DATABASES[{where.alias!r}]: run "
            f"`python manage.py migrate dblock --database {where.alias}`"
        ) from None


atexit.register(close_client)

__all__ = ["close_client", "get_client"]
