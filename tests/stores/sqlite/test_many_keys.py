"""ManyKeys on SQLite: the SQL stores' cases (tests/stores/_sql_many_keys.py), on a file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import dblock
from tests._internals import store_of
from tests.stores._sql_many_keys import *  # noqa: F403 - the cases
from tests.stores._sql_many_keys import TTL, _keys


@pytest.fixture
def many_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/many.sqlite3"


def test_subscribe_many_wakes_at_a_release_of_any_key(
    many: tuple[dblock.Client, Any], many_url: str, many_table: str
) -> None:
    """The waiter's change watch (the single-key one): another client's release of any of
    its keys, a commit to the file, wakes it."""
    _, store = many
    keys = _keys(2)
    with dblock.connect(many_url, table=many_table) as other:
        holder = store_of(other)
        for key in keys:
            token = holder.acquire(key, "h", TTL, "lock")
            sub = store.subscribe_many(keys, "m")
            assert sub is not None
            try:
                assert sub.live and not sub.wait(0.2), "nothing committed yet"
                assert holder.release(key, "h", token)
                assert sub.wait(5)
            finally:
                sub.close()
