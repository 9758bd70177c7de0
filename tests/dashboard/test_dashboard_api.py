"""The dashboard's data without a browser: once-records and the store's metrics."""

from __future__ import annotations

from pathlib import Path

import pytest

import dblock

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
from tests.dashboard import kit  # noqa: E402 - after the extra's import check


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
