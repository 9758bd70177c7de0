"""etcd URLs: endpoints, TLS and credentials, what is refused, the password never shown."""

from __future__ import annotations

import subprocess
import sys

import pytest

import dblock
from dblock.stores.etcd.rpc import endpoints, options
from dblock.tools import parse_url

SECRET = "Pw9-etcd-s3cr3t"  # noqa: S105 - must never show up


def test_endpoints_are_parsed_in_order() -> None:
    url = parse_url("etcd://10.0.0.1:2379,node-b:2380,[::1]:2381,node-c")
    assert endpoints(url) == [("10.0.0.1", 2379), ("node-b", 2380), ("::1", 2381), ("node-c", 2379)]


def test_credentials_and_tls_options() -> None:
    url = parse_url(
        f"etcd+https://root:{SECRET}@h1:2379,h2:2379?ca_cert=/ca.pem&cert_key=/k.pem"
        "&cert_cert=/c.pem&connect_timeout=2"
    )
    opts = options(url)
    assert opts["tls"] and opts["user"] == "root" and opts["password"] == SECRET
    assert (opts["ca_cert"], opts["cert_key"], opts["cert_cert"]) == ("/ca.pem", "/k.pem", "/c.pem")
    assert opts["timeout"] == 2
    assert SECRET not in url.safe


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("etcd://h1:port", "bad endpoint"),
        ("etcd://h1:2379,:2379", "bad endpoint"),
        ("etcd://h1:99999", "bad endpoint"),
        ("etcd://h1:2379/db", "takes no path"),
        ("etcd://h1:2379?ca_cert=/ca.pem", "etcd\\+https://"),
        ("etcd://h1:2379?pool=3", "unknown etcd URL parameter"),
        ("etcd+https://h1:2379", "needs ca_cert"),
        ("etcd+https://h1:2379?ca_cert=/ca.pem&cert_key=/k.pem", "both cert_key and cert_cert"),
        ("etcd://user@h1:2379", "both a user and a password"),
        ("etcd://h1:2379?connect_timeout=nan", "connect_timeout"),
    ],
)
def test_bad_url_parts_are_named(url: str, says: str) -> None:
    with pytest.raises(dblock.ConfigurationError, match=says):
        dblock.connect(url)


def test_an_unreachable_cluster_is_a_backend_error_without_the_password() -> None:
    url = f"etcd://root:{SECRET}@127.0.0.1:1?connect_timeout=0.5"
    with pytest.raises((dblock.BackendError, dblock.ConfigurationError)) as caught:
        dblock.connect(url)
    assert SECRET not in str(caught.value)


def test_import_dblock_loads_no_etcd_driver() -> None:
    code = (
        "import dblock, sys; print(any(m.split('.')[0] in ('pyetcd', 'grpc') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
