"""A client the application already holds, in place of a URL (docs/configuration.md, "A
client you already have"): the store whose registry entry names the client's class (its
``clients``) borrows it, by the function its entry names (``borrow``, in the store package's
``borrowed.py``): a ``redis.Redis``, a kazoo ``KazooClient``, a psycopg_pool ``ConnectionPool``
(``AsyncConnectionPool`` for ``connect_async``).

dblock runs its statements on the client's pool, borrowing one connection per operation and
giving it back, and never closes the client or its pool. Connections that must outlive one
operation are dblock's own, opened with the client's connection parameters: PostgreSQL's LISTEN
and session-lock connections, Redis's pub/sub connections. What dblock requires of a session
is pinned on each borrowed connection and restored before it goes back (PostgreSQL: autocommit,
tuple rows, ``synchronous_commit=on``), or read whatever way the client reads (Redis: replies
are decoded by dblock when the client does not decode them). A KazooClient is dblock's session:
it must be started, and its ACLs (``default_acl``) and credentials are the ones its nodes get.

The types are recognised by their module and class name, so that ``import dblock`` loads no
driver; anything else is refused with a TypeError naming what is accepted.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, cast

from ._registry import entries

if TYPE_CHECKING:
    from .._contract import Store
    from .._runtime import Runtime


def accepted() -> str:
    """What ``connect`` takes in place of a URL, for messages: the clients each store's
    registry entry names."""
    clients = [e.client_help for e in entries() if e.client_help]
    taken = ["a URL (str)", "a list of URLs (a quorum)"]
    taken += ["a SQLAlchemy Engine (AsyncEngine for connect_async)", *clients]
    return ", ".join(taken[:-1]) + f", or {taken[-1]}"


def _names(candidate: object) -> set[str]:
    return {f"{c.__module__}.{c.__qualname__}" for c in type(candidate).__mro__}


def refused(candidate: object) -> TypeError:
    """The TypeError for an object that is neither a URL nor a client dblock takes."""
    kind = type(candidate)
    return TypeError(f"dblock takes {accepted()}, not {kind.__module__}.{kind.__qualname__}")


def client_store(
    client: Any,
    schema: str | None,
    table: str,
    max_connections: int | None,
    runtime: Runtime | None,
) -> Store:
    """The store on ``client`` (borrowed, never closed by dblock); ``runtime``: the async
    client's."""
    names = _names(client)
    for entry in entries():
        for name, why in entry.client_refusals:
            if name in names:
                raise TypeError(f"{why}; dblock takes {accepted()}")
    for entry in entries():
        if entry.borrow is not None and names.intersection(entry.clients):
            module_name, _, function = entry.borrow.partition(":")
            borrow = getattr(importlib.import_module(module_name), function)
            return cast("Store", borrow(client, schema, table, max_connections, runtime))
    raise refused(client)


__all__ = ["accepted", "client_store", "refused"]
