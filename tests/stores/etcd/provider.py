"""The contract suite's provider of the etcd store (collected by tests/providers.py)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from tests._servers import ETCD_URL
from tests.stores._provider import Entry, check_server


def _private_etcd(root: Path) -> contextlib.AbstractContextManager[Any]:
    from tests.stores.etcd._cluster import private_member

    return private_member(root)


PROVIDERS = (
    Entry(
        name="etcd",
        store="dblock.stores.etcd.store:EtcdStore",
        # no SQL, no file; leases are the cluster's (whole seconds); what a test may kill is
        # one node of a private 3-node cluster (tests/stores/etcd), never this shared node
        # no LossPush: a watch stream open while holding breaks gRPC in a forked child
        markers=frozenset({"url", "processes", "cli", "durable", "restart", "demo"}),
        dialect="etcd",
        url=lambda _tmp: ETCD_URL,
        default_port=2379,
        check=check_server("etcd"),
        private=_private_etcd,
        exact_ttl=False,
    ),
)
