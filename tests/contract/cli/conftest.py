"""The real ``dblock`` command in subprocesses, against each provider with the ``cli``
capability (the helpers are tests/cli's). The command is the blocking client's: these tests
need ``blocking`` (they are not repeated with the async client)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.conftest import WAIT, Dblock, alive, finish, wait_for
from tests.providers import Provider

__all__ = ["WAIT", "Dblock", "alive", "finish", "wait_for"]


@pytest.fixture(autouse=True)
def _blocking_only(provider: Provider) -> None:
    provider.require("blocking")


@pytest.fixture
def cli(provider: Provider, table: str, tmp_path: Path) -> Iterator[Dblock]:
    provider.require("cli", "processes")
    assert provider.url is not None
    work = tmp_path / "work"
    work.mkdir()
    runner = Dblock(provider.url, table, work)
    yield runner
    runner.cleanup()
