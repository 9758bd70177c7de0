"""dblock.connect(engine) / connect_async(async_engine): locks, lists and fences through a real
engine; statements on connections of the engine's pool (psycopg 3, sqlite3), given back as they
were; dblock's own store beside the engine for other drivers."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

import dblock
import dblock.fencing
from tests._servers import drop_tables, require_server
from tests.integrations.sqlalchemy._engines import Checkouts, dblock_url, engine_url

sa = pytest.importorskip("sqlalchemy")

#: dialects whose engine lends its pooled connections to dblock (the others: see docs)
LENDING = {"sqlite", "postgresql"}


def _resource(conn: Any, dialect: str, name: str) -> None:
    """A table the lock protects, its one row never written (fence_token NULL)."""
    text = "VARCHAR(32)" if dialect == "mysql" else "TEXT"
    conn.exec_driver_sql(
        f"CREATE TABLE {name} (sku {text} PRIMARY KEY, stock INTEGER, fence_token BIGINT)"
    )
    conn.exec_driver_sql(f"INSERT INTO {name} (sku, stock) VALUES ('sku-1', 10)")


def test_lock_list_and_fence_through_an_engine(where: tuple[str, str, str]) -> None:
    dialect, tmp, table = where
    engine = sa.create_engine(engine_url(dialect, tmp))
    resource = f"r_{table}"
    checkouts = Checkouts(engine)
    try:
        with engine.begin() as conn:
            _resource(conn, dialect, resource)
        with dblock.connect(engine, table=table) as a, dblock.connect(engine, table=table) as b:
            assert a.dialect == dialect
            with a.lock("sku-1", ttl=30) as held:
                assert [i.key for i in b.list()] == ["sku-1"]
                assert not b.lock("sku-1", timeout=0).acquire()
                stale = held.token
            with b.lock("sku-1", ttl=30) as newer:
                assert newer.token > stale
                fence = newer.token
                update = dblock.fencing.fenced_update(
                    b.dialect, resource, set_columns=["stock"], key_columns=["sku"]
                )
                raw = engine.raw_connection()
                try:
                    cur = raw.cursor()
                    assert update.execute(cur, [9], ["sku-1"], newer.token)
                    # a write made under the older hold is refused by the resource
                    assert not update.execute(cur, [0], ["sku-1"], stale)
                    raw.commit()
                finally:
                    raw.close()
            assert b.list() == []
            # a session hold: PostgreSQL's on a connection of dblock's own beside the pool
            with a.lock("session", ttl=None):
                assert not b.lock("session", timeout=0).acquire()
            with b.lock("session", ttl=None, timeout=5):
                pass
        with engine.connect() as conn:
            row = conn.exec_driver_sql(f"SELECT stock, fence_token FROM {resource}").one()
        assert tuple(row) == (9, fence)
        # the engine's pool served dblock's statements where its driver is dblock's own
        assert (checkouts.count > 10) == (dialect in LENDING)
        assert engine.pool.checkedout() == 0
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {resource}")
        engine.dispose()


def test_borrowed_connections_go_back_as_they_were(tmp_path: Path) -> None:
    """A user's session settings, autocommit and row factory survive dblock's use of the
    connection: one pooled connection, set up by the application, serves both."""
    require_server("postgresql", dblock_url("postgresql", ""))
    table = "t_" + uuid.uuid4().hex[:16]
    pg = sa.create_engine(
        engine_url("postgresql", ""),
        pool_size=1,
        max_overflow=0,
        connect_args={"options": "-c synchronous_commit=local"},
    )
    lite = sa.create_engine(engine_url("sqlite", str(tmp_path)), pool_size=1, max_overflow=0)

    @sa.event.listens_for(lite, "connect")
    def _app_settings(conn: Any, _record: Any) -> None:
        conn.execute("PRAGMA busy_timeout = 1234")
        conn.execute("PRAGMA synchronous = OFF")

    def pg_state() -> tuple[Any, ...]:
        raw = pg.raw_connection()
        try:
            pid = raw.driver_connection.info.backend_pid
            cur = raw.cursor()
            cur.execute("SHOW synchronous_commit")
            setting = cur.fetchone()[0]
            state = (pid, setting, raw.driver_connection.autocommit)
            raw.rollback()
            return state
        finally:
            raw.close()

    def lite_state() -> tuple[Any, ...]:
        raw = lite.raw_connection()
        try:
            conn = raw.driver_connection
            return (
                id(conn),
                conn.isolation_level,
                conn.execute("PRAGMA busy_timeout").fetchone()[0],
                conn.execute("PRAGMA synchronous").fetchone()[0],
            )
        finally:
            raw.close()

    try:
        before = pg_state(), lite_state()
        assert before[0][1:] == ("local", False)
        assert before[1][2:] == (1234, 0)
        for engine in (pg, lite):
            with dblock.connect(engine, table=table) as client:
                with client.lock("k", ttl=30):
                    assert [i.key for i in client.list()] == ["k"]
                client.purge(older_than=0)
        # the same connections (same server process, same sqlite3 object), as they were
        assert (pg_state(), lite_state()) == before
    finally:
        drop_tables(dblock_url("postgresql", ""), table)
        pg.dispose()
        lite.dispose()


def _run_async(dialect: str, tmp: str, table: str) -> tuple[int, int]:
    """Lock, list and re-lock through an AsyncEngine; (the older token, the newer one)."""
    from sqlalchemy.ext.asyncio import create_async_engine

    async def main() -> tuple[int, int]:
        # the application's own session setting, which dblock's loans must leave as it is
        options = {"options": "-c synchronous_commit=local"} if dialect == "postgresql" else {}
        engine = create_async_engine(
            engine_url(dialect, tmp, asynchronous=True), connect_args=options
        )
        checkouts = Checkouts(engine)
        try:
            a = await dblock.connect_async(engine, table=table)
            b = await dblock.connect_async(engine, table=table)
            async with a, b:
                async with a.lock("k", ttl=30) as first:
                    assert [i.key for i in await b.list()] == ["k"]
                    assert not await b.lock("k", timeout=0).acquire()
                    older = first.token
                async with b.lock("k", ttl=30) as second:
                    newer = second.token
            assert (checkouts.count > 5) == (dialect == "postgresql")
            pool = engine.sync_engine.pool  # SQLAlchemy 2.0: aiosqlite's is a NullPool
            assert getattr(pool, "checkedout", lambda: 0)() == 0
            async with engine.connect() as conn:  # the pool's connections, as they were
                assert (await conn.exec_driver_sql("SELECT 1")).scalar() == 1
                if dialect == "postgresql":
                    shown = await conn.exec_driver_sql("SHOW synchronous_commit")
                    assert shown.scalar() == "local"
                    raw = await conn.get_raw_connection()
                    assert raw.driver_connection.autocommit is False
            return older, newer
        finally:
            await engine.dispose()

    return asyncio.run(main())


def test_an_async_engine(where: tuple[str, str, str]) -> None:
    dialect, tmp, table = where
    first, second = _run_async(dialect, tmp, table)
    assert second > first


def test_several_processes_contend_through_their_engines(
    where: tuple[str, str, str], tmp_path: Path
) -> None:
    """Three processes, each with its own engine (one async), increment a file under the lock:
    a lost update or a repeated token would show that two held it at once."""
    dialect, tmp, table = where
    counter, log = tmp_path / "counter", tmp_path / "log"
    counter.write_text("0")
    rounds = 15
    root = Path(__file__).resolve().parents[3]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integrations.sqlalchemy._worker",
                engine_url(dialect, tmp, asynchronous=mode == "async"),
                table,
                str(rounds),
                str(counter),
                str(log),
                mode,
            ],
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(root)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for mode in ("sync", "sync", "async")
    ]
    results = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, results, strict=True):
        assert p.returncode == 0, err
        if dialect in LENDING and "async" not in out:
            assert int(out.split()[-1]) >= rounds  # checkouts of its engine's pool
    assert int(counter.read_text()) == 3 * rounds
    tokens = [int(line) for line in log.read_text().split()]
    assert len(tokens) == 3 * rounds
    assert tokens == sorted(set(tokens))  # written under the lock: strictly increasing


def test_other_drivers_get_dblocks_own_store_beside_the_engine(tmp_path: Path) -> None:
    """psycopg2's connections are not dblock's driver's: dblock connects to the engine's
    database itself, its password kept out of every message."""
    pytest.importorskip("psycopg2")
    require_server("postgresql", dblock_url("postgresql", ""))
    table = "t_" + uuid.uuid4().hex[:16]
    url = engine_url("postgresql", "").replace("+psycopg", "+psycopg2")
    url = url.replace("postgres@", "postgres:s3cr%40t@")  # the server trusts any password
    engine = sa.create_engine(url)
    checkouts = Checkouts(engine)
    try:
        with dblock.connect(engine, table=table) as client:
            assert "s3cr" not in client.url
            assert "***" in client.url
            with client.lock("k", ttl=30) as held:
                assert held.token > 0
        assert checkouts.count == 0
    finally:
        drop_tables(dblock_url("postgresql", ""), table)
        engine.dispose()


def test_wrong_engines_are_refused_clearly(tmp_path: Path) -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    memory = sa.create_engine("sqlite://")
    with pytest.raises(dblock.ConfigurationError, match="in-memory SQLite"):
        dblock.connect(memory)
    async_engine = create_async_engine(engine_url("sqlite", str(tmp_path), asynchronous=True))
    with pytest.raises(dblock.ConfigurationError, match="connect_async"):
        dblock.connect(async_engine)
    sync_engine = sa.create_engine(engine_url("sqlite", str(tmp_path)))
    with pytest.raises(dblock.ConfigurationError, match=r"dblock\.connect\(engine\)"):
        asyncio.run(dblock.connect_async(sync_engine))
    with pytest.raises(dblock.ConfigurationError, match="URL or a SQLAlchemy Engine"):
        dblock.connect(sa.MetaData())  # type: ignore[arg-type]


def test_a_missing_driver_of_dblocks_is_named() -> None:
    """An engine on psycopg2 where dblock's own driver (psycopg 3) is not installed: the
    message names the extra to install, and no password."""
    pytest.importorskip("psycopg2")
    code = (
        "import sys; sys.modules['psycopg'] = None\n"  # as if it were not installed
        "import sqlalchemy as sa, dblock\n"
        "engine = sa.create_engine('postgresql+psycopg2://app:s3cret@127.0.0.1:1/db')\n"
        "try:\n"
        "    dblock.connect(engine)\n"
        "except dblock.ConfigurationError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'dblock[postgresql]'" in out.stdout
    assert "s3cret" not in out.stdout + out.stderr
