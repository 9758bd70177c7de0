"""MariaDB session holds (``ttl=None``) from the inside: the GET_LOCK names, the lease
statements' look for a session, the token sequence, the connections set aside for holds
(stores/mysql/session.py)."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import dblock
from dblock.stores._names import aux_name
from dblock.stores.mysql.store import MysqlStore
from tests._internals import store_of
from tests._servers import MYSQL_URL, raw_connect
from tests._worker import start as start_worker


def _backend(client: dblock.Client) -> MysqlStore:
    backend = store_of(client)
    assert isinstance(backend, MysqlStore)
    return backend


def _row(raw: Any, table: str, key: str) -> Any:
    raw.execute(f"SELECT owner, token FROM `{table}` WHERE lock_key = %s", (key,))
    return raw.fetchone()


def test_the_lock_name_fits_and_tells_keys_differing_in_case_apart(table: str) -> None:
    with dblock.connect(MYSQL_URL, table=table) as client:
        sessions = _backend(client)._sessions
        names = {sessions.name(k) for k in ("Key", "key", "KEY", "x" * 255, "ключ", "")}
        assert len(names) == 6 and all(len(name) <= 64 for name in names)
        # GET_LOCK compares names case-insensitively: the hash, not the key, tells them apart
        upper, lower = client.lock("Key", ttl=None), client.lock("key", ttl=None)
        assert upper.acquire(timeout=0) and lower.acquire(timeout=0)
        assert upper.token != lower.token
        upper.release()
        lower.release()


def test_a_lease_waiting_for_the_rows_lock_sees_a_session_taken_meanwhile(
    table: str, raw: Any
) -> None:
    """The lease statement checks for the session with the row locked, not before it waits
    for the row: a bare IS_USED_LOCK('name') in an UPDATE's WHERE is evaluated once, up
    front, and would let this lease in beside the session."""
    with dblock.connect(MYSQL_URL, table=table) as client:
        backend = _backend(client)
        with client.lock("k", ttl=10):  # the row exists, free after this
            pass
        blocker = raw_connect(MYSQL_URL)
        session = raw_connect(MYSQL_URL)
        try:
            blocker.begin()
            blocker.cursor().execute(f"SELECT owner FROM `{table}` WHERE lock_key = 'k' FOR UPDATE")
            for take in (
                lambda: backend.acquire("k", "lease-owner", 10.0, "lock"),
                lambda: backend.acquire_fair("k", "lease-owner", 10.0, False),
            ):
                got: list[int | None] = []
                leaser = threading.Thread(target=lambda t=take, g=got: g.append(t()))
                leaser.start()
                time.sleep(0.5)  # the lease statement waits for the row's lock
                cur = session.cursor()
                cur.execute("SELECT GET_LOCK(%s, 0)", (backend._sessions.name("k"),))
                assert cur.fetchone()[0] == 1  # as a session grant would, meanwhile
                blocker.commit()
                leaser.join(10)
                assert got == [None], "the lease was taken beside the session"
                cur.execute("DO RELEASE_LOCK(%s)", (backend._sessions.name("k"),))
                blocker.begin()
                blocker.cursor().execute(
                    f"SELECT owner FROM `{table}` WHERE lock_key = 'k' FOR UPDATE"
                )
            blocker.commit()
        finally:
            blocker.close()
            session.close()


def test_a_session_grant_waits_for_a_lease_being_taken_and_sees_it(table: str) -> None:
    """The grant reads the key's row with a lock: a lease's transaction in flight holds the
    row, the grant waits for its commit, then finds the lease and gives the lock back."""
    with dblock.connect(MYSQL_URL, table=table) as client:
        with client.lock("k", ttl=10):  # the row exists, free after this
            pass
        lease = raw_connect(MYSQL_URL)
        try:
            lease.begin()
            cur = lease.cursor()
            cur.execute(f"SELECT owner FROM `{table}` WHERE lock_key = 'k' FOR UPDATE")
            had: list[bool] = []
            session = client.lock("k", ttl=None)
            taker = threading.Thread(target=lambda: had.append(session.acquire(timeout=0)))
            taker.start()
            time.sleep(0.5)
            assert not had, "the grant did not wait for the row"
            cur.execute(
                f"UPDATE `{table}` SET owner = 'lease', expires_at = UTC_TIMESTAMP(6) + "
                "INTERVAL 10 SECOND WHERE lock_key = 'k'"
            )
            lease.commit()
            taker.join(10)
            assert had == [False], "the session was granted beside a lease"
        finally:
            lease.close()


def test_a_session_grant_makes_the_row_a_lease_must_lock(table: str, raw: Any) -> None:
    """A lease can look for the session only while it has the key's row locked, or before it
    inserts a new row: a session grant that finds no row makes a free one, and a new row for a
    key a session holds (its row purged meanwhile) is never inserted."""
    with dblock.connect(MYSQL_URL, table=table) as client, client.lock("fresh", ttl=None):
        assert _row(raw, table, "fresh") is not None and _row(raw, table, "fresh")[0] is None
        raw.execute(f"DELETE FROM `{table}` WHERE lock_key = 'fresh'")  # as a purge might
        with dblock.connect(MYSQL_URL, table=table) as other:
            assert not other.lock("fresh", ttl=10).acquire(timeout=0)
            assert _row(raw, table, "fresh") is None


def test_a_lease_inserting_a_new_row_and_a_session_taking_its_key_meanwhile_exclude(
    table: str, raw: Any
) -> None:
    """The race a lease's new row has: it looks for the session before the row exists. Here
    it looks, then waits (for the meta row, which it reads for the new row's token) while a
    session takes the key's GET_LOCK and finds no row: the session must not be granted
    beside the lease that inserts the row once let go."""
    with (
        dblock.connect(MYSQL_URL, table=table) as client,
        dblock.connect(MYSQL_URL, table=table) as other,
    ):
        backend = _backend(client)
        blocker = raw_connect(MYSQL_URL)
        try:
            blocker.begin()
            meta = aux_name(table, "_meta")
            blocker.cursor().execute(f"SELECT hwm FROM `{meta}` WHERE id = 1 FOR UPDATE")
            leased: list[int | None] = []
            leaser = threading.Thread(
                target=lambda: leased.append(backend.acquire("new", "lease-owner", 10.0, "lock"))
            )
            leaser.start()
            time.sleep(0.5)  # the lease looked (no session) and waits for the meta row
            had: list[bool] = []
            done = threading.Event()

            def take() -> None:
                session = other.lock("new", ttl=None)
                had.append(session.acquire(timeout=0))
                done.wait(10)
                if had[0]:
                    session.release()

            taker = threading.Thread(target=take)
            taker.start()
            time.sleep(0.5)
            blocker.commit()
            leaser.join(10)
            until = time.monotonic() + 10
            while not had and time.monotonic() < until:
                time.sleep(0.01)
            assert leased and had, "both ended"
            assert not (leased[0] is not None and had[0]), "a lease and a session both hold"
            assert leased[0] is not None or had[0], "one of them holds"
            done.set()
            taker.join(10)
        finally:
            blocker.close()


@pytest.mark.slow
@pytest.mark.parametrize("kinds", [("mix", "mix"), ("session", "lease")])
def test_processes_racing_session_and_lease_holds_of_new_keys_never_overlap(
    table: str, tmp_path: Path, kinds: tuple[str, str]
) -> None:
    """Four processes take 60 new keys in the same order, session and lease holds racing for
    each key while it has no row yet and after: a referee record per key sees nobody inside
    at once, and tokens rising."""
    keys = 60
    for i in range(keys):
        (tmp_path / str(i)).write_text("0 0")
    procs = [
        start_worker(
            "session_keys", MYSQL_URL, table, "race-", str(keys), str(tmp_path), kinds[n % 2]
        )
        for n in range(4)
    ]
    for proc in procs:
        proc.communicate(timeout=300)
        assert proc.returncode == 0
    for i in range(keys):
        tokens = [int(t) for t in (tmp_path / f"{i}.log").read_text().split()]
        assert len(tokens) == 4 and tokens == sorted(set(tokens)), (i, tokens)


def test_tokens_increase_across_kinds_and_past_a_rows_token_ahead_of_the_sequence(
    table: str, raw: Any
) -> None:
    with dblock.connect(MYSQL_URL, table=table) as client:
        backend = _backend(client)
        # a quorum chose a token far above the sequence
        assert backend.grant_fenced("k", "q", 10.0, 10**9, "lock")
        assert backend.release_owned("k", "q")
        with client.lock("k", ttl=None) as session:
            token = session.token
            assert token is not None and token > 10**9
        with client.lock("k", ttl=10) as lease:
            assert lease.token is not None and lease.token > token
        with client.lock("other", ttl=10) as lease_elsewhere:  # the sequence was pushed
            assert lease_elsewhere.token is not None and lease_elsewhere.token > token
        # a row whose token is ahead of the sequence all the same (a client of an older
        # version, which does not draw from it): the session token is the row's next, and
        # the sequence is pushed past it
        raw.execute(f"UPDATE `{table}` SET token = 5000000000 WHERE lock_key = 'k'")
        with client.lock("k", ttl=None) as session:
            assert session.token == 5 * 10**9 + 1
        with client.lock("elsewhere", ttl=10) as lease_elsewhere:
            assert lease_elsewhere.token is not None and lease_elsewhere.token > 5 * 10**9 + 1


def test_a_sequence_is_durable_before_its_first_token_is_handed_out(table: str, raw: Any) -> None:
    """A sequence's refill is not written to disk by itself: the grant commits a mark of it
    (meta row 2) with a commit that is, before the token goes out."""
    with dblock.connect(MYSQL_URL, table=table) as client, client.lock("k", ttl=None) as lock:
        raw.execute(f"SELECT hwm FROM `{aux_name(table, '_meta')}` WHERE id = 2")
        mark = raw.fetchone()
        assert mark is not None and lock.token is not None and mark[0] > lock.token


def test_a_table_made_before_session_holds_gets_them_with_a_sequence_above_its_tokens(
    table: str, raw: Any
) -> None:
    raw.execute(f"DROP SEQUENCE `{aux_name(table, '_token_seq')}`")
    raw.execute(f"DROP TABLE `{aux_name(table, '_sessions')}`")
    raw.execute(f"UPDATE `{aux_name(table, '_meta')}` SET hwm = 7000 WHERE id = 1")
    with dblock.connect(MYSQL_URL, table=table, create_schema=False) as old:
        with old.lock("k", ttl=10) as lease:  # a row with a token of the old counter
            assert lease.token == 7001
        raw.execute(f"UPDATE `{table}` SET token = 9000 WHERE lock_key = 'k'")
        # not made without create_schema: ttl=None stays a kept-alive lease
        with old.lock("k", ttl=None) as kept:
            info = old.info("k")
            assert info is not None and info.kind == "lock" and info.expires_at is not None
            assert kept.token == 9001
    with dblock.connect(MYSQL_URL, table=table) as client:
        raw.execute(f"SELECT NEXTVAL(`{aux_name(table, '_token_seq')}`)")
        assert raw.fetchone()[0] > 9001, "the sequence starts above the table's tokens"
        with client.lock("elsewhere", ttl=None) as session:
            info = client.info("elsewhere")
            assert info is not None and info.kind == "session"
            assert session.token is not None and session.token > 9001


def test_list_shows_current_session_holds_not_ended_or_dead_holders_rows(
    table: str, raw: Any
) -> None:
    with dblock.connect(MYSQL_URL, table=table) as client:
        a, b = client.lock("s-a", ttl=None), client.lock("s-b", ttl=None)
        assert a.acquire(timeout=5) and b.acquire(timeout=5)
        listed = client.list("s-")
        assert [(i.key, i.token, i.kind, i.expires_at) for i in listed] == [
            ("s-a", a.token, "session", None),
            ("s-b", b.token, "session", None),
        ]
        b.release()  # its row stays, no longer a hold (the key's next grant replaces it)
        assert [i.key for i in client.list("s-")] == ["s-a"]
        # a holder whose connection died leaves its row too
        backend = _backend(client)
        held, _ = next(iter(backend._sessions._conns.values()))
        held.close()
        raw.execute(f"SELECT count(*) FROM `{aux_name(table, '_sessions')}`")
        assert raw.fetchone()[0] == 2
        until = time.monotonic() + 5
        while client.list("s-") and time.monotonic() < until:
            time.sleep(0.05)
        assert client.list("s-") == []
        client.purge(older_than=0)
        raw.execute(f"SELECT count(*) FROM `{aux_name(table, '_sessions')}`")
        assert raw.fetchone()[0] == 0, "purge forgets the rows of holds that ended"
        with pytest.raises(dblock.LockLost):
            a.release()


def test_a_holds_connection_is_its_own_with_keepalives_and_a_server_idle_timeout(
    table: str,
) -> None:
    with dblock.connect(MYSQL_URL, table=table) as client, client.lock("k", ttl=None) as lock:
        backend = _backend(client)
        ((conn, _),) = backend._sessions._conns.values()
        assert conn not in backend._idle
        with conn.cursor() as cur:
            cur.execute("SELECT @@session.wait_timeout")
            assert cur.fetchone()[0] == 30
        sock = backend._socket_of(conn)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert lock.held


def test_a_full_sessions_table_sheds_the_rows_of_holds_that_ended(table: str, raw: Any) -> None:
    """The sessions table is MEMORY, bounded by max_heap_table_size: a grant that finds it full
    deletes the rows of holds that ended, and goes on."""
    with dblock.connect(MYSQL_URL, table=table) as client:
        ddl = _backend(client).sql.create_sessions_table
    raw.execute(f"DROP TABLE `{aux_name(table, '_sessions')}`")
    raw.execute("SET SESSION max_heap_table_size = 16384")  # the least: a few rows
    raw.execute(ddl)
    with dblock.connect(MYSQL_URL, table=table) as client:
        for i in range(60):  # each leaves its row behind
            with client.lock(f"many-{i}", ttl=None) as lock:
                assert lock.token is not None
                info = client.info(f"many-{i}")
                assert info is not None and info.token == lock.token
