"""The ZooKeeper store: sequential nodes, watches, on kazoo.

``store.py`` is the store, ``handler.py`` the handler that runs kazoo's callbacks. This
module holds only the registry's entry (no driver is imported here)."""

from __future__ import annotations

from dataclasses import replace
from urllib.parse import unquote, urlsplit

from ..._errors import ConfigurationError
from ..._url import DatabaseURL, endpoints_url
from .._entry import StoreEntry


def parse(url: str, dialect: str, safe: str) -> DatabaseURL:
    """``zookeeper://[user:password@]host:port[,host:port...]/chroot``: ``host`` keeps the
    whole server list (urllib cannot parse a list of ports), ``database`` the chroot without
    its slashes."""
    parts = urlsplit(url)
    hosts = parts.netloc.rpartition("@")[2]
    servers = hosts.split(",") if hosts else []
    for server in servers:
        host, _, port = server.rpartition(":") if ":" in server else (server, "", "2181")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            # quoted only if the redacted URL shows it too: a password holding a '/' ends
            # the netloc early, and part of it would be read as a server
            shown = f", not {server!r}" if server in safe else ""
            raise ConfigurationError(
                f"invalid ZooKeeper URL {safe!r}: name its servers as host:port[,host:port...]"
                f"{shown}; percent-encode '/', '?', '#' and '@' in a password"
            )
    if not servers:
        raise ConfigurationError(f"invalid ZooKeeper URL {safe!r}: it names no server")
    chroot = unquote(parts.path).strip("/")
    if any(not p or p in (".", "..") or p == "zookeeper" for p in chroot.split("/") if chroot):
        raise ConfigurationError(
            f"invalid ZooKeeper URL {safe!r}: the chroot {chroot!r} must be a path of non-empty "
            "names, none of them '.', '..' or 'zookeeper'"
        )
    return replace(endpoints_url(url, dialect, safe), database=chroot)


ENTRY = StoreEntry(
    name="zookeeper",
    title="ZooKeeper",
    schemes=("zookeeper", "zk", "zookeepers"),
    usage="zookeeper://[user:password@]host:port[,host:port...]/chroot",
    store="dblock.stores.zookeeper.store:ZookeeperStore",
    parse=parse,
    extra="zookeeper",
    clients=("kazoo.client.KazooClient",),
    borrow="dblock.stores.zookeeper.borrowed:borrow",
    client_help="a kazoo.client.KazooClient",
    drivers=("kazoo",),
)
