"""The dashboard's data without a browser: once-records and the store's metrics."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import dblock

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
from dblock import dashboard  # noqa: E402 - after the extra's import check
from tests.dashboard import kit  # noqa: E402


def test_once_records_seen_held_keep_their_state(tmp_path: Path) -> None:
    with dblock.connect(f"sqlite:///{tmp_path}/locks.sqlite3") as client:
        with kit.running(client) as base:
            good, bad = client.once("pay:ok", ttl=30), client.once("pay:bad", ttl=30)
            with good:
                bad.__enter__()
                state = httpx.get(base + "/api/state").json()
                assert {o["key"]: o["state"] for o in state["once"]} == {
                    "pay:ok": "processing",
                    "pay:bad": "processing",
                }
                bad.__exit__(ZeroDivisionError, ZeroDivisionError(), None)  # the block failed
            state = httpx.get(base + "/api/state").json()
            assert state["holds"] == []
            assert {o["key"]: o["state"] for o in state["once"]} == {
                "pay:ok": "succeeded",
                "pay:bad": "failed",
            }
            with client.lock("inventory:sku-1", ttl=30):
                metrics = httpx.get(base + "/metrics").text
            assert 'dblock_store_holds{kind="lock",prefix="inventory"} 1.0' in metrics


EVERY = "0.0.0.0"  # noqa: S104 - what --host 0.0.0.0 binds, as data (nothing binds here)


@pytest.mark.parametrize(
    ("header", "bound", "allowed", "expected"),
    [
        ("127.0.0.1:8765", "127.0.0.1", (), True),
        ("localhost:8765", "127.0.0.1", (), True),
        ("LOCALHOST.", "127.0.0.1", (), True),
        ("[::1]:8765", "::1", (), True),
        ("127.0.0.2:8765", "127.0.0.1", (), True),  # loopback: only this machine reaches it
        ("rebind.example:8765", "127.0.0.1", (), False),  # DNS rebinding: a name of its own
        ("locks.example.com:8765", EVERY, ("locks.example.com",), True),
        ("Locks.Example.com", EVERY, ("locks.example.com",), True),
        ("other.example.com", EVERY, ("locks.example.com",), False),
        ("10.1.2.3:8765", EVERY, (), True),  # every address is its own: an IP is safe
        ("10.1.2.3:8765", "10.9.9.9", (), False),
        ("[fe80::1]:8765", "::", (), True),
        ("", "127.0.0.1", (), False),  # no Host at all
        ("evil.example:8765@127.0.0.1", "127.0.0.1", (), False),
    ],
)
def test_which_hosts_are_answered(
    header: str, bound: str, allowed: tuple[str, ...], expected: bool
) -> None:
    settings = dashboard.Settings(host=bound, allowed_hosts=allowed)
    assert dashboard.host_allowed(header, settings) is expected


def test_another_host_and_a_malformed_body_get_400_and_one_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    """Issue 46: /api/state answered any Host (DNS rebinding), and a body that is not JSON
    sent with the right secret gave a 500 and a traceback."""
    caplog.set_level(logging.WARNING, logger="dblock.dashboard")
    settings = dashboard.Settings(allow_force_release=True)
    with (
        dblock.connect(f"sqlite:///{tmp_path}/locks.sqlite3") as client,
        kit.running(client, settings) as base,
    ):
        for path in ("/", "/api/state", "/metrics"):
            refused = httpx.get(base + path, headers={"Host": "rebind.example:8765"})
            assert refused.status_code == 400, path
            assert "--allowed-host" in refused.json()["error"]
        assert httpx.get(base + "/api/state").status_code == 200
        secret = {"x-dblock-secret": settings.secret}
        for body in (b"{not json", b"\xff\xfe", b""):
            answer = httpx.post(base + "/api/release", content=body, headers=secret)
            assert answer.status_code == 400, body
            assert "JSON" in answer.json()["error"]
        assert httpx.post(base + "/api/release", json={"key": "k"}, headers=secret).json() == {
            "released": False
        }
    lines = [r.getMessage() for r in caplog.records if r.name == "dblock.dashboard"]
    assert len(lines) == 6, lines  # one per refused request
    assert all("\n" not in line for line in lines)
    assert "Traceback" not in capfd.readouterr().err
