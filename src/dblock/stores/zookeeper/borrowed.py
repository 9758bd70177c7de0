"""A started KazooClient the application holds, in place of a URL (docs/configuration.md, "A
client you already have"): its session is dblock's, its ACLs and credentials the nodes'; dblock
never stops or closes it."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, cast

from ..._errors import ConfigurationError
from ..._url import redact
from .._lending import opened
from . import ENTRY

if TYPE_CHECKING:
    from ..._contract import Store
    from ..._runtime import Runtime


def borrow(
    client: Any, schema: str | None, table: str, asked: int | None, runtime: Runtime | None
) -> Store:
    from .store import ZookeeperStore

    if not client.connected:
        raise ConfigurationError(
            "the KazooClient is not connected: start() it before dblock.connect(client)"
        )
    hosts = ",".join(f"{h}:{p}" for h, p in client.hosts)
    raw = f"zookeeper://{hosts}"
    url = ENTRY.parse(raw, ENTRY.name, redact(raw))
    store = opened(KazooLending, ZookeeperStore, url, schema, table, runtime=runtime)
    store.borrow(client)
    return cast("Store", store)


class KazooLending:
    """The application's started KazooClient as dblock's session: never stopped or closed
    by dblock (its holds end with that session, or when released)."""

    _lock: Any
    _closed: bool
    _zk: Any
    safe_url: str

    def borrow(self, client: Any) -> None:
        self._borrowed = client
        if client.chroot:  # kazoo adds it to every path: shown, not added again
            self.safe_url += client.chroot

    def _client(self) -> Any:
        from ..._errors import BackendError

        with self._lock:
            if self._closed:
                raise BackendError(f"the ZooKeeper client of {self.safe_url} is closed")
            if self._zk is None:
                self._zk = self._borrowed
                self._zk.add_listener(self._state_changed)  # type: ignore[attr-defined]
            return self._zk

    def close(self) -> None:
        with self._lock:
            self._closed = True
            zk, self._zk = self._zk, None
        if zk is not None:
            with contextlib.suppress(Exception):
                zk.remove_listener(self._state_changed)  # type: ignore[attr-defined]
