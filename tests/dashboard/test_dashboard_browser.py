"""The dashboard in a real browser (chromium via Playwright) over a real database."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import dblock
from tests._servers import drop_tables, require_server, server_url

httpx = pytest.importorskip("httpx")
pytest.importorskip("playwright.sync_api")
pytest.importorskip("starlette")
from dblock import dashboard  # noqa: E402 - after the extra's import check
from tests.dashboard import kit  # noqa: E402

pytestmark = pytest.mark.skipif(
    not Path(kit.CHROMIUM).exists(), reason="chromium is not installed (apt-get install chromium)"
)


@pytest.fixture(params=["sqlite", "postgresql"])
def client(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dblock.Client]:
    url = server_url(str(request.param), str(tmp_path))
    if request.param != "sqlite":
        require_server(str(request.param), url)
    table = "t_" + uuid.uuid4().hex[:16]
    with dblock.connect(url, table=table) as c:
        yield c
    drop_tables(url, table)


def _post(url: str, body: dict[str, Any], headers: dict[str, str]) -> int:
    return httpx.post(url, json=body, headers=headers).status_code


def test_a_hold_appears_its_lease_shrinks_and_it_vanishes(
    client: dblock.Client, tmp_path: Path
) -> None:
    key = "inventory:" + uuid.uuid4().hex[:8]
    with kit.open_dashboard(client, failure_shot=tmp_path / "failure.png") as (page, base):
        assert page.locator("button.release").count() == 0  # read-only by default
        lock = client.lock(key, ttl=6)
        assert kit.off_loop(lock.acquire)
        page.wait_for_selector(kit.row(key), timeout=kit.SHOWN_MS)
        cells = page.locator(kit.row(key) + " td").all_inner_texts()
        assert cells[:4] == [key, "lock", lock.owner, str(lock.token)]
        first = kit.fraction(page, key)
        page.wait_for_function(
            f"document.querySelector('{kit.row(key)} .bar').dataset.fraction < {first - 0.1}",
            timeout=kit.SHOWN_MS,
        )
        kit.off_loop(lock.release)
        page.wait_for_selector(kit.row(key), state="detached", timeout=kit.SHOWN_MS)
        assert _post(base + "/api/release", {"key": key}, {}) == 404  # no force-release here
        assert "dblock_store_holds" in httpx.get(base + "/metrics").text


def test_a_waiter_appears_while_it_waits(client: dblock.Client, tmp_path: Path) -> None:
    """Who waits for a held key shows under Waiters (the SQL stores list their wait queue),
    and leaves that table when it gets the lock."""
    key = "payout:" + uuid.uuid4().hex[:8]
    waiting = f'#waiters tr[data-key="{key}"]'
    with (
        dblock.connect(client.url, table=client.table) as other,
        kit.open_dashboard(client, failure_shot=tmp_path / "failure.png") as (page, _base),
    ):
        holder = client.lock(key, ttl=30)
        assert kit.off_loop(holder.acquire)
        waiter = other.lock(key, ttl=30)
        result: list[tuple[bool, str]] = []

        def wait() -> None:
            got = waiter.acquire(timeout=20)
            result.append((got, waiter.owner))
            if got:
                waiter.release()

        thread = threading.Thread(target=wait)
        thread.start()
        try:
            page.wait_for_selector(waiting, timeout=kit.SHOWN_MS)
            cells = page.locator(waiting + " td").all_inner_texts()
            assert cells[:2] == [key, "lock"]
            seen_owner = cells[2]
            kit.off_loop(holder.release)
            page.wait_for_selector(waiting, state="detached", timeout=kit.SHOWN_MS)
        finally:
            thread.join(30)
        assert result == [(True, seen_owner)]  # the waiter shown was this acquisition


def test_force_release_needs_the_secret(client: dblock.Client, tmp_path: Path) -> None:
    key = "payout:" + uuid.uuid4().hex[:8]
    lock = client.lock(key, ttl=30)
    assert lock.acquire()
    settings = dashboard.Settings(allow_force_release=True)
    with kit.open_dashboard(client, settings, failure_shot=tmp_path / "failure.png") as (
        page,
        base,
    ):
        page.wait_for_selector(kit.row(key), timeout=kit.SHOWN_MS)
        # without the secret: the confirmation is accepted, a wrong secret typed in
        page.on("dialog", lambda d: d.accept("not-the-secret" if d.type == "prompt" else None))
        page.click(kit.row(key) + " button.release")
        page.wait_for_selector("#message.bad", timeout=kit.SHOWN_MS)
        assert "secret" in page.inner_text("#message")
        assert _post(base + "/api/release", {"key": key}, {}) == 403
        page.wait_for_timeout(300)
        assert kit.off_loop(client.info, key) is not None
        # with the secret from start-up (in the URL, as printed)
        page.goto(base + "/?secret=" + settings.secret)
        page.wait_for_selector(kit.row(key), timeout=kit.SHOWN_MS)
        assert "secret" not in page.url  # taken out of the address bar
        page.click(kit.row(key) + " button.release")
        page.wait_for_selector(kit.row(key), state="detached", timeout=kit.SHOWN_MS)
        assert kit.off_loop(client.info, key) is None
    with pytest.raises(dblock.LockLost):
        lock.release()


def test_filter_sort_and_phone_width(client: dblock.Client, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:6]
    keys = [f"a{tag}:1", f"b{tag}:2", f"b{tag}:3"]
    locks = [client.lock(k, ttl=30) for k in keys]
    for lock in locks:
        assert lock.acquire()
    with kit.open_dashboard(client, failure_shot=tmp_path / "failure.png") as (page, _):
        page.wait_for_selector(kit.row(keys[-1]), timeout=kit.SHOWN_MS)
        page.fill("#filter", f"b{tag}")
        assert page.locator("#holds tbody tr").count() == 2
        page.click('#holds th[data-col="key"]')  # already by key: now descending
        shown = page.locator("#holds tbody tr").evaluate_all("rs => rs.map(r => r.dataset.key)")
        assert shown == [keys[2], keys[1]]
        page.set_viewport_size({"width": 390, "height": 800})
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390  # no sideways scrolling on a phone
    for lock in locks:
        lock.release()


def test_a_page_by_another_name_cannot_read_it(tmp_path: Path) -> None:
    """DNS rebinding: a page whose name resolves to the dashboard's address (chromium's
    resolver maps it, as an attacker's DNS would) gets 400 for the page and for every fetch
    it makes, until that name is an --allowed-host (issue 46)."""
    rebound = "rebind.test"
    args = [f"--host-resolver-rules=MAP {rebound} 127.0.0.1"]
    with dblock.connect(f"sqlite:///{tmp_path}/locks.sqlite3") as client:
        key = "inventory:" + uuid.uuid4().hex[:8]
        # held throughout: two browsers started on a loaded machine took over 30 s (CI)
        lock = client.lock(key, ttl=300)
        assert lock.acquire()
        for allowed, status in (((), 400), ((rebound,), 200)):
            settings = dashboard.Settings(allowed_hosts=allowed)
            with kit.running(client, settings) as base, kit.browser_page(args=args) as page:
                other = base.replace("127.0.0.1", rebound)
                assert page.goto(other + "/").status == status
                read = page.evaluate(
                    "async () => { const r = await fetch('/api/state');"
                    " return [r.status, await r.text()]; }"
                )
                assert read[0] == status
                assert (key in read[1]) is (status == 200)  # no key, owner or token leaks
        lock.release()


def test_a_malformed_release_gets_400_and_the_page_goes_on(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A body that is not JSON, sent with the right secret, is the sender's mistake: 400 and
    one log line, not a 500 with a traceback on the console (issue 46)."""
    settings = dashboard.Settings(allow_force_release=True)
    with (
        dblock.connect(f"sqlite:///{tmp_path}/locks.sqlite3") as client,
        kit.open_dashboard(client, settings, failure_shot=tmp_path / "failure.png") as (page, _),
    ):
        status = page.evaluate(
            "async (secret) => (await fetch('/api/release', {method: 'POST', body: '{not json',"
            " headers: {'x-dblock-secret': secret}})).status",
            settings.secret,
        )
        assert status == 400
        page.wait_for_selector("#status:has-text('live')")
    err = capfd.readouterr().err
    assert "Traceback" not in err
    assert "Exception in ASGI application" not in err
