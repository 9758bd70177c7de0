"""The etcd store: one transaction per decision, leases, revision tokens, watches, on
etcd-sdk-python (gRPC).

``store.py`` is the store, ``rpc.py`` its client and calls, ``watch.py`` its wake-ups. This
module holds only the registry's entry (no driver is imported here)."""

from __future__ import annotations

from ..._url import endpoints_url
from .._entry import StoreEntry

ENTRY = StoreEntry(
    name="etcd",
    title="etcd",
    schemes=("etcd", "etcd+https"),
    usage="etcd://host:port[,host:port...]",
    store="dblock.stores.etcd.store:EtcdStore",
    parse=endpoints_url,
    extra="etcd",
    drivers=("pyetcd", "grpc", "google.protobuf"),
)
