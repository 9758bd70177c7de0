"""A TCP proxy in its own process, for tests: forwards to a server until told to black-hole.

Usage: ``python tests/_proxy.py HOST PORT DIR``. It listens on a free loopback port and writes
it to ``DIR/port``. Once ``DIR/blackhole`` exists it stops moving bytes in either direction and
accepts new connections without ever answering, but closes nothing: to the client the network
has gone dead (no reset, no refusal), as in a partition that drops packets.

A lost reply, for gRPC (HTTP/2 in clear): once ``DIR/drop`` exists, the next call a client
opens (an HTTP/2 HEADERS frame on a new stream) goes to the server, which answers; the proxy
swallows that answer and resets the client's connection, and removes ``DIR/drop`` and adds
one line to ``DIR/dropped``. To the client the call failed; to the server it succeeded.

:class:`Proxy` runs it from a test.
"""

from __future__ import annotations

import os
import selectors
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_DATA, _HEADERS, _END_STREAM = 0, 1, 1


class _Frames:
    """The HTTP/2 frames of one direction of a connection: (type, flags, stream, length)."""

    def __init__(self, preface: bool) -> None:
        self.buf = bytearray()
        self.preface = preface  # still to skip (client side)
        self.http2 = True

    def feed(self, data: bytes) -> list[tuple[int, int, int, int]]:
        if not self.http2:
            return []
        self.buf += data
        if self.preface:
            if len(self.buf) < len(_PREFACE):
                return []
            if not self.buf.startswith(_PREFACE):
                self.http2 = False
                self.buf.clear()
                return []
            del self.buf[: len(_PREFACE)]
            self.preface = False
        found = []
        while len(self.buf) >= 9:
            length = int.from_bytes(self.buf[:3], "big")
            if len(self.buf) < 9 + length:
                break
            stream = int.from_bytes(self.buf[5:9], "big") & 0x7FFFFFFF
            found.append((self.buf[3], self.buf[4], stream, length))
            del self.buf[: 9 + length]
        return found


class _Drops:
    """The lost-reply mode: which call's answer to swallow, on which connection."""

    def __init__(self, where: Path) -> None:
        self.where = where
        self.frames: dict[socket.socket, _Frames] = {}
        self.doomed: dict[socket.socket, int] = {}  # server side -> the call whose reply is lost
        self.clients: set[socket.socket] = set()

    def add(self, client: socket.socket, server: socket.socket) -> None:
        self.frames[client], self.frames[server] = _Frames(True), _Frames(False)
        self.clients.add(client)

    def forget(self, sock: socket.socket) -> None:
        self.frames.pop(sock, None)
        self.doomed.pop(sock, None)
        self.clients.discard(sock)

    def filter(self, sock: socket.socket, other: socket.socket, data: bytes) -> bytes:
        """The bytes read from ``sock`` to pass on to ``other`` (b"": close both)."""
        if not data:
            return data
        seen = self.frames[sock].feed(data)
        if sock in self.clients and other not in self.doomed and (self.where / "drop").exists():
            calls = [f[2] for f in seen if f[0] == _HEADERS and f[2] % 2 == 1]
            if calls:
                self.doomed[other] = calls[0]
                (self.where / "drop").unlink()
        lost = self.doomed.get(sock)
        if lost is None or not any(
            f[2] == lost and (f[0] == _DATA or f[1] & _END_STREAM) for f in seen
        ):
            return data
        # the answer came: swallow it, and reset the client's connection
        del self.doomed[sock]
        with (self.where / "dropped").open("a") as log:
            log.write(f"{lost}\n")
        other.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        return b""


def _connect(client: socket.socket, host: str, port: int) -> socket.socket | None:
    """The connection to the server for ``client``; None, and ``client`` reset, while the
    server is down (a chaos restart): the client sees what it would see without the proxy."""
    try:
        return socket.create_connection((host, port))
    except OSError:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()
        return None


def _forward(sock: socket.socket, other: socket.socket, drops: _Drops) -> bool:
    """Pass what ``sock`` has to ``other``; False once either side is gone."""
    try:
        data = sock.recv(65536)
    except OSError:
        data = b""
    data = drops.filter(sock, other, data)
    if not data:
        return False
    try:
        other.sendall(data)
    except OSError:  # reset meanwhile (a restarting server)
        return False
    return True


def serve(host: str, port: int, where: Path) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    peer: dict[socket.socket, socket.socket] = {}
    (where / "port.tmp").write_text(str(listener.getsockname()[1]))
    (where / "port.tmp").rename(where / "port")
    held: list[socket.socket] = []  # connections accepted while black-holed: never answered
    drops = _Drops(where)
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
                server = _connect(client, host, port)
                if server is None:
                    continue
                peer[client], peer[server] = server, client
                drops.add(client, server)
                sel.register(client, selectors.EVENT_READ)
                sel.register(server, selectors.EVENT_READ)
            # (not closed with its peer in this round)
            elif not dead and sock in peer and not _forward(sock, peer[sock], drops):
                other = peer.pop(sock)
                peer.pop(other, None)
                for s in (sock, other):
                    sel.unregister(s)
                    s.close()
                    drops.forget(s)
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

    def drop_next_reply(self) -> None:
        """Lose the reply to the next gRPC call through the proxy (see the module's doc)."""
        (self.where / "drop").touch()

    def dropped(self) -> int:
        """How many replies were lost so far."""
        path = self.where / "dropped"
        return len(path.read_text().split()) if path.exists() else 0

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
