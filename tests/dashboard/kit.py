"""Driving the dashboard in a real browser (Debian's chromium through Playwright): what the
browser tests use, and what makes docs/dashboard.png:

    .venv/bin/python -m tests.dashboard.kit docs/dashboard.png
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import dblock
from dblock import dashboard

T = TypeVar("T")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# How long a page may take to show a change: generous, since a loaded CI machine can stall
# the browser, the server thread and the database for seconds; a passing wait ends early.
SHOWN_MS = 20_000


@contextmanager
def browser_page(
    width: int = 1100, height: int = 800, *, args: Sequence[str] = ()
) -> Iterator[Any]:
    """A fresh chromium page (headless); ``args``: more of chromium's switches."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", *args])
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            yield page
        finally:
            browser.close()


@contextmanager
def open_dashboard(
    client: dblock.Client,
    settings: dashboard.Settings | None = None,
    *,
    failure_shot: Path | None = None,
) -> Iterator[tuple[Any, str]]:
    """The dashboard served for ``client``, open in a browser page: (page, base URL). If the
    block fails, the page is saved to ``failure_shot`` first.

    Playwright's blocking API runs an event loop on this thread, so the block must use the
    blocking dblock API on another thread (:func:`off_loop`)."""
    with running(client, settings) as base, browser_page() as page:
        try:
            page.goto(base + "/")
            page.wait_for_selector("#status:has-text('live')")
            yield page, base
        except BaseException:
            if failure_shot is not None:
                print("screenshot of the failure:", shoot(page, failure_shot))
            raise


#: one thread, so that what it acquires it also owns when it releases
_WORKER = ThreadPoolExecutor(1, thread_name_prefix="dashboard-test-holder")


def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on the worker thread (a thread running an event loop may not block)."""
    return _WORKER.submit(fn, *args).result()


@contextmanager
def running(client: dblock.Client, settings: dashboard.Settings | None = None) -> Iterator[str]:
    """The dashboard served by uvicorn on a thread, on a free loopback port: its base URL."""
    import uvicorn

    config = uvicorn.Config(
        dashboard.make_app(client, settings),
        host="127.0.0.1",
        port=0,
        log_level="warning",
        lifespan="off",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="dblock-dashboard", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the dashboard did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def row(key: str) -> str:
    """The selector of the hold row of ``key``."""
    return f'#holds tr[data-key="{key}"]'


def fraction(page: Any, key: str) -> float:
    return float(page.get_attribute(row(key) + " .bar", "data-fraction"))


def shoot(page: Any, path: Path) -> Path:
    page.screenshot(path=str(path), full_page=True)
    return path


def demo_screenshot(path: Path) -> Path:
    """A dashboard over a few typical holds, after a few seconds of the chart: the README's."""
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/locks.sqlite3"
        with dblock.connect(url) as client:
            locks = []
            for key, ttl in [
                ("inventory:ACME:WH1:sku-42", 30),
                ("inventory:ACME:WH2:sku-7", 20),
                ("payout:order-1842", 60),
                ("report:nightly", 300),
            ]:
                lock = client.lock(key, ttl=ttl)
                off_loop(lock.acquire)
                locks.append(lock)
            rw = client.rwlock("catalog:prices", ttl=45)
            readers = [rw.read_lock(), rw.read_lock()]
            done = client.once("withdraw-retry:serial-0093", ttl=60, note="retry payout")
            running = client.once("payout:batch-" + uuid.uuid4().hex[:6], ttl=120)
            settings = dashboard.Settings(allow_force_release=True, poll_ms=250)
            # another host waits for the payout lock (the Waiters table)
            other = dblock.connect(url)
            waiting = threading.Thread(target=_wait_a_while, args=(other, "payout:order-1842"))
            waiting.start()
            with open_dashboard(client, settings) as (page, _):
                off_loop(readers[0].acquire)
                off_loop(done.__enter__)
                for step in range(64):
                    page.wait_for_timeout(250)
                    if step == 8:
                        off_loop(done.__exit__, None, None, None)
                        off_loop(running.__enter__)
                    if step == 20:
                        off_loop(readers[1].acquire)
                    if step == 36:
                        off_loop(locks[1].release)
                    if step == 48:
                        off_loop(locks[1].acquire)
                shoot(page, path)
            off_loop(running.__exit__, None, None, None)
            off_loop(locks[2].release)
            waiting.join(30)
            other.close()
    return path


def _wait_a_while(client: dblock.Client, key: str) -> None:
    lock = client.lock(key, ttl=30)
    if lock.acquire(timeout=30):
        lock.release()


if __name__ == "__main__":
    print(demo_screenshot(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/dashboard.png")))
