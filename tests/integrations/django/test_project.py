"""A real Django project (``project/``) on SQLite and PostgreSQL, through ``manage.py``: the
migration makes dblock's tables, views lock and fence, ``manage.py dblock`` inspects and frees,
and of several processes running a ``once`` command exactly one runs it."""

from __future__ import annotations

import json
import re
import time

import pytest

import dblock
from dblock.tools import ddl_for
from tests._servers import POSTGRESQL_URL, raw_connect

from ._project import Site, open_gate, wait_for

pytest.importorskip("django")
pytestmark = pytest.mark.slow  # a Django process per step: about a second each


def _dialect(site: Site) -> str:
    return site.url.split(":", 1)[0]


def test_migrate_makes_the_tables_dblock_schema_prints(site: Site) -> None:
    shown = site.run("sqlmigrate", "dblock", "0001").stdout
    for statement in ddl_for(_dialect(site)):
        assert statement in shown
    # the tables are there: a client that must not create them works on them
    with dblock.connect(site.url, create_schema=False) as client:
        with client.lock("migrated") as held:
            assert held.token is not None
            assert client.info("migrated") is not None


def test_a_view_locks_and_its_stale_write_is_fenced_out(site: Site) -> None:
    gate = site.gate()
    first = site.popen("get", f"/reserve/s1/?gate={gate}")
    wait_for(f"{gate}.entered", first)
    held = json.loads(site.run("dblock", "info", "stock:s1", "--json").stdout)
    assert held["kind"] == "lock"
    [(busy, _)] = site.get("/reserve/s1/")
    assert busy == 409  # timeout=0
    # the operator frees it while the first request still works under it
    freed = site.run("dblock", "release", "stock:s1", "--force").stdout
    assert freed.startswith("released stock:s1 (held by")
    [(status, second)] = site.get("/reserve/s1/")
    assert status == 200
    assert second == {"token": second["token"], "written": 1, "lost": False}
    assert second["token"] > held["token"]
    open_gate(gate)
    out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    status_text, _, body = out.strip().partition(" ")
    assert status_text == "200"
    # the stale holder's write changed nothing, and its release reported the loss
    assert json.loads(body) == {"token": held["token"], "written": 0, "lost": True}
    with raw_connect(site.url) as conn:
        row = conn.execute("SELECT level, fence_token FROM shop_stock WHERE sku = 's1'").fetchone()
    assert tuple(row) == (9, second["token"])


def test_a_locked_view_is_busy_while_another_request_holds_it(site: Site) -> None:
    gate = site.gate()
    first = site.popen("get", f"/report/r1/?gate={gate}")
    wait_for(f"{gate}.entered", first)
    lines = site.run("dblock", "list", "--json").stdout.splitlines()
    listed = [json.loads(line) for line in lines]
    assert [h["key"] for h in listed if h["key"].startswith("report:")] == ["report:r1"]
    table = site.run("dblock", "list", "--prefix", "report:").stdout
    assert re.search(r"^report:r1\s+lock\s", table, re.MULTILINE), table
    busy, free = site.get("/report/r1/", "/report/r2/")
    assert busy[0] == 409
    assert free == (200, {"report": "r2"})  # another key is free
    open_gate(gate)
    out, err = first.communicate(timeout=60)
    assert out.strip() == '200 {"report": "r1"}', err
    assert site.run("dblock", "info", "report:r1", status=1).stderr.strip() == (
        "dblock: report:r1 is not held"
    )
    assert site.run("dblock", "release", "report:r1", "--force", status=1).stderr.strip() == (
        "dblock: report:r1 was not held"
    )


def test_of_three_processes_running_a_once_command_exactly_one_runs(site: Site) -> None:
    gate = site.gate()
    procs = [site.popen("payout", "b1", "--gate", gate) for _ in range(3)]
    wait_for(f"{gate}.entered")
    # the winner waits at its gate: the other two must give up meanwhile
    deadline = time.monotonic() + 60
    while sum(p.poll() is not None for p in procs) < 2:
        assert time.monotonic() < deadline, "the two others never finished"
        time.sleep(0.02)
    waiting = [p for p in procs if p.poll() is None]
    assert len(waiting) == 1
    for proc in procs:
        if proc is not waiting[0]:
            out, err = proc.communicate()
            assert (out.strip(), proc.returncode) == ("in progress", 75), err
    open_gate(gate)
    out, err = waiting[0].communicate(timeout=60)
    assert (out.strip(), waiting[0].returncode) == ("ran", 0), err
    assert site.run("payout", "b1").stdout.strip() == "already done"
    with raw_connect(site.url) as conn:
        count = conn.execute("SELECT COUNT(*) FROM shop_payout WHERE batch = 'b1'").fetchone()
    assert count[0] == 1


def test_purge_removes_the_rows_of_released_locks_and_keeps_once_records(site: Site) -> None:
    assert site.run("payout", "b2").stdout.strip() == "ran"
    assert site.get("/report/purged/") == [(200, {"report": "purged"})]
    assert re.fullmatch(r"purged \d+ rows?\n", site.run("dblock", "purge").stdout)
    with raw_connect(site.url) as conn:
        left = conn.execute(
            "SELECT COUNT(*) FROM dblock_locks WHERE lock_key = 'report:purged'"
        ).fetchone()
    assert left[0] == 0
    # once records stay: the payout cannot run again by accident
    assert site.run("payout", "b2").stdout.strip() == "already done"


def test_manage_py_test_runs_the_projects_tests_on_its_test_database(site: Site) -> None:
    if _dialect(site) == "sqlite":  # Django's default test database is in memory
        site.databases["default"]["TEST"] = {"NAME": str(site.tmp / "test-shop.sqlite3")}
    try:
        done = site.run("test", "shop", "--no-input", status=None)
    finally:
        site.databases["default"].pop("TEST", None)
    # dblock's runner closed the client's connections, so Django could drop its test database
    # (PostgreSQL refuses while others are connected: the run would end in an error)
    assert done.returncode == 0, done.stderr
    assert "Ran 2 tests" in done.stderr
    if _dialect(site) == "sqlite":
        assert not (site.tmp / "test-shop.sqlite3").exists()
    else:
        test_db = "test_" + site.databases["default"]["NAME"]
        with raw_connect(POSTGRESQL_URL) as conn:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [test_db])
            assert found.fetchone() is None


def test_a_forked_child_locks_with_the_client_its_parent_made(site: Site) -> None:
    # the child sees the parent's hold as someone else's, and takes a key of its own
    assert site.run("forked").stdout.strip() == "child exited 0"
