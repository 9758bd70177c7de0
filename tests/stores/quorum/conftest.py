"""Fixtures of the quorum's own tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._private_servers import private_redis


@pytest.fixture
def redis_trio(tmp_path: Path) -> Iterator[list[Any]]:
    """Three private Redis servers of this test's (nothing on disk: a restart forgets all)."""
    with contextlib.ExitStack() as stack:
        servers = []
        for i in range(3):
            root = tmp_path / f"redis{i}"
            root.mkdir()
            servers.append(stack.enter_context(private_redis(root)))
        yield servers
