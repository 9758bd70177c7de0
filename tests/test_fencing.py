"""dblock.fencing: the statements it builds, and the arguments it refuses (no store; the
guarded UPDATE against each store is tests/contract/test_fencing.py)."""

from __future__ import annotations

from typing import Any

import pytest

import dblock
import dblock.fencing


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
        'WHERE "sku" = %s AND "wh" = %s AND ("tok" IS NULL OR "tok" <= %s)'
    )
    assert stmt.params([1, "x"], ["s", "w"], 9) == (1, "x", 9, "s", "w", 9)
    mysql = dblock.fencing.fenced_update("mariadb", "t", [], ["id"])
    assert mysql.sql == (
        "UPDATE `t` SET `fence_token` = %s WHERE `id` = %s "
        "AND (`fence_token` IS NULL OR `fence_token` <= %s)"
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
