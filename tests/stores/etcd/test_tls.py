"""``etcd+https://``: the store on a private one-node etcd that serves its clients over TLS
only (a self-signed certificate for 127.0.0.1, made with openssl)."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

import dblock
from tests._private_servers import _self_signed, free_ports
from tests.stores.etcd._cluster import TIMING, Node, etcd_binary


@pytest.fixture(scope="module")
def tls_node() -> Iterator[tuple[int, Path]]:
    """(client port, CA certificate) of a private etcd node that speaks TLS to clients."""
    binary = etcd_binary()
    root = Path(tempfile.mkdtemp(prefix="dblock-etcd-tls-"))
    key, cert = _self_signed(root)
    client, peer = free_ports(2)
    command = [
        binary,
        "--name", "tls",
        "--data-dir", str(root / "data"),
        "--listen-client-urls", f"https://127.0.0.1:{client}",
        "--advertise-client-urls", f"https://127.0.0.1:{client}",
        "--listen-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-cluster", f"tls=http://127.0.0.1:{peer}",
        "--cert-file", str(cert),
        "--key-file", str(key),
        *TIMING,
    ]  # fmt: skip
    node = Node("tls", command, root / "etcd.log", client)
    node.start()
    try:
        deadline = time.monotonic() + 30
        while True:  # up once a TLS client gets an answer
            try:
                with dblock.connect(_url(client, cert), table="t_probe") as probe:
                    probe.list()
                break
            except dblock.BackendError:
                if time.monotonic() > deadline or not node.alive:
                    pytest.fail("the TLS etcd node did not come up: " + node.log.read_text())
                time.sleep(0.2)
        yield client, cert
    finally:
        node.kill()
        shutil.rmtree(root, ignore_errors=True)


def _url(port: int, ca: Path) -> str:
    return f"etcd+https://127.0.0.1:{port}?ca_cert={quote(str(ca))}"


def test_locks_over_tls(tls_node: tuple[int, Path]) -> None:
    port, ca = tls_node
    with (
        dblock.connect(_url(port, ca), table="t_tls") as client,
        dblock.connect(_url(port, ca), table="t_tls") as other,
    ):
        with client.lock("k", ttl=5) as lock:
            first = lock.token
            assert first is not None
            info = other.info("k")
            assert info is not None and info.token == first
            assert not other.lock("k", ttl=5).acquire(blocking=False)
        with other.lock("k", ttl=5) as second:
            assert second.token is not None and second.token > first


def test_a_certificate_the_ca_did_not_sign_is_refused(
    tls_node: tuple[int, Path], tmp_path: Path
) -> None:
    """Checked against another CA, the node's certificate is refused: a BackendError, no
    lock taken in the clear."""
    port, _ca = tls_node
    _key, stranger = _self_signed(tmp_path)
    with pytest.raises(dblock.BackendError, match=r"(?i)tls handshake"):
        with dblock.connect(_url(port, stranger) + "&connect_timeout=3", table="t_tls") as c:
            c.lock("k", ttl=5).acquire(timeout=1)


def test_plain_etcd_url_to_a_tls_node_fails_clearly(tls_node: tuple[int, Path]) -> None:
    port, _ca = tls_node
    with pytest.raises(dblock.BackendError):
        with dblock.connect(f"etcd://127.0.0.1:{port}?connect_timeout=3", table="t_tls") as c:
            c.lock("k", ttl=5).acquire(timeout=1)


pytestmark = pytest.mark.timeout(120)
