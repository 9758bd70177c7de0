"""The one door from tests into a client's internals.

Tests that must reach the store behind a :class:`dblock.Client` (its contract operations, its
pool, a fault seam) go through :func:`store_of`, so that renaming the attribute in the core
is a one-line change here.
"""

from __future__ import annotations

from typing import Any

import dblock


def store_of(client: dblock.Client) -> Any:
    """The store object behind ``client``."""
    return client._store
