"""`dblock dashboard` as a user starts it: what it prints, where it listens, Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests._private_servers import free_ports

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")


def _start(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[str], list[str]]:
    url = f"sqlite:///{tmp_path}/locks.sqlite3"
    proc = subprocess.Popen(
        [sys.executable, "-m", "dblock", "--url", url, "dashboard", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    lines = [proc.stdout.readline() for _ in range(3)]
    return proc, lines


def _stop(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(15)
    finally:
        if proc.stdout is not None:
            proc.stdout.close()


def _get(url: str) -> httpx.Response:
    deadline = time.monotonic() + 15
    while True:
        try:
            return httpx.get(url)
        except httpx.ConnectError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_loopback_and_read_only_by_default_and_ctrl_c_exits_0(tmp_path: Path) -> None:
    port = free_ports(1)[0]
    proc, lines = _start(tmp_path, "--port", str(port))
    try:
        assert lines[0].startswith(f"dblock dashboard: http://127.0.0.1:{port}/")
        assert "loopback only" in lines[1]
        assert "read-only" in lines[2]
        assert _get(f"http://127.0.0.1:{port}/api/state").json()["holds"] == []
        assert _get(f"http://127.0.0.1:{port}/metrics").status_code == 200
        assert (
            httpx.post(f"http://127.0.0.1:{port}/api/release", json={"key": "k"}).status_code == 404
        )
    finally:
        assert _stop(proc) == 0


def test_force_release_prints_a_fresh_secret(tmp_path: Path) -> None:
    secrets = []
    for _ in range(2):
        port = free_ports(1)[0]
        proc, lines = _start(tmp_path, "--port", str(port), "--allow-force-release")
        try:
            assert "force-release is enabled" in lines[2]
            assert proc.stdout is not None
            secret = proc.stdout.readline().strip()
            assert f"?secret={secret}" in lines[2]
            secrets.append(secret)
            response = _get(f"http://127.0.0.1:{port}/api/state")
            assert response.status_code == 200
            wrong = httpx.post(
                f"http://127.0.0.1:{port}/api/release",
                json={"key": "k"},
                headers={"x-dblock-secret": secret + "x"},
            )
            assert wrong.status_code == 403
            right = httpx.post(
                f"http://127.0.0.1:{port}/api/release",
                json={"key": "k"},
                headers={"x-dblock-secret": secret},
            )
            assert right.json() == {"released": False}
        finally:
            assert _stop(proc) == 0
    assert secrets[0] != secrets[1] and len(secrets[0]) >= 20
