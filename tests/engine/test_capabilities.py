"""A store that declares only the required operations: a plain lock still works (polling,
no queue), and what needs a capability it lacks fails at once, naming the store and the
capability, before any operation runs."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import dblock
from dblock._contract import Store, capabilities
from tests.contract._memory_store import MemoryStore, Tables


class BareStore(Store):
    """The memory store's required operations only: no queue, no wake-ups, no shared holds,
    no once-records."""

    name = "bare"
    safe_url = "bare://"

    def __init__(self, tables: Tables) -> None:
        self._inner = MemoryStore(tables, "locks")
        self.table = "locks"
        self.calls: list[str] = []

    def _call(self, name: str, *args: Any) -> Any:
        self.calls.append(name)
        return getattr(self._inner, name)(*args)

    def ensure_schema(self, create: bool) -> None:
        self._call("ensure_schema", create)

    def acquire(self, key: str, owner: str, ttl: float, kind: str) -> int | None:
        return self._call("acquire", key, owner, ttl, kind)  # type: ignore[no-any-return]

    def renew(self, key: str, owner: str, token: int, ttl: float) -> bool:
        return self._call("renew", key, owner, token, ttl)  # type: ignore[no-any-return]

    def release(self, key: str, owner: str, token: int) -> bool:
        return self._call("release", key, owner, token)  # type: ignore[no-any-return]

    def info(self, key: str) -> dblock.LockInfo | None:
        return self._call("info", key)  # type: ignore[no-any-return]

    def list_holds(self, prefix: str) -> list[dblock.LockInfo]:
        return self._call("list_holds", prefix)  # type: ignore[no-any-return]

    def force_release(self, key: str) -> bool:
        return self._call("force_release", key)  # type: ignore[no-any-return]

    def purge(self, older_than: float, include_once: bool) -> int:
        return self._call("purge", older_than, include_once)  # type: ignore[no-any-return]

    def close(self) -> None:
        pass


def _client(tables: Tables) -> tuple[dblock.Client, BareStore]:
    store = BareStore(tables)
    store.ensure_schema(True)
    return dblock.Client(store), store


def test_a_bare_store_declares_nothing_and_serves_plain_locks_by_polling() -> None:
    tables = Tables()
    client, store = _client(tables)
    other, _ = _client(tables)
    assert capabilities(store) == frozenset()
    holder = client.lock("k", ttl=30)
    assert holder.acquire()
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(other.lock("k").acquire(timeout=5)))
    waiter.start()
    threading.Event().wait(0.2)
    holder.release()
    waiter.join(10)
    assert got == [True]
    assert set(store.calls) <= {"ensure_schema", "acquire", "release"}


@pytest.mark.parametrize(
    ("use", "capability"),
    [
        (lambda c: c.rwlock("k"), "SharedHolds"),
        (lambda c: c.semaphore("k", 2), "SharedHolds"),
        (lambda c: c.once("k"), "OnceRecords"),
        (lambda c: c.state("k"), "OnceRecords"),
        (lambda c: c.scheduled("job", at_most=10), "ScheduledRuns"),
    ],
)
def test_what_needs_a_missing_capability_names_the_store_and_the_capability(
    use: Any, capability: str
) -> None:
    client, store = _client(Tables())
    with pytest.raises(dblock.ConfigurationError, match=f"{capability}.*bare store"):
        use(client)
    assert store.calls == ["ensure_schema"], "nothing ran before the refusal"
