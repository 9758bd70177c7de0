"""An election's observer cut off from the store (a network that drops every packet, through
tests/_proxy.py) keeps observing: once the store is reachable again it yields the leader of
that moment, though two terms came and went meanwhile, and it never raises for the outage.
The observer's code is the same on every store; PostgreSQL stands for them."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

import dblock
from tests._proxy import Proxy
from tests._servers import POSTGRESQL_URL, drop_tables, require_server


@pytest.fixture
def table() -> Iterator[str]:
    require_server("postgresql", POSTGRESQL_URL)
    name = "t_" + uuid.uuid4().hex[:16]
    yield name
    drop_tables(POSTGRESQL_URL, name)


def test_an_observer_cut_off_for_two_terms_yields_the_latest_once_back(
    table: str, tmp_path: Path
) -> None:
    parts = urlsplit(POSTGRESQL_URL)
    name = "e-" + uuid.uuid4().hex[:8]
    with Proxy(parts.hostname or "127.0.0.1", parts.port or 5432, tmp_path / "proxy") as proxy:
        netloc = parts.netloc.rsplit("@", 1)[0] + f"@127.0.0.1:{proxy.port}"
        cut_url = urlunsplit(parts._replace(netloc=netloc))
        seen: list[dblock.LeaderInfo | None] = []
        errors: list[BaseException] = []
        with (
            dblock.connect(POSTGRESQL_URL, table=table) as direct,
            dblock.connect(cut_url, table=table) as cut,
        ):
            first = direct.election(name, ttl=30).campaign(value="first")
            changes = cut.election(name).observe()
            assert next(changes) == direct.election(name).leader()
            got_latest = threading.Event()

            def follow() -> None:
                try:
                    for leader in changes:
                        seen.append(leader)
                        if leader is not None and leader.value == "third":
                            got_latest.set()
                            return
                except BaseException as exc:
                    errors.append(exc)

            watcher = threading.Thread(target=follow, daemon=True)
            watcher.start()
            proxy.blackhole()
            first.resign()
            second = direct.election(name, ttl=30).campaign(value="second")
            second.resign()
            third = direct.election(name, ttl=30).campaign(value="third")
            (tmp_path / "proxy" / "blackhole").unlink()  # the network is back
            assert got_latest.wait(60), (seen, errors)
            watcher.join(5)
            third.resign()
    assert errors == []
    assert seen[-1] is not None and (seen[-1].value, seen[-1].token) == ("third", third.token)
    assert all(s is None or s.value != "second" for s in seen)  # never seen: it came and went
