"""The contract suite's provider of the ZooKeeper store (collected by tests/providers.py)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from tests._servers import ZOOKEEPER_URL
from tests.stores._provider import Entry, check_server


def _private_zookeeper(root: Path) -> contextlib.AbstractContextManager[Any]:
    from tests._zk_ensemble import private_ensemble_process

    return private_ensemble_process(root)


PROVIDERS = (
    Entry(
        name="zookeeper",
        store="dblock.stores.zookeeper.store:ZookeeperStore",
        # no SQL, no file; the store is the shared server on 127.0.0.1:2181
        # restart: a private 3-server ensemble, SIGKILLed and started again as a whole
        markers=frozenset({"url", "processes", "cli", "restart", "demo"}),
        dialect="zookeeper",
        url=lambda _tmp: ZOOKEEPER_URL,
        default_port=2181,
        check=check_server("zookeeper"),
        private=_private_zookeeper,
    ),
)
