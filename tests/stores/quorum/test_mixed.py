"""A quorum of three different stores (a SQLite file, a PostgreSQL database, a MariaDB one):
processes take turns exactly, with rising tokens, and each store holds the same grant."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

import dblock
from dblock._contract import FencedGrants
from tests._internals import store_of
from tests._servers import MYSQL_URL, POSTGRESQL_URL, drop_tables, require_server
from tests.providers import QUORUM_PG_DATABASES, fresh_table, quorum_pg_check
from tests.stores.quorum.test_faults import count_in_processes

pytestmark = pytest.mark.slow


@pytest.fixture
def mixed(tmp_path: Path) -> Iterator[tuple[list[str], str]]:
    require_server("mysql", MYSQL_URL)
    quorum_pg_check(None)
    pg = urlunsplit(urlsplit(POSTGRESQL_URL)._replace(path="/" + QUORUM_PG_DATABASES[0]))
    urls = [f"sqlite:///{tmp_path}/member.sqlite3", pg, MYSQL_URL]
    table = fresh_table()
    yield urls, table
    for url in urls:
        drop_tables(url, table)


def test_a_mixed_quorum_grants_the_same_token_on_every_store(
    mixed: tuple[list[str], str],
) -> None:
    urls, table = mixed
    with dblock.connect(urls, table=table) as client:
        for _ in range(3):
            with client.lock("k", ttl=10) as lock:
                for url in urls:
                    with dblock.connect(url, table=table) as member:
                        info = member.info("k")
                        assert info is not None
                        assert (info.owner, info.token) == (lock.owner, lock.token)


def test_each_kind_of_store_floors_its_fence_by_its_clock_in_microseconds(
    mixed: tuple[list[str], str],
) -> None:
    urls, table = mixed
    for url in urls:  # the servers share this host's clock; a second of slack for rounding
        with dblock.connect(url, table=table) as client:
            store = store_of(client)
            assert isinstance(store, FencedGrants)
            now_us = time.time_ns() // 1000
            assert store.fence("never granted") >= now_us - 1_000_000, url


def test_processes_take_turns_on_a_mixed_quorum(
    mixed: tuple[list[str], str], tmp_path: Path
) -> None:
    urls, table = mixed
    count_in_processes(" ".join(urls), table, tmp_path)
