"""A TCP proxy in its own process, for tests: forwards to a server until told to black-hole.

Usage: ``python tests/_proxy.py HOST PORT DIR``. It listens on a free loopback port and writes
it to ``DIR/port``. Once ``DIR/blackhole`` exists it stops moving bytes in either direction and
accepts new connections without ever answering, but closes nothing: to the client the network
has gone dead (no reset, no refusal), as in a partition that drops packets.

:class:`Proxy` runs it from a test.
"""

from __future__ import annotations

import os
import selectors
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType


def serve(host: str, port: int, where: Path) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    peer: dict[socket.socket, socket.socket] = {}
    (where / "port.tmp").write_text(str(listener.getsockname()[1]))
    (where / "port.tmp").rename(where / "port")
    held: list[socket.socket] = []  # connections accepted while black-holed: never answered
    while True:
        dead = (where / "blackhole").exists()
        for item, _ in sel.select(0.01):
            sock = item.fileobj
            assert isinstance(sock, socket.socket)
            if sock is listener:
                client, _addr = listener.accept()
                if dead:
                    held.append(client)
                    continue
                server = socket.create_connection((host, port))
                peer[client], peer[server] = server, client
                sel.register(client, selectors.EVENT_READ)
                sel.register(server, selectors.EVENT_READ)
            elif not dead:
                try:
                    data = sock.recv(65536)
                except OSError:
                    data = b""
                if data:
                    peer[sock].sendall(data)
                else:
                    other = peer.pop(sock)
                    peer.pop(other, None)
                    for s in (sock, other):
                        sel.unregister(s)
                        s.close()
        if dead and peer:
            for s in peer:  # stop reading: the bytes stay in the kernel's buffers
                sel.unregister(s)
            held.extend(peer)
            peer.clear()


class Proxy:
    """The proxy process, from a test: ``with Proxy(host, port, tmp) as p: ... p.blackhole()``."""

    def __init__(self, host: str, port: int, where: Path) -> None:
        self.where = where
        where.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen([sys.executable, __file__, host, str(port), str(where)])
        deadline = time.monotonic() + 30
        while not (where / "port").exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the test proxy did not start")
            time.sleep(0.01)
        self.port = int((where / "port").read_text())

    def blackhole(self) -> None:
        (self.where / "blackhole").touch()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def __enter__(self) -> Proxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


if __name__ == "__main__":
    os.setpgrp()  # a Ctrl-C meant for the test runner leaves it to the test's cleanup
    serve(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]))
