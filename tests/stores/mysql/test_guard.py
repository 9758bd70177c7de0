"""CommitGuards on MySQL/MariaDB (lock.guard(conn), issue 50), at the store level: the guard's
statement run in an application's own transaction on a raw PyMySQL connection, beside a
dblock client on the same database."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pymysql
import pytest

import dblock
from dblock.stores.mysql.store import MysqlStore
from tests._internals import store_of
from tests._servers import MYSQL_URL, drop_tables, raw_connect

#: a lease that runs out during the test, and the wait that outlasts it
SHORT, PAST = 1.0, 1.4
#: how long a statement blocked by the guard is seen to wait
BLOCKED = 0.5
#: another database of the same server
OTHER_DB = "dblock_guard_other"


def _app(database: str | None = None) -> Any:
    """The application's own connection, as it would open it: a transaction per statement
    group (autocommit off), on the test database or ``database``."""
    parts = urlsplit(MYSQL_URL)
    return pymysql.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 3306,
        user=parts.username or "root",
        password=parts.password or "",
        database=database or parts.path.lstrip("/"),
        autocommit=False,
        connect_timeout=5,
        charset="utf8mb4",
    )


@pytest.fixture
def client(table: str) -> Iterator[dblock.Client]:
    with dblock.connect(MYSQL_URL, table=table) as c:
        yield c


@pytest.fixture
def store(client: dblock.Client) -> MysqlStore:
    backend = store_of(client)
    assert isinstance(backend, MysqlStore)
    return backend


@pytest.fixture
def app() -> Iterator[Any]:
    conn = _app()
    yield conn
    conn.close()


def _guard(app: Any, store: MysqlStore, owner: str, tokens: Mapping[str, int]) -> list[int]:
    """The guard's statement on ``app``'s connection, in its open transaction: the tokens of
    the rows it read (one per live hold)."""
    params: dict[str, Any] = {"owner": owner}
    for i, (key, token) in enumerate(tokens.items()):
        params[f"k{i}"], params[f"t{i}"] = key, token
    with app.cursor() as cur:
        cur.execute(store.guard_sql(len(tokens)), params)
        return sorted(int(row[0]) for row in cur.fetchall())


def _key() -> str:
    return f"g-{uuid.uuid4().hex}"


def _held(client: dblock.Client, ttl: float = 30.0) -> tuple[str, str, int]:
    """A new key held by ``client``: (key, owner, token)."""
    key = _key()
    lock = client.lock(key, ttl=ttl)
    assert lock.acquire(blocking=False)
    assert lock.token is not None
    return key, lock.owner, lock.token


def test_the_guard_reads_one_row_per_live_hold_of_its_owner(
    client: dblock.Client, store: MysqlStore, app: Any
) -> None:
    """Each live hold named with its owner and token is one row; a wrong token, another
    owner's hold or a lease run out is none."""
    many = client.lock_many([_key(), _key(), _key()], ttl=30)
    assert many.acquire(blocking=False)
    tokens = many.tokens
    assert tokens is not None
    expired, expired_owner, expired_token = _held(client, ttl=SHORT)
    other, other_owner, other_token = _held(client)
    time.sleep(PAST)
    try:
        assert store.guard_paramstyle == "pyformat" and store.guard_counts == "rows"
        assert _guard(app, store, many.owner, tokens) == sorted(tokens.values())
        for key, token in tokens.items():
            assert _guard(app, store, many.owner, {key: token}) == [token]
        first, second, third = sorted(tokens)
        wrong = {first: tokens[first], second: tokens[second] + 1, third: tokens[third]}
        assert _guard(app, store, many.owner, wrong) == sorted([tokens[first], tokens[third]])
        assert _guard(app, store, other_owner, tokens) == [], "another owner's statement"
        assert _guard(app, store, many.owner, {other: other_token}) == [], "another's hold"
        assert _guard(app, store, other_owner, {other: other_token}) == [other_token]
        assert _guard(app, store, expired_owner, {expired: expired_token}) == [], "run out"
        assert _guard(app, store, many.owner, {_key(): 1}) == [], "a key without a row"
    finally:
        app.rollback()
        many.release()


@pytest.mark.parametrize("end", ["commit", "rollback"])
def test_a_guarded_hold_is_not_taken_over_before_the_transaction_ends(
    client: dblock.Client, store: MysqlStore, app: Any, table: str, end: str
) -> None:
    """The guard's row lock outlives the lease: another client's try at the expired key waits
    for the application's transaction, and takes the key once it commits or rolls back."""
    key, owner, token = _held(client, ttl=SHORT)
    assert _guard(app, store, owner, {key: token}) == [token]
    time.sleep(PAST)
    result: list[bool] = []
    with dblock.connect(MYSQL_URL, table=table) as other:
        taker = threading.Thread(
            target=lambda: result.append(other.lock(key, ttl=30).acquire(blocking=False))
        )
        taker.start()
        taker.join(BLOCKED)
        try:
            assert taker.is_alive(), f"taken over ({result}) while the guard held the row"
            assert result == []
        finally:
            app.commit() if end == "commit" else app.rollback()
            taker.join(30)
        assert result == [True], "the key is taken once the transaction has ended"
        found = store.info(key)
        assert found is not None and found.owner != owner and found.token > token


@pytest.mark.parametrize("end", ["commit", "rollback"])
def test_force_release_waits_for_the_guarded_transaction(
    client: dblock.Client, store: MysqlStore, app: Any, end: str
) -> None:
    key, owner, token = _held(client)
    assert _guard(app, store, owner, {key: token}) == [token]
    freed: list[bool] = []
    ender = threading.Thread(target=lambda: freed.append(client.force_release(key)))
    ender.start()
    ender.join(BLOCKED)
    try:
        assert ender.is_alive(), "force_release changed a row the guard holds"
        assert store.info(key) is not None
    finally:
        app.commit() if end == "commit" else app.rollback()
        ender.join(30)
    assert freed == [True]
    assert store.info(key) is None


def test_renew_after_guard_extends_a_lapsed_hold_still_its_owners(
    client: dblock.Client, store: MysqlStore
) -> None:
    """A lease that ran out, the row still naming owner and token: extended ttl s from now
    (on the server's clock), and held again; again on a second call (a retry)."""
    key, owner, token = _held(client, ttl=SHORT)
    time.sleep(PAST)
    assert store.info(key) is None, "the lease has run out"
    for _ in range(2):
        assert store.renew_after_guard({key: token}, owner, 30)
        found = store.info(key)
        assert found is not None and (found.owner, found.token) == (owner, token)
        assert found.expires_at is not None
        assert found.expires_at > datetime.now(timezone.utc) + timedelta(seconds=20)


def test_renew_after_guard_refuses_a_key_it_no_longer_holds(
    client: dblock.Client, store: MysqlStore, table: str
) -> None:
    taken, taken_owner, taken_token = _held(client, ttl=SHORT)
    freed, freed_owner, freed_token = _held(client)
    time.sleep(PAST)
    with dblock.connect(MYSQL_URL, table=table) as other:
        assert other.lock(taken, ttl=30).acquire(blocking=False)
    assert client.force_release(freed)
    assert not store.renew_after_guard({taken: taken_token}, taken_owner, 30), "taken"
    found = store.info(taken)
    assert found is not None and found.owner != taken_owner
    assert not store.renew_after_guard({freed: freed_token}, freed_owner, 30), "freed"
    assert store.info(freed) is None
    assert not store.renew_after_guard({_key(): 1}, freed_owner, 30), "no row"


def test_renew_after_guard_of_several_keys_is_true_only_if_each_was_extended(
    client: dblock.Client, store: MysqlStore
) -> None:
    many = client.lock_many([_key(), _key(), _key()], ttl=SHORT)
    assert many.acquire(blocking=False)
    tokens, owner = many.tokens, many.owner
    assert tokens is not None
    time.sleep(PAST)
    assert store.renew_after_guard(tokens, owner, 30)
    assert all(store.info(k) is not None for k in tokens)
    _, second, third = sorted(tokens)
    assert not store.renew_after_guard({**tokens, second: tokens[second] + 1}, owner, 30)
    assert not store.renew_after_guard({**tokens, _key(): 1}, owner, 30), "a key without a row"
    assert client.force_release(third)
    assert not store.renew_after_guard(tokens, owner, 30), "one of them force-released"


@pytest.fixture
def other_database() -> str:
    """Another database of the server (kept: made once, by whichever test needs it first)."""
    raw = raw_connect(MYSQL_URL)
    try:
        raw.cursor().execute(f"CREATE DATABASE IF NOT EXISTS `{OTHER_DB}`")
    finally:
        raw.close()
    return OTHER_DB


def _identity_on(store: MysqlStore, conn: Any) -> str | None:
    with conn.cursor() as cur:
        cur.execute(store.guard_identity_sql())
        return store.guard_identity(cur.fetchone())


def test_the_guard_identity_names_the_stores_database(
    store: MysqlStore, app: Any, other_database: str
) -> None:
    """A connection to the lock table's database is the store's; one to another database of
    the same server is not."""
    assert store.identity() is not None
    assert _identity_on(store, app) == store.identity()
    elsewhere = _app(other_database)
    try:
        assert _identity_on(store, elsewhere) != store.identity()
    finally:
        elsewhere.close()


def test_a_qualified_table_is_in_its_own_database_whatever_the_connections(
    app: Any, other_database: str
) -> None:
    """A table named ``db.table`` is in ``db``: the store's identity names it, and so does
    the guard on a connection to any database of that server (the guard's statement names
    the table with its database)."""
    name = "t_" + uuid.uuid4().hex[:16]
    try:
        with dblock.connect(MYSQL_URL, table=f"{other_database}.{name}") as qualified:
            backend = store_of(qualified)
            identity = backend.identity()
            assert identity is not None and identity.endswith(f" {other_database}")
            assert _identity_on(backend, app) == identity
            assert f"`{other_database}`.`{name}`" in backend.guard_sql(1)
    finally:
        drop_tables(urlunsplit(urlsplit(MYSQL_URL)._replace(path=f"/{other_database}")), name)
