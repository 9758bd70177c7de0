"""Fixtures of the etcd store's own tests: the machine's node, and private clusters."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests._servers import ETCD_URL, drop_tables, require_server
from tests.providers import fresh_table
from tests.stores.etcd._cluster import Cluster, private_cluster


@pytest.fixture
def url() -> str:
    require_server("etcd", ETCD_URL)
    return ETCD_URL


@pytest.fixture
def table(url: str) -> Iterator[str]:
    name = fresh_table()
    yield name
    drop_tables(url, name)


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    """A private 3-node cluster, for what a test may do to its nodes."""
    with private_cluster() as found:
        yield found
