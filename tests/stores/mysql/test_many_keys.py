"""ManyKeys on MySQL/MariaDB: the SQL stores' cases (tests/stores/_sql_many_keys.py), and a
waiter for several keys beside the doorbell's hand-over."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

import dblock
from dblock.stores.mysql.store import _HANDED, MysqlStore, _batch
from tests._internals import store_of
from tests._servers import MYSQL_URL, raw_connect, require_server
from tests._waiting import until
from tests.stores._sql_many_keys import *  # noqa: F403 - the cases
from tests.stores._sql_many_keys import QUEUE_TTL, TTL, _keys
from tests.stores.mysql.test_doorbell import _SLACK_US, _get_lock, _in_get_lock


@pytest.fixture
def many_url() -> str:
    require_server("mysql", MYSQL_URL)
    return MYSQL_URL


def test_a_many_waiter_looks_until_its_keys_are_free_for_it(
    many: tuple[dblock.Client, Any],
) -> None:
    """No doorbell for several keys (a session sleeps in one GET_LOCK at a time): the
    subscription looks at the keys, and ends its wait once none is held and no entry is
    ahead of the waiter's on any."""
    _, store = many
    keys = _keys(2)
    held = store.acquire(keys[1], "a", TTL, "lock")
    assert held is not None
    store.enqueue(keys[0], "s", "lock", QUEUE_TTL)  # a single-key waiter ahead of m
    store.enqueue_many(keys, "m", QUEUE_TTL)
    sub = store.subscribe_many(keys, "m")
    try:
        assert sub.live and sub.granted is None
        assert not sub.wait(0.3), "a key is held, and s is ahead of m on the other"
        assert store.release(keys[1], "a", held)
        assert not sub.wait(0.3), "s is still ahead of m"
        store.dequeue(keys[0], "s")
        assert sub.wait(10), "both keys free for m"
        assert store.acquire_many_in_turn(keys, "m", TTL) is not None
    finally:
        sub.close()
    assert not sub.wait(10), "closed: no more waits"


@pytest.mark.parametrize("queued", ["just now", "a second ago"])
def test_a_release_at_the_bell_frees_a_key_whose_queue_a_many_waiter_heads(
    table: str, raw: Any, queued: str
) -> None:
    """a holds the key and keeps its bell; m's entries head the queue (made just now, within
    the arrival slack that lets the bell's order pass single-key waiters, or longer ago); b,
    queued behind m for hand-overs, sleeps at the bell. a's release frees the key rather than
    hand it to b, and b, woken at the bell, is told to keep it and look again (m takes the
    key without the bell); m takes its keys."""
    key, other = sorted(f"k-{uuid.uuid4().hex}" for _ in range(2))
    b_conn = raw_connect(MYSQL_URL)
    with dblock.connect(MYSQL_URL, table=table) as client:
        backend = store_of(client)
        assert isinstance(backend, MysqlStore)
        a_conn = backend._connect()
        try:
            bell = backend._bells.name(key)
            held = backend.acquire(key, "a", TTL, "lock")
            assert held is not None
            a_conn.cursor().execute("SELECT GET_LOCK(%s, 0)", (bell,))
            backend.enqueue_many([key, other], "m", QUEUE_TTL)
            if queued != "just now":
                raw.execute(
                    f"UPDATE `{table}_holders` SET acquired_at = acquired_at - INTERVAL 1 SECOND "
                    "WHERE holder = 'm'"
                )
            entry = {"key": key, "owner": "b", "kind": "lock", "ttl": QUEUE_TTL, "lease": TTL}
            entry["bell"] = b_conn.thread_id()
            backend.run("queueing", lambda conn: backend._exec(conn, backend.sql.enqueue, entry))
            rang: list[Any] = []
            sleeper = threading.Thread(target=lambda: rang.append(_get_lock(b_conn, bell)))
            sleeper.start()
            until(lambda: bool(_in_get_lock(raw, table, key)), "b sleeps at the bell")
            release = {"key": key, "owner": "a", "token": held, "bell": bell, "slack_us": _SLACK_US}
            assert _batch(a_conn, backend.sql.release_and_hand_over, release)[_HANDED] == 1
            sleeper.join(10)
            assert rang == [1], "the release let go of the bell"
            assert client.info(key) is None, "freed, not handed to b behind m"
            cur = b_conn.cursor()
            cur.execute(backend.sql.granted, {"key": key, "owner": "b", "slack_us": _SLACK_US})
            assert cur.fetchone() == (0, 0, 1), "b at the bell is told to look again, not take"
            assert backend.acquire_fair(key, "b", TTL, queued=True) is None
            tokens = backend.acquire_many_in_turn([key, other], "m", TTL)
            assert tokens is not None and tokens[key] > held
        finally:
            a_conn.close()
            b_conn.close()


def test_a_waiter_at_the_bell_does_not_take_a_key_a_many_waiter_queued_for_first(
    table: str,
) -> None:
    """a took the key without waiting (no bell); m queued for it, then b, for hand-overs at
    its bell, which b has at once (nobody keeps it) and so is next in the bell's order. a's
    release frees the key; b, looking, does not take it while m's entry is ahead of its own;
    m takes its keys, and once m has released them b takes the key."""
    key, other = sorted(f"k-{uuid.uuid4().hex}" for _ in range(2))
    with dblock.connect(MYSQL_URL, table=table) as client:
        backend = store_of(client)
        assert isinstance(backend, MysqlStore)
        held = backend.acquire(key, "a", TTL, "lock")
        assert held is not None
        backend.enqueue_many([key, other], "m", QUEUE_TTL)
        bell = backend._bells.doorbell(key, "b", backend.rt.event())
        assert bell is not None
        try:
            backend.enqueue(key, "b", "lock", QUEUE_TTL, lease=TTL)
            assert bell.wait(5) and bell.has_bell and not bell.rung, "b has the bell; a holds"
            assert backend.release(key, "a", held)
            assert backend.acquire_fair(key, "b", TTL, queued=True) is None, "m is ahead of b"
            assert client.info(key) is None
            tokens = backend.acquire_many_in_turn([key, other], "m", TTL)
            assert tokens is not None and tokens[key] > held
            assert backend.release_many(tokens, "m")
            taken = backend.acquire_fair(key, "b", TTL, queued=True)
            assert taken is not None and taken > tokens[key], "then it is b's turn"
            assert backend.release(key, "b", taken)
        finally:
            bell.close()


def test_a_take_of_keys_with_rows_is_one_round_trip_and_a_partial_one_takes_none(
    many: tuple[dblock.Client, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys that all have rows and no waiters are taken and committed in one packet; where
    one is held the packet stops before its commit, and the transaction is rolled back."""
    import pymysql

    client, _ = many
    store = store_of(client)
    keys = _keys(4)
    tokens = store.acquire_many(keys, "o1", TTL)  # makes the rows
    assert tokens is not None and store.release_many(tokens, "o1")
    sent: list[Any] = []  # every command sent (a query, COMMIT, ROLLBACK: each a round trip)
    command = pymysql.connections.Connection._execute_command

    def counted(conn: Any, kind: int, sql: Any) -> Any:
        sent.append(sql)
        return command(conn, kind, sql)

    monkeypatch.setattr(pymysql.connections.Connection, "_execute_command", counted)
    again = store.acquire_many(keys, "o2", TTL)
    assert again is not None and len(sent) == 1, sent
    assert store.release_many(again, "o2")
    other = store.acquire_many(keys[2:3], "o3", TTL)
    assert other is not None
    assert store.acquire_many(keys, "o4", TTL) is None
    monkeypatch.undo()
    for key in keys[:2] + keys[3:]:
        assert client.info(key) is None  # none of them kept
    assert store.release_many(other, "o3")


def test_an_acquire_many_chosen_as_a_deadlocks_victim_again_and_again_still_goes_through(
    many: tuple[dblock.Client, Any], many_table: str
) -> None:
    """A deadlock victim's transaction did nothing, so it is retried, for as long as a
    statement may take (under load one acquire_many was the victim 5 times running and
    failed). Here two other transactions, in turn, hold the second key's row while the
    acquire holds the first and waits for the second, then ask for the first: InnoDB picks
    the acquire as the victim (it changed fewer rows), 8 times; then the acquire goes
    through."""
    _, store = many
    keys = _keys(2)
    for key in keys:  # both rows exist, free
        token = store.acquire(key, "x", TTL, "lock")
        assert token is not None and store.release(key, "x", token)
    ballast = f"{many_table}_ballast"
    conns = [raw_connect(MYSQL_URL) for _ in range(3)]
    look, *others = (conn.cursor() for conn in conns)
    result: list[Any] = []
    taker = threading.Thread(
        target=lambda: result.append(store.acquire_many(keys, "m", TTL)), daemon=True
    )

    def waiting(n: int) -> bool:
        # the server refreshes INNODB_TRX only when it was last read 0.1 s ago or more
        time.sleep(0.12)
        look.execute(  # (other tests' transactions on the server are not counted)
            "SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT' "
            "AND trx_query LIKE %s",
            (f"%{many_table}%",),
        )
        return bool(look.fetchone()[0] == n) or not taker.is_alive()

    def take(cur: Any, key: str) -> threading.Thread:
        """Ask for ``key``'s row in the background (it may have to wait)."""
        sql = f"SELECT 1 FROM {many_table} WHERE lock_key = %s FOR UPDATE"
        asking = threading.Thread(target=cur.execute, args=(sql, (key,)), daemon=True)
        asking.start()
        return asking

    def begin(i: int) -> None:
        """Start a transaction of ``others[i]`` that changed 200 rows (the acquire changes one),
        apart from the other's rows and the row after them that its scan locks too."""
        others[i].execute("BEGIN")
        others[i].execute(
            f"UPDATE {ballast} SET v = v + 1 WHERE id BETWEEN %s AND %s",
            (i * 300 + 1, i * 300 + 200),
        )

    victims = 0
    try:
        look.execute(f"CREATE TABLE {ballast} (id INT PRIMARY KEY, v INT) ENGINE=InnoDB")
        look.executemany(f"INSERT INTO {ballast} VALUES (%s, 0)", [(i,) for i in range(1, 601)])
        for cur in others:
            cur.execute("SET SESSION innodb_lock_wait_timeout = 20")
        begin(0)
        take(others[0], keys[1]).join()
        taker.start()
        for n in range(8):
            holder, next_one = others[n % 2], n % 2 ^ 1
            until(lambda: waiting(1), "the acquire waits for the second row", 10)
            if not taker.is_alive():
                break
            # the holder asks for the first row: a deadlock, whose victim is the acquire
            take(holder, keys[0]).join()
            victims += 1
            # the acquire tries again, and waits for the first row; the next one queues for
            # the second; the holder lets both go, to the acquire and to the next one
            begin(next_one)
            asking = take(others[next_one], keys[1])
            until(lambda: waiting(2), "the acquire and the next one wait", 10)
            holder.execute("ROLLBACK")
            asking.join(10)
        for cur in others:
            cur.execute("ROLLBACK")
        taker.join(15)
    finally:
        look.execute(f"DROP TABLE IF EXISTS {ballast}")
        for conn in conns:
            conn.close()
    assert victims == 8
    assert not taker.is_alive() and result and result[0] is not None, result
    assert sorted(result[0]) == keys
