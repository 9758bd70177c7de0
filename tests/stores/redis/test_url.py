"""Redis URLs: redis:// and rediss:// (TLS), what is refused, and the password never shown."""

from __future__ import annotations

import importlib.metadata
import traceback
from pathlib import Path

import pytest

import dblock
from tests._private_servers import private_redis

SECRET = "Pw9-r3d1s-s3cr3t"  # noqa: S105 - must never show up


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis://127.0.0.1:6379/zero", "database number"),
        ("redis://127.0.0.1:6379/-1", "database number"),
        ("redis:///0", "names no host"),
        ("redis://127.0.0.1:6379/0?socket_keepalive=1", "unknown Redis URL parameter"),
        ("redis://127.0.0.1:6379/0?ssl_ca_certs=/ca.pem", "rediss://"),  # TLS options need TLS
        ("rediss://127.0.0.1:6379/0?ssl_cert_reqs=maybe", "ssl_cert_reqs"),
        ("redis://127.0.0.1:6379/0?connect_timeout=nan", "connect_timeout"),
        ("redis://127.0.0.1:port/0", "host:port"),
    ],
)
def test_bad_url_parts_are_named(url: str, says: str) -> None:
    with pytest.raises(dblock.ConfigurationError, match=says):
        dblock.connect(url)


@pytest.mark.parametrize(
    "url",
    [
        f"redis://app:{SECRET}@127.0.0.1:1/0?connect_timeout=1",  # nothing listens there
        f"redis://:{SECRET}@127.0.0.1:1/0?connect_timeout=1",
        f"redis://app:{SECRET}@127.0.0.1:1/x",  # refused before connecting
        f"rediss://app:{SECRET}@127.0.0.1:1/0?ssl_cert_reqs=bad",
    ],
)
def test_the_password_is_never_shown(url: str) -> None:
    with pytest.raises(dblock.DBLockError) as info:
        dblock.connect(url)
    shown = "".join([str(info.value), repr(info.value), *traceback.format_exception(info.value)])
    assert SECRET not in shown
    assert "***" in str(info.value)


def test_a_wrong_password_is_a_configuration_error_without_it(url: str) -> None:
    # refused for good (retrying cannot help): the CLI's exit 2, not 69
    wrong = url.replace("redis://", f"redis://nobody:{SECRET}@", 1)
    with pytest.raises(dblock.ConfigurationError) as info:
        dblock.connect(wrong)
    assert SECRET not in "".join(traceback.format_exception(info.value))


@pytest.mark.slow
def test_rediss_over_tls_with_a_self_signed_certificate(tmp_path: Path) -> None:
    with private_redis(tmp_path, tls=True) as server:
        assert server.url.startswith("rediss://")
        with dblock.connect(server.url, table="tls") as client:
            with client.lock("k", ttl=5) as lock:
                assert lock.token is not None
                assert [i.key for i in client.list()] == ["k"]
        # the server's certificate is checked: without the CA it is refused
        plain = server.url.split("?", 1)[0]
        with pytest.raises(dblock.BackendError):
            dblock.connect(plain + "?connect_timeout=5")
        # and a plain connection to a TLS port is no connection
        with pytest.raises(dblock.BackendError):
            dblock.connect(plain.replace("rediss://", "redis://") + "?connect_timeout=5")


def test_a_connection_reads_with_the_connect_timeout_only_until_it_is_made(url: str) -> None:
    """The handshake is read within the connect timeout (a silent server is unreachable
    within it: tests/test_unreachable.py); the statements after it with their own bound."""
    from dblock.stores._pool import MAINTENANCE_DEADLINE

    with dblock.connect(url + "?connect_timeout=2") as client:
        store = client._core.store
        conn = store._connect()
        try:
            assert conn.connection._sock.gettimeout() == MAINTENANCE_DEADLINE
            assert conn.ping()
        finally:
            conn.close()


def test_no_client_looks_its_library_version_up_in_the_package_metadata(
    url: str, table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # redis-py 7+ reads its version from the installed packages' metadata for each client it
    # makes unless told it (3.5 ms each: twice in a cold `dblock run` before)
    looked_up: list[str] = []
    real = importlib.metadata.version

    def version(name: str) -> str:
        looked_up.append(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    with dblock.connect(url, table=table) as client, client.lock("k", ttl=5):
        pass
    assert looked_up == []
