"""The contract suite: every documented behaviour of API.md, run against each store.

Every test here runs once per provider (tests/providers.py): ``provider`` is that store,
bound to this test. A test that needs more than the store contract's required part declares
it with ``@pytest.mark.needs("Capability", ...)`` and is skipped, by capability, where the
provider lacks it ("provider X lacks Y"); no test here names a store.

Every such test also runs in both client modes, ``[sync]`` and ``[async]`` (``client_mode``):
``client`` and ``provider.connect`` give a blocking client, or a blocking facade over the async
client (tests/_async_facade.py), so one test proves a behaviour of both APIs. A test that
only means something for the blocking client says ``needs("blocking")`` (tests/providers.py).

``table``, ``client`` and ``db_url`` are this directory's versions of the root fixtures, made
from ``provider``: ``db_url`` is for what reaches the store by URL from elsewhere (a worker
process, the CLI) and needs the ``processes`` capability.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import dblock
from tests.providers import CLIENT_MODES, PROVIDERS, Provider, bind, fresh_table


@pytest.hookimpl(tryfirst=True)  # before -m picks the serial ones
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave out each provider's runs in a client mode it does not run in (Entry.modes);
    mark ``serial`` the runs of a ``serial_where(*capabilities)`` test on a provider with one
    of those harness capabilities."""
    kept, left_out = [], []
    for item in items:
        params = getattr(item, "callspec", None)
        entry = params.params.get("provider") if params is not None else None
        mode = params.params.get("client_mode") if params is not None else None
        for marker in item.iter_markers("serial_where"):
            if entry is not None and entry.markers & set(marker.args):
                item.add_marker(pytest.mark.serial)
        if entry is not None and mode is not None and mode not in entry.modes:
            left_out.append(item)
        else:
            kept.append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept


@pytest.fixture(params=CLIENT_MODES)
def client_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The client the test drives; in the async mode the worker processes
    (tests/_worker.py) use the async client too, and afterwards nothing may be left running
    on the facade's event loop."""
    mode = str(request.param)
    if mode == "sync":
        yield mode
        return
    from tests import _async_facade

    monkeypatch.setenv("DBLOCK_TEST_CLIENT", "async")
    try:
        yield mode
    finally:
        left = _async_facade.shutdown()
    assert not left, f"left running by the async client: {left}"


@pytest.fixture(params=PROVIDERS, ids=[entry.name for entry in PROVIDERS])
def provider(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    client_mode: str,
) -> Provider:
    if request.param.tune is not None:
        request.param.tune(monkeypatch)
    bound = bind(request.param, tmp_path_factory.mktemp("db"), client_mode)
    if client_mode == "async":
        bound.require("asyncio")
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
