"""A MariaDB server of a test's own, whose redo log writes can be made slow, and which the test
may kill (SIGKILL) and start again: for what a server crash loses.

It runs the machine's ``mariadbd`` on a fresh data directory and a free port, with
``_slow_redo.c`` (compiled with the machine's C compiler) preloaded.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._servers import REQUIRE_SERVERS, raw_connect, reachable

SHIM_SOURCE = Path(__file__).with_name("_slow_redo.c")
#: how long each redo log write waits while the server is slow, milliseconds (by default)
SLOW_MS = 300


def _tool(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")


def _missing(what: str) -> None:
    message = f"a private MariaDB server needs {what}"
    if REQUIRE_SERVERS:
        pytest.fail(message + " (DBLOCK_REQUIRE_SERVERS=1)")
    pytest.skip(message)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateMariaDB:
    """Made by :func:`private_mariadb`; ``url`` names its database ``test``."""

    def __init__(self, root: Path, server: str, shim: Path) -> None:
        self._root = root
        self._server = server
        self._shim = shim
        self._flag = root / "slow"
        self.port = _free_port()
        self.url = f"mysql://root@127.0.0.1:{self.port}/test"
        #: the same server's system database, there from the start
        self.system_url = f"mysql://root@127.0.0.1:{self.port}/mysql"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {
            **os.environ,
            "LD_PRELOAD": str(self._shim),
            "SLOW_REDO_FLAG": str(self._flag),
        }
        user = ["--user=root"] if os.geteuid() == 0 else []
        self._proc = subprocess.Popen(
            [
                self._server,
                "--no-defaults",
                f"--datadir={self._root / 'data'}",
                *user,
                f"--port={self.port}",
                "--bind-address=127.0.0.1",
                f"--socket={self._root / 'sock'}",
                "--skip-log-bin",
                "--innodb-buffer-pool-size=32M",
                f"--log-error={self._root / 'error.log'}",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while reachable(self.system_url) is not None:
            if self._proc.poll() is not None or time.monotonic() > deadline:
                log = (self._root / "error.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the private MariaDB server did not start:\n{log}")
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL: what the server had not written to its files is lost."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGKILL)
            self._proc.wait(30)

    @contextlib.contextmanager
    def slow_redo(self, ms: int = SLOW_MS) -> Iterator[None]:
        """Within: every redo log write waits ``ms`` milliseconds first."""
        self._flag.write_text(str(ms))
        try:
            yield
        finally:
            self._flag.unlink(missing_ok=True)


@contextlib.contextmanager
def private_mariadb(root: Path) -> Iterator[PrivateMariaDB]:
    """A private MariaDB server in ``root``, running, with an empty database ``test``."""
    server, install, cc = _tool("mariadbd"), _tool("mariadb-install-db"), _tool("cc")
    if server is None or install is None:
        _missing("mariadbd and mariadb-install-db")
    if cc is None:
        _missing("a C compiler (cc)")
    assert server is not None and install is not None and cc is not None
    shim = root / "slow_redo.so"
    compile_shim = [cc, "-shared", "-fPIC", "-O2", "-o", str(shim), str(SHIM_SOURCE), "-ldl"]
    subprocess.run(compile_shim, check=True)
    user = ["--user=root"] if os.geteuid() == 0 else []
    subprocess.run(
        [
            install,
            "--no-defaults",
            f"--datadir={root / 'data'}",
            *user,
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    db = PrivateMariaDB(root, server, shim)
    db.start()
    try:
        conn = raw_connect(db.system_url)
        conn.cursor().execute("CREATE DATABASE test")
        conn.close()
        yield db
    finally:
        db.kill()
