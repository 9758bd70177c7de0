"""Fixtures of the ZooKeeper store's own tests: the machine's server, and a private ensemble
shared by a module's tests (a JVM is slow to start)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._servers import ZOOKEEPER_URL, drop_tables, require_server
from tests._zk_ensemble import Ensemble, private_ensemble
from tests.providers import fresh_table


@pytest.fixture
def url() -> str:
    require_server("zookeeper", ZOOKEEPER_URL)
    return ZOOKEEPER_URL


@pytest.fixture
def table(url: str) -> Iterator[str]:
    name = fresh_table()
    yield name
    drop_tables(url, name)


@pytest.fixture(scope="module")
def ensemble(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ensemble]:
    """A private 3-server ensemble for the module; a test that kills servers starts them
    again before it ends (``ensemble.start_all()``)."""
    root: Path = tmp_path_factory.mktemp("zk") / "ensemble"
    with private_ensemble(root) as e:
        yield e
