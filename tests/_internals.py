"""The one door from tests into a client's internals.

Tests that must reach the store behind a :class:`dblock.Client` (its contract operations, its
pool, a fault seam) go through :func:`store_of`, so that renaming the attribute in the core
is a one-line change here. :func:`store_call` runs one of the store's operations the way the
client itself would: directly for a blocking client, in a greenlet on the loop for the async
one (tests/_async_facade.py), whose store awaits its I/O.
"""

from __future__ import annotations

from typing import Any

import dblock


def store_of(client: dblock.Client) -> Any:
    """The store object behind ``client`` (a blocking client, or the async facade)."""
    return client._store


def store_call(client: dblock.Client, operation: str, *args: Any) -> Any:
    """``store_of(client).<operation>(*args)``, run as the client runs its store's code."""
    from tests._async_facade import Client as Facade

    method = getattr(store_of(client), operation)
    if isinstance(client, Facade):
        return client.run_green(method, *args)
    return method(*args)
