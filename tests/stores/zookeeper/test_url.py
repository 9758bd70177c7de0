"""ZooKeeper URLs: servers, chroot, parameters; the driver loads only when used."""

from __future__ import annotations

import subprocess
import sys

import pytest

import dblock
from dblock.tools import parse_url


def test_servers_and_chroot() -> None:
    url = parse_url("zookeeper://a:2181,b:2182,c/app/locks?session_timeout=5")
    assert url.dialect == "zookeeper"
    assert url.host == "a:2181,b:2182,c"
    assert url.database == "app/locks"
    assert url.query == {"session_timeout": "5"}
    assert parse_url("zk://127.0.0.1:2181").dialect == "zookeeper"
    assert parse_url("zk://127.0.0.1:2181").database == ""


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("zookeeper://", "names no server"),
        ("zookeeper://a:x", "host:port"),
        ("zookeeper://a:2181,:2182", "host:port"),
        ("zookeeper://a:99999", "host:port"),
        ("zookeeper://u:pa/ss@a:2181", "percent-encode"),  # a "/" ends the servers early
        ("zookeeper://a:2181/x/../y", "chroot"),
        ("zookeeper://a:2181/zookeeper", "chroot"),
        ("zookeeper://a:2181/a//b", "chroot"),
    ],
)
def test_bad_urls_are_configuration_errors(url: str, says: str) -> None:
    with pytest.raises(dblock.ConfigurationError, match=says):
        dblock.connect(url)


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("session_timeout=0", "session_timeout"),
        ("session_timeout=nan", "session_timeout"),
        ("connect_timeout=-1", "connect_timeout"),
        ("sessiontimeout=5", "unknown ZooKeeper URL parameter"),
    ],
)
def test_bad_parameters_are_named(query: str, says: str) -> None:
    with pytest.raises(dblock.ConfigurationError, match=says):
        dblock.connect(f"zookeeper://127.0.0.1:2181/x?{query}")


def test_chroot_keeps_tables_apart(url: str, table: str) -> None:
    from tests._servers import drop_tables

    other = url.rstrip("/") + "_other"
    with dblock.connect(url, table=table) as a, dblock.connect(other, table=table) as b:
        try:
            assert a.lock("k").acquire(blocking=False)
            assert b.lock("k").acquire(blocking=False)  # another chroot: another lock
            assert [i.key for i in a.list()] == ["k"]
        finally:
            drop_tables(other, table)


def test_odd_keys_round_trip(url: str, table: str) -> None:
    keys = [".", "..", "a/b", "zookeeper", "%2E", "ü ∂ 🙂", "x" * 255]
    with dblock.connect(url, table=table) as client:
        for key in keys:
            assert client.lock(key).acquire(blocking=False)
        assert [i.key for i in client.list()] == sorted(keys)


def test_unreachable_server_is_a_backend_error() -> None:
    with pytest.raises(dblock.BackendError):
        dblock.connect("zookeeper://127.0.0.1:1/x?connect_timeout=0.5")


def test_import_dblock_loads_no_driver() -> None:
    code = "import sys, dblock; assert 'kazoo' not in sys.modules, 'kazoo loaded'"
    subprocess.run([sys.executable, "-c", code], check=True)
