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


def test_allowed_host_names_are_answered_and_others_refused(tmp_path: Path) -> None:
    port = free_ports(1)[0]
    proc, _ = _start(tmp_path, "--port", str(port), "--allowed-host", "Locks.Test")
    try:
        state = f"http://127.0.0.1:{port}/api/state"
        assert _get(state).status_code == 200
        assert httpx.get(state, headers={"Host": f"locks.test:{port}"}).status_code == 200
        assert httpx.get(state, headers={"Host": f"other.test:{port}"}).status_code == 400
    finally:
        assert _stop(proc) == 0


def test_an_allowed_host_with_a_scheme_or_port_exits_2(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/locks.sqlite3"
    for bad in ("http://locks.test", "locks.test:8765", ""):
        done = subprocess.run(
            [sys.executable, "-m", "dblock", "--url", url, "dashboard", "--allowed-host", bad],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2, (bad, done.stderr)
        assert "is not a host name" in done.stderr
