"""The contract suite: every documented behaviour of API.md, run against each store.

Every test here runs once per provider (tests/providers.py): ``provider`` is that store,
bound to this test. A test that needs more than the store contract's required part declares
it with ``@pytest.mark.needs("Capability", ...)`` and is skipped, by capability, where the
provider lacks it ("provider X lacks Y"); no test here names a store.

``table``, ``client`` and ``db_url`` are this directory's versions of the root fixtures, made
from ``provider``: ``db_url`` is for what reaches the store by URL from elsewhere (a worker
process, the CLI) and needs the ``processes`` capability.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import dblock
from tests.providers import PROVIDERS, Provider, bind, fresh_table


@pytest.fixture(params=PROVIDERS, ids=[entry.name for entry in PROVIDERS])
def provider(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Provider:
    bound = bind(request.param, tmp_path_factory.mktemp("db"))
    for marker in request.node.iter_markers("needs"):
        bound.require(*marker.args)
    return bound


@pytest.fixture
def table(provider: Provider) -> Iterator[str]:
    """A fresh lock table name for this test, dropped afterwards."""
    name = fresh_table()
    yield name
    provider.drop(name)


@pytest.fixture
def client(provider: Provider, table: str) -> Iterator[dblock.Client]:
    with provider.connect(table=table) as c:
        yield c


@pytest.fixture
def db_url(provider: Provider) -> str:
    """The store's URL, for other processes and the CLI."""
    provider.require("processes")
    assert provider.url is not None
    return provider.url
