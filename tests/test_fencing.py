"""dblock.fencing: the guarded UPDATE rejects stale tokens on every backend."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

import dblock
import dblock.fencing
from tests._servers import raw_connect


@pytest.fixture
def resource(db_url: str) -> Iterator[tuple[Any, str, str]]:
    """A protected table (id, balance, fence_token) with rows 1 and 2, dropped afterwards."""
    name = "fenced_" + uuid.uuid4().hex[:12]
    scheme = urlsplit(db_url).scheme
    dialect = {"postgres": "postgresql", "mariadb": "mysql"}.get(scheme, scheme)
    q = "`" if dialect == "mysql" else '"'
    conn = raw_connect(db_url)
    cur = conn.cursor()
    cur.execute(
        f"CREATE TABLE {q}{name}{q} (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL, "
        "fence_token BIGINT)"
    )
    cur.execute(f"INSERT INTO {q}{name}{q} (id, balance, fence_token) VALUES (1, 100, NULL)")
    cur.execute(f"INSERT INTO {q}{name}{q} (id, balance, fence_token) VALUES (2, 100, 0)")
    try:
        yield conn, dialect, name
    finally:
        conn.cursor().execute(f"DROP TABLE IF EXISTS {q}{name}{q}")
        conn.close()


def _row(conn: Any, dialect: str, name: str, rid: int) -> tuple[int, int | None]:
    q = "`" if dialect == "mysql" else '"'
    mark = "?" if dialect == "sqlite" else "%s"
    cur = conn.cursor()
    cur.execute(f"SELECT balance, fence_token FROM {q}{name}{q} WHERE id = {mark}", (rid,))
    balance, token = cur.fetchone()
    return int(balance), None if token is None else int(token)


def test_stale_token_rejected_newer_accepted(resource: tuple[Any, str, str]) -> None:
    conn, dialect, name = resource
    stmt = dblock.fencing.fenced_update(dialect, name, ["balance"], ["id"])
    cur = conn.cursor()
    assert stmt.execute(cur, [90], [1], 5)  # NULL token: first write accepted
    assert _row(conn, dialect, name, 1) == (90, 5)
    assert not stmt.execute(cur, [80], [1], 4)  # stale
    assert not stmt.execute(cur, [80], [1], 5)  # equal is stale too
    assert _row(conn, dialect, name, 1) == (90, 5)
    assert stmt.execute(cur, [70], [1], 6)
    assert _row(conn, dialect, name, 1) == (70, 6)
    assert _row(conn, dialect, name, 2) == (100, 0)  # other rows untouched
    assert not stmt.execute(cur, [1], [3], 99)  # a missing row reads as rejected


def test_with_real_lock_tokens(db_url: str, table: str, resource: tuple[Any, str, str]) -> None:
    """The pattern from the docs: an earlier hold's token loses to a later one."""
    conn, dialect, name = resource
    stmt = dblock.fencing.fenced_update(dialect, name, ["balance"], ["id"])
    with dblock.connect(db_url, table=table) as client:
        assert client.dialect == dialect
        first = client.lock("acct:2", ttl=0.2)
        assert first.acquire(timeout=5)
        old = first.token
        assert old is not None
        second = client.lock("acct:2", ttl=5, reentrant=False)
        assert second.acquire(timeout=10)  # after the first lease ran out
        new = second.token
        assert new is not None
        assert new > old
        cur = conn.cursor()
        assert stmt.execute(cur, [50], [2], new)
        assert not stmt.execute(cur, [999], [2], old)  # the paused first holder wakes up
        assert _row(conn, dialect, name, 2) == (50, new)
        second.release()
        with pytest.raises(dblock.LockLost):
            first.release()


def test_composite_key_and_schema_and_aliases() -> None:
    stmt = dblock.fencing.fenced_update(
        "postgres",
        "app.stock",
        ["qty", "note"],
        ["sku", "wh"],
        token_column="tok",  # noqa: S106
    )
    assert stmt.sql == (
        'UPDATE "app"."stock" SET "qty" = %s, "note" = %s, "tok" = %s '
        'WHERE "sku" = %s AND "wh" = %s AND ("tok" IS NULL OR "tok" < %s)'
    )
    assert stmt.params([1, "x"], ["s", "w"], 9) == (1, "x", 9, "s", "w", 9)
    mysql = dblock.fencing.fenced_update("mariadb", "t", [], ["id"])
    assert mysql.sql == (
        "UPDATE `t` SET `fence_token` = %s WHERE `id` = %s "
        "AND (`fence_token` IS NULL OR `fence_token` < %s)"
    )
    lite = dblock.fencing.fenced_update("sqlite", "t", ["a"], ["id"])
    assert "?" in lite.sql
    assert "%s" not in lite.sql


@pytest.mark.parametrize(
    ("dialect", "table", "sets", "keys", "token"),
    [
        ("oracle", "t", ["a"], ["id"], "fence_token"),
        ("", "t", ["a"], ["id"], "fence_token"),
        ("sqlite", "t; DROP TABLE x", ["a"], ["id"], "fence_token"),
        ("sqlite", 't"', ["a"], ["id"], "fence_token"),
        ("sqlite", "a.b.c", ["a"], ["id"], "fence_token"),
        ("sqlite", "1t", ["a"], ["id"], "fence_token"),
        ("sqlite", "t" * 64, ["a"], ["id"], "fence_token"),
        ("sqlite", "", ["a"], ["id"], "fence_token"),
        ("mysql", "t", ["a`b"], ["id"], "fence_token"),
        ("mysql", "t", ["a b"], ["id"], "fence_token"),
        ("mysql", "t", "abc", ["id"], "fence_token"),
        ("mysql", "t", ["a"], [], "fence_token"),
        ("mysql", "t", ["a"], ["id = 1 OR 1"], "fence_token"),
        ("mysql", "t", ["a"], ["id"], "tok'en"),
        ("mysql", "t", ["a"], ["id"], ""),
        ("postgresql", "t", ["a", "a"], ["id"], "fence_token"),
        ("postgresql", "t", ["a"], ["id"], "a"),
        ("postgresql", "t", ["fence_token"], ["id"], "fence_token"),
        ("postgresql", "t", ["a"], ["ID"], "id"),
        ("postgresql", "t", [1], ["id"], "fence_token"),
        ("postgresql", None, ["a"], ["id"], "fence_token"),
        ("postgresql", "t", ["é"], ["id"], "fence_token"),
    ],
)
def test_bad_identifiers_refused(
    dialect: Any, table: Any, sets: Any, keys: Any, token: Any
) -> None:
    with pytest.raises(dblock.ConfigurationError):
        dblock.fencing.fenced_update(dialect, table, sets, keys, token_column=token)


def test_params_checked() -> None:
    stmt = dblock.fencing.fenced_update("sqlite", "t", ["a"], ["id"])
    with pytest.raises(ValueError, match="value"):
        stmt.params([1, 2], [1], 3)
    with pytest.raises(ValueError, match="key"):
        stmt.params([1], [], 3)
    with pytest.raises(TypeError):
        stmt.params([1], [1], None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        stmt.params([1], [1], True)


def test_not_reexported() -> None:
    assert "fencing" not in dblock.__all__
