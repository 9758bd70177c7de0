"""A private ZooKeeper of the test run's own for authentication, ACLs and TLS: one standalone
server (Debian's ``zookeeperd`` classes) with a plain and a TLS client port on free loopback
ports, and a throwaway CA that signed its certificate and a client's (``openssl``).

A JVM takes seconds to start, so one server serves the whole run: the first test process that
needs it starts it under a file lock in the run's shared temporary directory, the others
(pytest-xdist's workers) find it there, and the run's last step (``stop_shared``, from
``pytest_sessionfinish`` in the controlling process) kills it and removes its directory.
Digest authentication needs no server setting (``addauth digest`` is built in); ``ops`` is
also the server's super user (``superDigest``), as docs/stores/zookeeper.md describes for operators.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests._private_servers import free_ports
from tests._servers import REQUIRE_SERVERS
from tests._zk_ensemble import CONF, JAR, srvr

#: Debian's zookeeper.jar names no netty-codec in its class path; its TLS port needs it
NETTY_CODEC = Path("/usr/share/java/netty-codec.jar")
SUPER = ("super", "Sup3r-pw")  # a throwaway server's


@dataclass(frozen=True)
class SecureZk:
    """Where the server listens and the files a client needs."""

    root: Path
    port: int
    tls_port: int
    pid: int

    def url(self, userinfo: str = "", chroot: str = "test", **params: str) -> str:
        """A plain-port URL (``userinfo``: ``user:password``)."""
        at = f"{userinfo}@" if userinfo else ""
        query = "&".join(f"{k}={v}" for k, v in params.items())
        return f"zookeeper://{at}127.0.0.1:{self.port}/{chroot}" + (f"?{query}" if query else "")

    def tls_url(
        self, userinfo: str = "", chroot: str = "test", ca: str = "ca", **params: str
    ) -> str:
        """A TLS-port URL with the client certificate, trusting ``ca`` (``ca`` or ``other-ca``)."""
        at = f"{userinfo}@" if userinfo else ""
        files = {
            "ca": str(self.root / f"{ca}.crt"),
            "certfile": str(self.root / "client.crt"),
            "keyfile": str(self.root / "client.key"),
        }
        query = "&".join(f"{k}={v}" for k, v in {**files, **params}.items())
        return f"zookeepers://{at}127.0.0.1:{self.tls_port}/{chroot}?{query}"


def _missing(what: str) -> None:
    message = f"a private secure ZooKeeper needs {what}"
    if REQUIRE_SERVERS:
        pytest.fail(message + " (DBLOCK_REQUIRE_SERVERS=1)")
    pytest.skip(message)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _certificates(root: Path) -> None:
    """A CA that signs the server's and the client's certificates, and another CA (signs
    nothing here: a client that trusts only it must refuse the server)."""
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", *ec, "-keyout", f"{ca}.key", "-subj", f"/CN={ca}",
                 "-days", "2", "-out", f"{ca}.crt", cwd=root)  # fmt: skip
    (root / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client"):
        _openssl("req", "-new", *ec, "-keyout", f"{name}.key", "-subj", f"/CN={name}",
                 "-out", f"{name}.csr", cwd=root)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-days", "2", "-out", f"{name}.crt", "-extfile", "san.ext",
                 cwd=root)  # fmt: skip
    # ZooKeeper's PEM key store: the key (PKCS#8) and the certificate in one file
    _openssl("pkcs8", "-topk8", "-nocrypt", "-in", "server.key", "-out", "server.p8", cwd=root)
    (root / "server.pem").write_text(
        (root / "server.p8").read_text() + (root / "server.crt").read_text()
    )


def _start(root: Path) -> SecureZk:
    java = shutil.which("java")
    if java is None or not JAR.exists() or not NETTY_CODEC.exists():
        _missing("java and Debian's zookeeperd")
    if shutil.which("openssl") is None:
        _missing("the openssl command")
    assert java is not None
    root.mkdir(parents=True, exist_ok=True)
    _certificates(root)
    port, tls_port = free_ports(2)
    (root / "data").mkdir(exist_ok=True)
    (root / "zoo.cfg").write_text(
        "\n".join(
            [
                "tickTime=250",
                f"dataDir={root / 'data'}",
                f"clientPort={port}",
                "clientPortAddress=127.0.0.1",
                f"secureClientPort={tls_port}",
                "secureClientPortAddress=127.0.0.1",
                "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
                f"ssl.keyStore.location={root / 'server.pem'}",
                "ssl.keyStore.type=PEM",
                f"ssl.trustStore.location={root / 'ca.crt'}",
                "ssl.trustStore.type=PEM",
                # the client certificate names no host to check against the client's address
                "ssl.hostnameVerification=false",
                "admin.enableServer=false",
                "4lw.commands.whitelist=srvr",
                "",
            ]
        )
    )
    from kazoo.security import make_digest_acl_credential

    command = [
        java,
        "-Xmx96m",
        f"-Dzookeeper.log.dir={root}",
        f"-Dzookeeper.DigestAuthenticationProvider.superDigest={make_digest_acl_credential(*SUPER)}",
        "-cp",
        f"{CONF}:{JAR}:{NETTY_CODEC}",
        "org.apache.zookeeper.server.ZooKeeperServerMain",
        str(root / "zoo.cfg"),
    ]
    # not this process's child: it outlives the test process that started it (the run's
    # last step kills it); setsid makes it a process group of its own, the group's id its pid
    started = subprocess.run(
        ["sh", "-c", 'setsid "$@" >>"$0" 2>&1 </dev/null & echo $!', root / "server.log", *command],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(started.stdout)
    deadline = time.monotonic() + 60
    while "Mode:" not in (srvr(port) or ""):
        if not Path(f"/proc/{pid}").exists() or time.monotonic() > deadline:
            raise RuntimeError(
                "the private secure ZooKeeper did not start:\n"
                + (root / "server.log").read_text(errors="replace")[-2000:]
            )
        time.sleep(0.1)
    server = SecureZk(root, port, tls_port, pid)
    _warm_tls(server, deadline)
    (root / "server.json").write_text(json.dumps({"port": port, "tls_port": tls_port, "pid": pid}))
    return server


def _warm_tls(server: SecureZk, deadline: float) -> None:
    """One TLS handshake done: the JVM's first one loads and compiles its TLS classes, which
    on a loaded machine outlasted a test's 4 s connect timeout (its refusal never came)."""
    context = ssl.create_default_context(cafile=str(server.root / "ca.crt"))
    context.load_cert_chain(server.root / "client.crt", server.root / "client.key")
    while True:
        try:
            with (
                socket.create_connection(("127.0.0.1", server.tls_port), timeout=30) as raw,
                context.wrap_socket(raw, server_hostname="127.0.0.1"),
            ):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def shared(base: Path) -> SecureZk:
    """The run's server in ``base`` (the run's shared temporary directory), started by the
    first caller of any process."""
    root = base / "secure-zk"
    with (base / "secure-zk.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = root / "server.json"
        if state.exists():
            found = json.loads(state.read_text())
            return SecureZk(root, found["port"], found["tls_port"], found["pid"])
        return _start(root)


def stop_shared(base: Path) -> None:
    """Kill the run's server, if one was started, and remove its directory."""
    root = base / "secure-zk"
    state = root / "server.json"
    if state.exists():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(json.loads(state.read_text())["pid"], signal.SIGKILL)
    shutil.rmtree(root, ignore_errors=True)
