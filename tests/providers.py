"""The stores the contract suite (tests/contract) runs against: every store's provider.

Each store's provider lives in its own test folder, ``tests/stores/<name>/provider.py`` (a
``PROVIDERS`` tuple of ``Entry``; its store capabilities are read from its class, its harness
ones declared there); what a provider is, and every capability a test may ask for, is in
tests/stores/_provider.py. This module collects them, in the registry's order of the stores
(``dblock.stores._registry.BUILT_IN``), then the other folders with a provider (the quorums),
then the tests' own in-memory store; and keeps the names the tests import from it.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from dblock.stores._registry import BUILT_IN
from tests.contract._memory_provider import PROVIDERS as _MEMORY
from tests.stores._provider import (
    CLIENT_MODES,
    HARNESS_CAPABILITIES,
    STORE_CAPABILITIES,
    Entry,
    Provider,
    bind,
    fresh_table,
    quorum_members,
    store_capabilities,
    table_of,
)
from tests.stores.quorum.provider import QUORUM_PG_DATABASES, quorum_pg_check, redis_trio

__all__ = [
    "CLIENT_MODES",
    "HARNESS_CAPABILITIES",
    "PROVIDERS",
    "QUORUM_PG_DATABASES",
    "STORE_CAPABILITIES",
    "Entry",
    "Provider",
    "bind",
    "fresh_table",
    "provider_folders",
    "quorum_members",
    "quorum_pg_check",
    "redis_trio",
    "store_capabilities",
    "table_of",
]


def provider_folders() -> list[str]:
    """The folders of tests/stores/ that hold a provider.py, the registry's stores first."""
    found = sorted(p.parent.name for p in (Path(__file__).parent / "stores").glob("*/provider.py"))
    registered = [e.name for e in BUILT_IN if e.name in found]
    return registered + [name for name in found if name not in registered]


def _collect() -> tuple[Entry, ...]:
    entries: list[Entry] = []
    for folder in provider_folders():
        entries.extend(importlib.import_module(f"tests.stores.{folder}.provider").PROVIDERS)
    return (*entries, *_MEMORY)


PROVIDERS: tuple[Entry, ...] = _collect()
