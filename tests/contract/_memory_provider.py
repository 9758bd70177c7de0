"""The contract suite's provider of the tests' own in-memory store (tests/contract/
_memory_store.py; collected by tests/providers.py). It has no URL: a client is made on a
shared ``Tables``; none of the harness capabilities."""

from __future__ import annotations

import importlib.util
import threading
from typing import Any

import dblock
from tests.stores._provider import Entry


def _memory_unavailable() -> str | None:
    if importlib.util.find_spec("dblock._contract") is None:
        return (
            "the memory store implements the store contract (dblock._contract), "
            "which this dblock does not have yet"
        )
    return None


def _memory_client(state: dict[str, Any], table: str, kw: dict[str, Any]) -> dblock.Client:
    from tests.contract._memory_store import MemoryStore, Tables

    with _MEMORY_SETUP:
        tables = state.setdefault("tables", Tables())
    runtime = kw.pop("runtime", None)
    store = MemoryStore(tables, table, **kw)  # type: ignore[call-arg,arg-type]
    if runtime is None:
        return dblock.Client(store)
    store.use_runtime(runtime)
    return dblock.Client(store, runtime)


_MEMORY_SETUP = threading.Lock()

PROVIDERS = (
    Entry(
        name="memory",
        store="tests.contract._memory_store:MemoryStore",
        markers=frozenset(),
        dialect=None,
        url=lambda _tmp: None,
        make_client=_memory_client,
        unavailable=_memory_unavailable,
    ),
)
