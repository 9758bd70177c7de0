"""MySQL/MariaDB waiters sleep in GET_LOCK on the key's doorbell; a release rings it.

The doorbell is a hint, never the lock: these tests check that waiters really sleep in the
server instead of polling, that a hold taken at the ring keeps the bell until it ends, and that
every fault of a bell (its holder killed or frozen, its connection killed by the server, more
waiters than bells) costs time only, never mutual exclusion or progress.
"""

from __future__ import annotations

import json
import select
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from functools import cache
from typing import Any

import pymysql
import pytest

import dblock
from dblock.stores.mysql import doorbell as _doorbell
from dblock.stores.mysql.store import _HANDED, MysqlStore, _batch
from dblock.tools import parse_url
from tests._internals import store_of
from tests._servers import MYSQL_URL, raw_connect
from tests._waiting import until
from tests.contract.test_processes import finish, worker

# serial: they count statements server-wide and look at every session in GET_LOCK
pytestmark = [pytest.mark.slow, pytest.mark.serial]


_started: list[_Waiter] = []


@pytest.fixture(autouse=True)
def _stop_waiters(table: str) -> Iterator[None]:
    """A failed test must not leave waiters running into the next one (nor past its table)."""
    yield
    while _started:
        waiter = _started.pop()
        waiter.release.set()
        waiter.join(30)


def _bell_user(cur: Any, table: str, key: str) -> int | None:
    """The server session holding the key's doorbell, or None."""
    cur.execute("SELECT IS_USED_LOCK(%s)", (_bell_name(table, key),))
    value = cur.fetchone()[0]
    return None if value is None else int(value)


@cache
def _bell_name(table: str, key: str) -> str:
    with dblock.connect(MYSQL_URL, table=table) as client:
        backend = store_of(client)
        assert isinstance(backend, MysqlStore)
        return backend._bells.name(key)


def test_bells_of_equal_tables_in_two_databases_differ(table: str) -> None:
    # GET_LOCK names are the whole server's: two databases' dblock_locks must not share bells
    here = _bell_name(table, "k")
    other = MysqlStore(parse_url(MYSQL_URL.rsplit("/", 1)[0] + "/elsewhere"), None, table)
    url = parse_url(MYSQL_URL)
    qualified = MysqlStore(url, url.database, table)
    try:
        assert other._bells.name("k") != here
        assert qualified._bells.name("k") == here, "the same table, named with its schema"
    finally:
        other.close()
        qualified.close()


def _in_get_lock(cur: Any, table: str, key: str) -> list[int]:
    """Server sessions sleeping in the GET_LOCK of ``key``'s doorbell (only this test's: the
    server is shared with other tests, whose bells are none of its business)."""
    cur.execute(
        "SELECT id FROM information_schema.processlist WHERE (info LIKE 'SELECT GET_LOCK(%%' "
        "OR info LIKE 'SELECT IF(GET_LOCK(%%') AND LOCATE(%s, info) > 0",
        (_bell_name(table, key),),
    )
    return [int(row[0]) for row in cur.fetchall()]


def _session_alive(cur: Any, session: int) -> bool:
    cur.execute("SELECT count(*) FROM information_schema.processlist WHERE id = %s", (session,))
    return bool(cur.fetchone()[0])


_SLACK_US = round(_doorbell.ARRIVAL_SLACK * 1_000_000)  # a client's with the default timeouts


def _count_requests(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the requests this process sends to MySQL (appends one per request; the server's
    own count is the whole server's, which other tests running beside this one add to)."""
    sent: list[int] = []
    send = pymysql.connections.Connection._execute_command

    def counted(self: Any, command: int, sql: Any) -> Any:
        sent.append(command)
        return send(self, command, sql)

    monkeypatch.setattr(pymysql.connections.Connection, "_execute_command", counted)
    return sent


class _Waiter(threading.Thread):
    """Acquire ``key`` on a client of its own; hold until ``release`` is set."""

    def __init__(self, table: str, key: str, *, ttl: float = 30, timeout: float = 30) -> None:
        super().__init__(daemon=True)
        self.client = dblock.connect(MYSQL_URL, table=table)
        self.lock = self.client.lock(key, ttl=ttl, timeout=timeout)
        self.acquired = threading.Event()
        self.release = threading.Event()
        self.got: bool | None = None
        self.at = 0.0
        self.error: BaseException | None = None  # what its release raised
        _started.append(self)

    def run(self) -> None:
        try:
            self.got = self.lock.acquire()
            self.at = time.monotonic()
            self.acquired.set()
            if self.got:
                self.release.wait(60)
                try:
                    self.lock.release()
                except BaseException as exc:
                    self.error = exc
                    raise
        finally:
            self.client.close()


def _taken_at_the_bell(table: str, key: str, raw: Any) -> _Waiter:
    """A thread that took ``key`` as a waiter (so its hold keeps the bell) and holds it."""
    holder = _Waiter(table, key)
    with dblock.connect(MYSQL_URL, table=table) as client:
        first = client.lock(key, ttl=30)
        assert first.acquire()
        holder.start()
        until(lambda: _bell_user(raw, table, key) is not None, "the holder-to-be has the bell")
        first.release()
    assert holder.acquired.wait(15) and holder.got
    return holder


def _holder_and_sleeping_waiter(table: str, raw: Any, timeout: float) -> tuple[_Waiter, _Waiter]:
    """A thread holding a new key with its bell, and one asleep at that bell."""
    key = "k-" + uuid.uuid4().hex
    holder = _taken_at_the_bell(table, key, raw)
    waiter = _Waiter(table, key, timeout=timeout)
    waiter.start()
    until(lambda: bool(_in_get_lock(raw, table, key)), "the waiter sleeps at the bell")
    return holder, waiter


def _hold_at_the_bell(table: str, key: str, raw: Any, ttl: float) -> subprocess.Popen[str]:
    """A worker process that took ``key`` as a waiter, so its hold keeps the bell."""
    with dblock.connect(MYSQL_URL, table=table) as client:
        first = client.lock(key, ttl=30)
        assert first.acquire(timeout=10)
        proc = worker("hold", MYSQL_URL, table, key, str(ttl), stdin=subprocess.PIPE)
        until(lambda: _bell_user(raw, table, key) is not None, "the worker waits at the bell")
        first.release()
    return proc


def test_a_hold_taken_at_the_bell_keeps_it_until_released(table: str, raw: Any) -> None:
    key = "k-" + uuid.uuid4().hex
    with dblock.connect(MYSQL_URL, table=table) as client:
        first = client.lock(key, ttl=30)
        assert first.acquire()
        assert _bell_user(raw, table, key) is None, "a lock taken without waiting rings no bell"
        waiter = _Waiter(table, key)
        waiter.start()
        until(lambda: _bell_user(raw, table, key) is not None, "the waiter has the bell")
        first.release()
        assert waiter.acquired.wait(15) and waiter.got
        assert _bell_user(raw, table, key) is not None, "the hold let go of its bell"
        # its queue entry went with the take: a holder that froze must not keep the queue's head
        raw.execute(f"SELECT count(*) FROM `{table}_holders`")
        assert raw.fetchone()[0] == 0, "the holder kept its place in the queue"
        waiter.release.set()
        waiter.join(15)
        assert _bell_user(raw, table, key) is None, "release did not let go of the bell"


def test_waiters_sleep_in_the_server_and_are_served_in_order(
    table: str, raw: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "k-" + uuid.uuid4().hex
    holder = _taken_at_the_bell(table, key, raw)
    waiters: list[_Waiter] = []
    for n in range(1, 5):
        waiters.append(_Waiter(table, key, timeout=60))
        waiters[-1].start()
        until(lambda n=n: len(_in_get_lock(raw, table, key)) == n, "the waiter sleeps")
    sent = _count_requests(monkeypatch)
    time.sleep(3.0)
    asked = len(sent)
    # Polling waiters ask hundreds of times in 3 s; sleeping ones about twice a RING_WAIT
    # each (the sleep itself, one look after it), refresh their queue entries (2 more) and
    # look whether a finished once-record is in their way (when they wake 1 s or more into
    # their wait, then 2 s, 4 s ...: 2 more).
    assert 4 <= asked <= 4 * 11, f"4 blocked waiters sent {asked} statements in 3 s"
    holder.release.set()
    order = []
    for w in waiters:
        assert w.acquired.wait(30) and w.got
        order.append(w.at)
        w.release.set()
        w.join(15)
    holder.join(15)
    assert order == sorted(order), "waiters were not served in the order they came"


def test_sigkilled_bell_holder_frees_the_bell_and_its_lease_still_binds(
    table: str, raw: Any
) -> None:
    key = "k-" + uuid.uuid4().hex
    proc = _hold_at_the_bell(table, key, raw, ttl=2.0)
    try:
        assert proc.stdout is not None
        held = json.loads(proc.stdout.readline())
        bell = _bell_user(raw, table, key)
        assert bell is not None
        waiter = _Waiter(table, key, ttl=30, timeout=30)
        waiter.start()
        until(lambda: bool(_in_get_lock(raw, table, key)), "the waiter sleeps at the bell")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        with dblock.connect(MYSQL_URL, table=table) as client:
            info = client.info(key)
            assert info is not None and info.token == held["token"], "lease ended by the kill"
        assert waiter.acquired.wait(30) and waiter.got
        assert waiter.lock.token is not None and waiter.lock.token > held["token"]
        waiter.release.set()
        waiter.join(15)
    finally:
        finish(proc)


def test_sigstopped_bell_holder_is_taken_over_after_its_lease(table: str, raw: Any) -> None:
    key = "k-" + uuid.uuid4().hex
    proc = _hold_at_the_bell(table, key, raw, ttl=2.0)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        held = json.loads(proc.stdout.readline())
        proc.send_signal(signal.SIGSTOP)
        # the frozen process keeps its bell: the waiter must find the lapsed lease by itself
        waiter = _Waiter(table, key, ttl=30, timeout=30)
        waiter.start()
        assert waiter.acquired.wait(30) and waiter.got
        assert waiter.lock.token is not None and waiter.lock.token > held["token"]
        assert _bell_user(raw, table, key) is not None, "the frozen holder's bell is kept"
        proc.send_signal(signal.SIGCONT)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline()) == {"renew": "LockLost", "release": "LockLost"}
        until(lambda: _bell_user(raw, table, key) is None, "the thawed holder lets go")
        waiter.release.set()
        waiter.join(15)
    finally:
        finish(proc)


def test_a_waiter_whose_bell_connection_the_server_kills_still_gets_the_lock(
    table: str, raw: Any
) -> None:
    holder, waiter = _holder_and_sleeping_waiter(table, raw, timeout=30)
    for session in _in_get_lock(raw, table, holder.lock.key):
        raw.execute(f"KILL {session}")
    # and the holder's own bell connection too: its release must still work
    holder_bell = _bell_user(raw, table, holder.lock.key)
    assert holder_bell is not None
    raw.execute(f"KILL {holder_bell}")
    holder.release.set()
    holder.join(15)
    assert not holder.is_alive()
    assert waiter.acquired.wait(30) and waiter.got
    waiter.release.set()
    waiter.join(15)


def test_a_release_hands_the_lock_to_the_waiter_at_the_bell_in_its_own_commit(
    table: str, raw: Any
) -> None:
    holder, waiter = _holder_and_sleeping_waiter(table, raw, timeout=10)
    key, held = holder.lock.key, holder.lock.token
    assert held is not None
    holder.release.set()
    holder.join(15)
    assert not holder.is_alive() and holder.error is None
    assert waiter.acquired.wait(15) and waiter.got
    # handed over (note), with the next token: on MariaDB from the table's sequence, so
    # larger, maybe by more than one
    assert waiter.lock.token is not None and waiter.lock.token > held
    raw.execute(f"SELECT note FROM `{table}` WHERE lock_key = %s", (key,))
    assert raw.fetchone()[0] == str(held), "the waiter took the lock instead of being handed it"
    raw.execute(f"SELECT count(*) FROM `{table}_holders`")
    assert raw.fetchone()[0] == 0, "the new holder kept its place in the queue"
    assert _bell_user(raw, table, key) is not None, "the new holder keeps the bell"
    waiter.release.set()
    waiter.join(15)
    assert _bell_user(raw, table, key) is None


def test_a_waiter_frozen_at_the_bell_is_handed_the_lock_and_holds_up_the_rest_no_longer(
    table: str, raw: Any
) -> None:
    """The release hands the lock to a SIGSTOPped waiter (the server wakes its connection all
    the same): the waiter behind it gets the lock once that hand-over's lease (no longer than
    the frozen waiter's queue entry) ends, and the frozen one, thawed, does not hold it then."""
    key = "k-" + uuid.uuid4().hex
    holder = _taken_at_the_bell(table, key, raw)
    frozen = worker("hold", MYSQL_URL, table, key, "30", stdin=subprocess.PIPE)
    try:
        until(lambda: len(_in_get_lock(raw, table, key)) == 1, "the worker sleeps at the bell")
        frozen.send_signal(signal.SIGSTOP)
        behind = _Waiter(table, key, timeout=40)
        behind.start()
        until(lambda: len(_in_get_lock(raw, table, key)) == 2, "a second waiter sleeps at the bell")
        held = holder.lock.token
        holder.release.set()
        holder.join(15)
        with dblock.connect(MYSQL_URL, table=table) as client:
            until(lambda: client.info(key) is not None, "the lock is handed over")
            info = client.info(key)
            assert info is not None and held is not None and info.token > held
            assert not behind.acquired.is_set(), "handed to the frozen waiter, not the next"
            lease = (info.expires_at - info.acquired_at).total_seconds()
            assert lease <= 9.5, "no longer than the frozen waiter's queue entry"
        assert behind.acquired.wait(30) and behind.got, "the next waiter got it after that lease"
        taken = behind.lock.token
        assert taken is not None and taken > info.token
        frozen.send_signal(signal.SIGCONT)
        assert frozen.stdout is not None and frozen.stdin is not None
        early, _, _ = select.select([frozen.stdout], [], [], 1.5)
        assert not early, "the thawed waiter believes it holds the lock the next one holds"
        behind.release.set()
        behind.join(15)
        got = json.loads(frozen.stdout.readline())
        assert got["token"] > taken, "the thawed waiter took it only after"
        frozen.stdin.write("go\n")
        frozen.stdin.flush()
        assert json.loads(frozen.stdout.readline()) == {"renew": "ok", "release": "ok"}
    finally:
        finish(frozen)


def _queue(backend: MysqlStore, key: str, owner: str, bell: int, ttl: float = 9.0) -> None:
    """A queue entry of ``owner`` that takes hand-overs at the bell on connection ``bell``."""
    params = {"key": key, "owner": owner, "kind": "lock", "ttl": ttl, "lease": 30, "bell": bell}
    backend.run("queueing", lambda conn: backend._exec(conn, backend.sql.enqueue, params))


def _released_with_b_at_the_bell(
    backend: MysqlStore,
    raw: Any,
    table: str,
    key: str,
    a_conn: Any,
    queue: list[tuple[str, Any]],
    made: dict[str, float] | None = None,
) -> int:
    """``a`` takes the lock and keeps its bell on ``a_conn``; ``queue`` (owner, connection)
    queue in that order, for hand-overs at their connections' bells (with 5 s entries), an
    owner in ``made`` as if its entry were made that many seconds from now (the queue's order
    is the entries' times); b sleeps at the bell; a's release runs. Returns a's token."""
    bell = backend._bells.name(key)
    held = backend.acquire_fair(key, "a", 30, queued=True)
    assert held is not None
    a_conn.cursor().execute("SELECT GET_LOCK(%s, 0)", (bell,))
    for owner, conn in queue:
        _queue(backend, key, owner, conn.thread_id(), ttl=5.0)
    for owner, offset in (made or {}).items():
        dated = {"us": round(offset * 1_000_000), "key": key, "owner": owner}
        backend.run(
            "dating",
            lambda c, dated=dated: backend._exec(
                c,
                f"UPDATE `{table}_holders` SET acquired_at = UTC_TIMESTAMP(6) + INTERVAL "
                "%(us)s MICROSECOND WHERE lock_key = %(key)s AND holder = %(owner)s",
                dated,
            ),
        )
    b_conn = dict(queue)["b"]
    rang: list[Any] = []
    sleeper = threading.Thread(target=lambda: rang.append(_get_lock(b_conn, bell)), daemon=True)
    sleeper.start()
    until(lambda: bool(_in_get_lock(raw, table, key)), "b sleeps at the bell")
    params = {"key": key, "owner": "a", "token": held, "bell": bell, "slack_us": _SLACK_US}
    counts = _batch(a_conn, backend.sql.release_and_hand_over, params)
    assert counts[_HANDED] == 1, "a's hold was ended"
    sleeper.join(10)
    assert rang == [1], "the release let go of the bell"
    return held


def test_the_hand_over_goes_to_the_waiter_the_bell_wakes_if_it_heads_the_queue(
    table: str, raw: Any
) -> None:
    """By the bell's connection id: the lock goes where the bell wakes, the queue's head. Also:
    a retried release after it counts as released, and a waiter that gives up after being
    handed the lock hands it on."""
    key = "k-" + uuid.uuid4().hex
    b_conn, c_conn = raw_connect(MYSQL_URL), raw_connect(MYSQL_URL)
    with dblock.connect(MYSQL_URL, table=table) as client:
        backend = store_of(client)
        assert isinstance(backend, MysqlStore)
        a_conn = backend._connect()  # where a's bell is, as the hand-over needs it
        try:
            held = _released_with_b_at_the_bell(
                backend, raw, table, key, a_conn, [("b", b_conn), ("c", c_conn)]
            )
            info = client.info(key)
            assert info is not None and (info.owner, info.token) == ("b", held + 1)
            remaining = (info.expires_at - info.acquired_at).total_seconds()
            assert remaining <= 5.5, "no longer than b's queue entry would have lived"
            raw.execute(f"SELECT holder FROM `{table}_holders` ORDER BY holder")
            assert [row[0] for row in raw.fetchall()] == ["c"], "b's entry went with it"
            # a's release, retried after a failure, finds that its hand-over committed
            plain = {"key": key, "owner": "a", "token": held}
            assert not backend._release_lease(plain), "a first attempt checks nothing"
            assert backend._release_lease(plain, after_failure=True)
            # b gives up before it heard: the lock is handed on (here: freed, as the bell is
            # b's, not c's)
            backend.dequeue(key, "b")
            assert client.info(key) is None
            assert backend.acquire_fair(key, "c", 30, queued=True) is not None
        finally:
            for conn in (a_conn, b_conn, c_conn):
                conn.close()


@pytest.mark.parametrize("waited", ["long", "briefly"])
def test_a_waiter_the_bell_wakes_out_of_queue_order(table: str, raw: Any, waited: str) -> None:
    """c queued before b, but b is the one the bell wakes.

    long: both waited ARRIVAL_SLACK or longer (a waiter whose GET_LOCK ran out, RING_WAIT,
    asks again behind those that asked after it). The release frees the lock instead of
    handing it to b; b, told it is not its turn, passes the bell on, and c takes the lock (CI
    once saw [0, 1, 2, 4, 3] from five fair waiters that waited longer than RING_WAIT).

    briefly: neither has waited the slack (an entry and its GET_LOCK are two round trips,
    which waiters arriving together interleave). The release hands the lock to b, and c
    waits on. Served strictly, every such swap cost a pass of the bell: 8 processes on one
    key fell from about 600 to about 25 sections/s."""
    key = "k-" + uuid.uuid4().hex
    slack = _doorbell.ARRIVAL_SLACK
    # entry times from now; briefly: ahead, so never older than the slack in this test
    made = {"c": -2 * slack, "b": -slack} if waited == "long" else {"c": 60.0, "b": 60.001}
    b_conn, c_conn = raw_connect(MYSQL_URL), raw_connect(MYSQL_URL)
    with dblock.connect(MYSQL_URL, table=table) as client:
        backend = store_of(client)
        assert isinstance(backend, MysqlStore)
        a_conn = backend._connect()
        try:
            held = _released_with_b_at_the_bell(
                backend, raw, table, key, a_conn, [("c", c_conn), ("b", b_conn)], made
            )
            info = client.info(key)
            raw.execute(f"SELECT holder FROM `{table}_holders` ORDER BY holder")
            queued = [row[0] for row in raw.fetchall()]
            cur = b_conn.cursor()
            cur.execute(backend.sql.granted, {"key": key, "owner": "b", "slack_us": _SLACK_US})
            told = cur.fetchone()
            if waited == "briefly":
                assert info is not None and (info.owner, info.token) == ("b", held + 1)
                assert queued == ["c"], "c waits on"
                # (and that one waiter, c, queued ahead of it: whose pace it keeps when passing)
                assert told == (1, held + 1, 1), "b at the bell is told it holds the lock"
                return
            assert info is None, "freed, not handed to b ahead of c"
            assert queued == ["b", "c"], "both still queue"
            assert told == (0, 1, 1), "b at the bell is told it is not its turn, one ahead"
            assert backend.acquire_fair(key, "b", 30, queued=True) is None, "b does not barge"
            assert backend.acquire_fair(key, "c", 30, queued=True) is not None
        finally:
            for conn in (a_conn, b_conn, c_conn):
                conn.close()


def test_the_slack_stays_below_a_get_locks_sleep(table: str) -> None:
    """A waiter whose GET_LOCK ran out and asked again behind later ones has waited longer
    than the slack, also where a short read_timeout shortens each GET_LOCK's sleep."""
    for query, slack in (("", _doorbell.ARRIVAL_SLACK), ("?read_timeout=1", 1 / 3 / 2)):
        with dblock.connect(MYSQL_URL + query, table=table) as client:
            bells = store_of(client)._bells
            assert bells.slack_us == round(slack * 1_000_000)
            assert bells.slack_us < bells.ring_wait * 1_000_000


def test_processes_contending_for_a_key_rarely_pass_the_bell(table: str) -> None:
    """8 processes take and release one key in a loop. Their queue entries and GET_LOCKs
    interleave, so the bell's order often differs a little from the queue's; those waiters
    (none of which has waited long) are served in the bell's order, not by passing the bell
    until the queue's head has it (which cost about 5 passes a section: about 25 sections/s
    from about 600)."""
    key = "k-" + uuid.uuid4().hex
    dblock.connect(MYSQL_URL, table=table).close()
    start_at = str(time.time() + 3)
    procs = [worker("bell_passes", MYSQL_URL, table, key, "40", start_at) for _ in range(8)]
    try:
        outs = [proc.communicate(timeout=180)[0] for proc in procs]
    finally:
        for proc in procs:
            finish(proc)
    assert all(proc.returncode == 0 for proc in procs), outs
    passes = sum(int(out) for out in outs)
    assert passes <= 8 * 40 // 10, f"{passes} passes of the bell for {8 * 40} sections"


def _get_lock(conn: Any, bell: str) -> Any:
    cur = conn.cursor()
    cur.execute("SELECT GET_LOCK(%s, 10)", (bell,))
    return cur.fetchone()[0]


def test_a_waiter_woken_for_a_lock_handed_to_another_passes_the_bell_on(
    table: str, raw: Any
) -> None:
    key = "k-" + uuid.uuid4().hex
    with dblock.connect(MYSQL_URL, table=table) as client:
        backend = store_of(client)
        assert isinstance(backend, MysqlStore)
        assert backend.acquire(key, "y", 30, "lock") is not None
        raw.execute(f"UPDATE `{table}` SET note = '7' WHERE lock_key = %s", (key,))  # handed
        bell = backend._bells.doorbell(key, "x", backend.rt.event())
        assert bell is not None
        try:
            assert not bell.wait(1.0), "x is not woken for the lock"
            assert bell.granted is None and not bell.has_bell
            assert _bell_user(raw, table, key) is None, "x kept the bell from y"
            raw.execute(f"UPDATE `{table}` SET note = NULL WHERE lock_key = %s", (key,))  # taken
            assert bell.wait(1.0), "behind a holder that took the lock, x keeps the bell"
            assert bell.has_bell and not bell.rung and bell.granted is None
        finally:
            bell.close()


def test_waiters_beyond_the_bells_a_client_may_keep_poll(
    table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_doorbell, "MAX_BELLS", 1)
    key = "k-" + uuid.uuid4().hex
    with dblock.connect(MYSQL_URL, table=table) as client:
        backend = store_of(client)
        assert isinstance(backend, MysqlStore)
        first = client.lock(key, ttl=30)
        assert first.acquire()
        results: list[bool] = []

        def wait() -> None:
            lock = client.lock(key, ttl=30, timeout=30)
            results.append(lock.acquire())
            time.sleep(0.05)
            lock.release()

        threads = [threading.Thread(target=wait) for _ in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        first.release()
        for t in threads:
            t.join(60)
        assert results == [True, True, True]


def test_twenty_threads_of_a_client_with_the_default_pool_all_wait_at_the_bell(
    table: str,
) -> None:
    """A waiting thread without a bell polls, and once it heads the queue every hand-over waits
    for its next look: the bells are not capped by the pool's ``max_connections`` (10), which
    left half of 20 threads of one client polling (75 sections a second; 680 with bells)."""
    key = "k-" + uuid.uuid4().hex
    with dblock.connect(MYSQL_URL, table=table) as client:
        backend = store_of(client)
        assert isinstance(backend, MysqlStore)
        assert backend.max_connections == 10
        doorbell = backend._bells.doorbell
        refused: list[str] = []

        def counted(key: str, owner: str, sleep: Any) -> Any:
            bell = doorbell(key, owner, sleep)
            if bell is None:
                refused.append(owner)
            return bell

        backend._bells.doorbell = counted
        first = client.lock(key, ttl=30)
        assert first.acquire()
        results: list[bool] = []

        def wait() -> None:
            lock = client.lock(key, ttl=30, timeout=60)
            results.append(lock.acquire())
            lock.release()

        threads = [threading.Thread(target=wait) for _ in range(20)]
        for t in threads:
            t.start()
        until(
            lambda: len(backend._bells._waiting) + len(refused) >= 20,
            "every thread waits",
            seconds=30,
        )
        first.release()
        for t in threads:
            t.join(90)
        assert results == [True] * 20
        assert refused == [], f"{len(refused)} waiting threads had no bell and polled"


def test_a_bell_connection_that_died_idle_is_replaced_not_given_up(table: str, raw: Any) -> None:
    key = "k-" + uuid.uuid4().hex
    holder = _taken_at_the_bell(table, key, raw)
    with dblock.connect(MYSQL_URL, table=table) as client:
        backend = store_of(client)
        assert isinstance(backend, MysqlStore)
        assert not client.lock(key).acquire(timeout=0.3)  # leaves its bell connection idle
        idle = [conn.thread_id() for conn, _ in backend._bells._idle]
        assert len(idle) == 1
        raw.execute(f"KILL {idle[0]}")  # as a server restart would
        until(lambda: not _session_alive(raw, idle[0]), "the killed session is gone")
        got: list[bool] = []
        waiter = threading.Thread(target=lambda: got.append(client.lock(key).acquire(timeout=30)))
        waiter.start()
        until(lambda: bool(_in_get_lock(raw, table, key)), "the next waiter sleeps at the bell")
        holder.release.set()
        waiter.join(30)
        assert got == [True]


def _waiting(cur: Any, table: str) -> int:
    cur.execute(f"SELECT count(*) FROM `{table}_holders` WHERE waiting = 1")
    return int(cur.fetchone()[0])


def test_a_newcomer_to_a_busy_key_joins_its_queue_without_waiting_for_its_row(
    table: str, raw: Any
) -> None:
    # On a busy key every hand-over keeps the key's row locked until its commit is on disk. A
    # client that found the key busy looks (a plain read) before it tries, and leaves the queue
    # mark alone while it holds: neither its tries nor its mark queue for that row lock.
    key = "k-" + uuid.uuid4().hex
    with dblock.connect(MYSQL_URL, table=table) as a, dblock.connect(MYSQL_URL, table=table) as b:
        held = a.lock(key, ttl=30)
        assert held.acquire()
        first = _Waiter(table, key)  # its entry marks the key's queue busy
        first.start()
        until(lambda: _waiting(raw, table) == 1, "the first waiter queued")
        newcomer = b.lock(key, ttl=30, timeout=30)
        assert not newcomer.acquire(blocking=False), "the key is held"
        got: list[bool] = []

        def wait_for_it() -> None:
            got.append(newcomer.acquire())
            newcomer.release()

        blocker = raw_connect(MYSQL_URL)
        waiting = threading.Thread(target=wait_for_it, daemon=True)
        try:
            cur = blocker.cursor()
            cur.execute("START TRANSACTION")
            cur.execute(f"SELECT owner FROM `{table}` WHERE lock_key = %s FOR UPDATE", (key,))
            waiting.start()
            until(lambda: _waiting(raw, table) == 2, "the newcomer queued, the row still locked")
        finally:
            blocker.rollback()
            blocker.close()
        held.release()  # to the first waiter, then to the newcomer
        assert first.acquired.wait(15) and first.got
        first.release.set()
        waiting.join(30)
        assert got == [True]


def test_fair_waiters_that_wait_past_a_ring_wait_are_served_in_order(table: str, raw: Any) -> None:
    """Processes: each waiter's GET_LOCK runs out (RING_WAIT) and is asked again while the
    others wait, so the order at the bell turns round; the lock still goes in queue order."""
    key = "k-" + uuid.uuid4().hex
    procs: list[subprocess.Popen[str]] = []
    with dblock.connect(MYSQL_URL, table=table) as client:
        holder = client.lock(key, ttl=60, fair=True)
        assert holder.acquire()
        try:
            for idx in range(4):
                procs.append(worker("fair", MYSQL_URL, table, key, str(idx), "90"))

                def queued(n: int = idx + 1) -> bool:
                    raw.execute(
                        f"SELECT count(*) FROM `{table}_holders` WHERE lock_key = %s "
                        "AND waiting = 1",
                        (key,),
                    )
                    return bool(raw.fetchone()[0] == n)

                until(queued, f"{idx + 1} waiters queue", 30)
                time.sleep(_doorbell.RING_WAIT * 0.6)
            holder.release()
            outs = [proc.communicate(timeout=90)[0].strip() for proc in procs]
        finally:
            for proc in procs:
                finish(proc)
    pairs = [out.split() for out in outs]
    assert all(got != "timeout" for _, got in pairs), outs
    order = [int(idx) for idx, _ in sorted(pairs, key=lambda pair: int(pair[1]))]
    assert order == [0, 1, 2, 3]


class _Pauses:
    """A doorbell's sleep that records its pauses instead of sleeping."""

    def __init__(self) -> None:
        self.pauses: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.pauses.append(float(timeout or 0.0))
        return False

    def set(self) -> None:
        pass

    def clear(self) -> None:
        pass

    def is_set(self) -> bool:
        return False


def test_a_waiter_far_back_that_passes_the_bell_on_stays_away_from_it(
    table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asking for the bell again at once queued a waiter behind others that came after it in
    the queue: with 64 waiting processes each hand-off passed the bell along a line of them
    (104 ms, 141 statements). Far back, it stays away until its turn is near; next in line,
    it asks again at once."""
    key = "k-" + uuid.uuid4().hex
    with dblock.connect(MYSQL_URL, table=table) as client:
        backend = store_of(client)
        assert isinstance(backend, MysqlStore)
        pauses = _Pauses()
        bell = backend._bells.doorbell(key, "x", pauses)  # type: ignore[arg-type]
        assert bell is not None
        asked: list[float] = []

        def timed_out(seconds: float) -> tuple[Any, Any]:
            asked.append(seconds)
            return (0,), None

        monkeypatch.setattr(bell, "_get_lock", timed_out)
        try:
            for ahead, far in ((1, False), (40, True)):
                pauses.pauses.clear()
                # told at the bell: not our turn, ``ahead`` waiters ahead of us
                assert bell._answer((0, 1, ahead), durable=True) is False
                assert not bell.has_bell, "the bell is passed on"
                assert not bell.wait(5.0)
                assert asked, "it asks for the bell again after its pause"
                (pause,) = pauses.pauses
                if far:
                    assert pause >= 0.1, f"far back: away from the bell ({pause:.3f} s)"
                else:
                    assert pause <= 0.01, f"next in line: back at once ({pause:.3f} s)"
        finally:
            bell.close()
