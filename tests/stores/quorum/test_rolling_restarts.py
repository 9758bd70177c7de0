"""Every store that knew a key's fence loses it, one after another (restarted empty, replaced
by an empty database), while the last one is unreachable: the quorum's next token is still
above every token it issued, because each store's fence read is floored by its clock."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import dblock
from tests._proxy import Proxy
from tests._servers import POSTGRESQL_URL, drop_tables
from tests.providers import QUORUM_PG_DATABASES, fresh_table, quorum_pg_check
from tests.stores.quorum.test_faults import _sqlite_trio, _unreadable

GRANTS = 5


def _grant_five(client: dblock.Client) -> list[int]:
    tokens = []
    for _ in range(GRANTS):
        with client.lock("k", ttl=10) as lock:
            assert lock.token is not None
            tokens.append(lock.token)
    assert tokens == sorted(set(tokens))
    return tokens


def _next_token(client: dblock.Client) -> int:
    with client.lock("k", ttl=10, timeout=5) as lock:
        assert lock.token is not None
        return lock.token


def test_redis_restarted_empty_one_after_another_sends_no_token_backwards(
    redis_trio: list[Any],
) -> None:
    a, b, c = redis_trio
    with dblock.connect([s.url for s in redis_trio], table=fresh_table()) as client:
        before = _grant_five(client)
        a.kill()
        a.start()  # empty
        b.kill()
        b.start()  # empty: only c knows the fence now
        c.kill()
        token = _next_token(client)  # granted by a and b, which remember nothing
    assert token > max(before), f"token {token} after {before}"


def test_sqlite_files_replaced_by_empty_ones_send_no_token_backwards(tmp_path: Path) -> None:
    urls = _sqlite_trio(tmp_path)
    table = fresh_table()
    with dblock.connect(urls, table=table) as client:
        before = _grant_five(client)
    for url in urls[:2]:  # one after the other, each by an empty file
        path = Path(url.removeprefix("sqlite:///"))
        for part in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            part.unlink(missing_ok=True)
        path.touch()
    _unreadable(urls[2])
    with dblock.connect(urls, table=table) as client:
        token = _next_token(client)
    assert token > max(before), f"token {token} after {before}"


def test_postgresql_databases_emptied_one_after_another_send_no_token_backwards(
    tmp_path: Path,
) -> None:
    quorum_pg_check(None)
    base = urlsplit(POSTGRESQL_URL)
    urls = [urlunsplit(base._replace(path="/" + db)) for db in QUORUM_PG_DATABASES]
    table = fresh_table()
    try:
        with Proxy(base.hostname or "127.0.0.1", base.port or 5432, tmp_path / "proxy") as proxy:
            # the third database through a proxy, which then goes away: it is unreachable
            user = f"{base.username}@" if base.username else ""
            third = urlunsplit(urlsplit(urls[2])._replace(netloc=f"{user}127.0.0.1:{proxy.port}"))
            members = [*urls[:2], third]
            with dblock.connect(members, table=table) as client:
                before = _grant_five(client)
            drop_tables(urls[0], table)  # an empty database, then another
            drop_tables(urls[1], table)
            proxy.close()
            with dblock.connect(members, table=table) as client:
                token = _next_token(client)
        assert token > max(before), f"token {token} after {before}"
    finally:
        for url in urls:
            drop_tables(url, table)
