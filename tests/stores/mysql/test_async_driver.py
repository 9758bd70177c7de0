"""The MySQL store under the async client runs on aiomysql: nothing it does blocks the loop.

Each test checks what a store still on PyMySQL's blocking calls (inside the greenlet) would
get wrong: a loop frozen while a waiter sleeps in its doorbell's GET_LOCK, a wake-up that waits
for the next poll, a connection killed or aborted mid-statement that hangs the task or escapes
as a driver error, and sync and async clients that do not exclude each other.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import subprocess
import sys
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest

import dblock
from dblock._green import spawn
from dblock.stores._watchdog import Watchdog
from tests._internals import store_of
from tests._servers import MYSQL_URL
from tests.contract.test_processes import ROOT, finish, worker
from tests.stores.mysql.test_doorbell import _bell_name, _hold_at_the_bell

pytestmark = pytest.mark.slow


class _Ticker:
    """A task counting its turns of the loop, one every 5 ms while the loop runs."""

    def __init__(self) -> None:
        self.ticks = 0
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(0.005)
            self.ticks += 1

    def stop(self) -> None:
        self._task.cancel()


def _sleepers(raw: Any, bell: str) -> dict[int, int]:
    """Sessions asleep in GET_LOCK on ``bell`` -> how long their statement has run, ms."""
    raw.execute(
        "SELECT id, time_ms FROM information_schema.processlist WHERE info LIKE %s",
        (f"SELECT IF(GET_LOCK('{bell}'%",),
    )
    return {int(row[0]): int(row[1]) for row in raw.fetchall()}


async def _asleep_at(raw: Any, bell: str) -> dict[int, int]:
    """Wait (on the loop) until a session sleeps at ``bell``; those sessions."""
    for _ in range(1500):
        found = await asyncio.to_thread(_sleepers, raw, bell)
        if found:
            return found
        await asyncio.sleep(0.01)
    raise AssertionError("no waiter went to sleep at the bell")


def _release(holder: subprocess.Popen[str]) -> dict[str, str]:
    """Tell a ``hold`` worker to renew and release; what it reports."""
    assert holder.stdin is not None and holder.stdout is not None
    holder.stdin.write("go\n")
    holder.stdin.flush()
    while True:  # after the line it printed when it took the lock
        report = dict(json.loads(holder.stdout.readline()))
        if "release" in report:
            return report


def _holds_bell(client: Any, key: str) -> int | None:
    """The session id of the bell ``client`` keeps with its hold on ``key``, or None."""
    held = store_of(client._sync)._bells._held
    conns = [conn for (k, _), conn in held.items() if k == key]
    return int(conns[0].thread_id()) if conns else None


def test_the_loop_runs_while_a_task_sleeps_in_the_doorbells_get_lock(table: str, raw: Any) -> None:
    key = "k-" + uuid.uuid4().hex
    bell = _bell_name(table, key)
    holder = _hold_at_the_bell(table, key, raw, ttl=30)

    async def main() -> None:
        ticker = _Ticker()
        async with await dblock.connect_async(MYSQL_URL, table=table) as client:
            waiter = asyncio.create_task(client.lock(key, ttl=30, timeout=60).acquire())
            # one GET_LOCK statement seen running at two moments, the ticker advancing in
            # between: the loop ran while the statement was in flight (a blocking driver
            # would freeze the loop, and the ticker, for the whole statement)
            for _ in range(20):
                first = await _asleep_at(raw, bell)
                before = ticker.ticks
                await asyncio.sleep(0.3)
                advanced = ticker.ticks - before
                later = await asyncio.to_thread(_sleepers, raw, bell)
                same = [s for s in first if s in later and later[s] - first[s] >= 250]
                if same:
                    break
            else:
                raise AssertionError("never saw one GET_LOCK statement span 0.3 s")
            # 60 ticks on an idle machine, 16 seen under the suite's load; a loop frozen for
            # the statement ticks at most once (the tick already due when it froze)
            assert advanced >= 5, f"the loop stalled during GET_LOCK: {advanced} ticks"
            assert not waiter.done()
            assert _release(holder) == {"renew": "ok", "release": "ok"}
            assert await asyncio.wait_for(waiter, 30)
        ticker.stop()

    try:
        asyncio.run(main())
    finally:
        finish(holder)


def test_a_release_by_a_sync_process_wakes_the_async_waiter_at_its_bell(
    table: str, raw: Any
) -> None:
    key = "k-" + uuid.uuid4().hex
    bell = _bell_name(table, key)
    holder = _hold_at_the_bell(table, key, raw, ttl=30)

    async def main() -> None:
        async with await dblock.connect_async(MYSQL_URL, table=table) as client:

            async def take() -> tuple[int | None, int | None]:
                lock = client.lock(key, ttl=30, timeout=60)
                assert await lock.acquire()
                kept = _holds_bell(client, key)
                await lock.release()
                return kept, _holds_bell(client, key)

            waiter = asyncio.create_task(take())
            sleeping = await _asleep_at(raw, bell)
            assert await asyncio.to_thread(_release, holder) == {"renew": "ok", "release": "ok"}
            kept, after = await asyncio.wait_for(waiter, 30)
            # The hold kept the bell: its GET_LOCK returned 1 (the release rang it), as only a
            # waiter whose GET_LOCK got the bell keeps it (one that polled has none); and it
            # was the connection seen asleep in GET_LOCK.
            assert kept in sleeping
            assert after is None, "the release did not let go of the bell"

    try:
        asyncio.run(main())
    finally:
        finish(holder)


def test_a_bell_connection_killed_by_the_server_mid_wait_is_survived(table: str, raw: Any) -> None:
    key = "k-" + uuid.uuid4().hex
    bell = _bell_name(table, key)
    holder = _hold_at_the_bell(table, key, raw, ttl=30)

    async def main() -> None:
        async with await dblock.connect_async(MYSQL_URL, table=table) as client:

            async def take() -> bool:
                lock = client.lock(key, ttl=30, timeout=60)
                got = await lock.acquire()
                await lock.release()
                return got

            waiter = asyncio.create_task(take())
            for session in await _asleep_at(raw, bell):
                await asyncio.to_thread(raw.execute, f"KILL {session}")
            await asyncio.sleep(0.2)
            assert not waiter.done(), "the waiter gave up when its bell's connection died"
            assert await asyncio.to_thread(_release, holder) == {"renew": "ok", "release": "ok"}
            assert await asyncio.wait_for(waiter, 30)

    try:
        asyncio.run(main())
    finally:
        finish(holder)


def test_a_pooled_connection_killed_between_operations_is_replaced(table: str, raw: Any) -> None:
    async def main() -> None:
        async with await dblock.connect_async(MYSQL_URL, table=table) as client:
            lock = client.lock("k-" + uuid.uuid4().hex, ttl=30)
            assert await lock.acquire()
            for conn in list(store_of(client._sync)._idle):
                await asyncio.to_thread(raw.execute, f"KILL {conn.thread_id()}")
            await lock.release()  # retried on a new connection
            assert await lock.acquire(blocking=False)
            await lock.release()

    asyncio.run(main())


def test_the_watchdog_ends_a_statement_that_hangs_with_backend_error(table: str) -> None:
    async def main() -> None:
        async with await dblock.connect_async(MYSQL_URL, table=table) as client:
            store = store_of(client._sync)
            store._watchdog = Watchdog("test-watchdog", 0.2)  # the seam: a short deadline
            ticker = _Ticker()

            def hang(conn: Any) -> None:
                with conn.cursor() as cur:
                    cur.execute("SELECT SLEEP(30)")

            try:
                hung = functools.partial(store.run, "hanging", hang, deadline=0.3)
                with pytest.raises(dblock.BackendError, match="did not complete within"):
                    await asyncio.wait_for(spawn(hung), 20)
            finally:
                ticker.stop()
                store._watchdog.stop()
            assert ticker.ticks >= 10, "the loop stalled while the statement hung"
            lock = client.lock("k-" + uuid.uuid4().hex, ttl=30)
            assert await lock.acquire(blocking=False), "the pool did not recover"
            await lock.release()

    asyncio.run(main())


def test_a_statement_with_warnings_warns_nothing(table: str) -> None:
    """aiomysql would ask the server for the warnings (a round trip) and ``warnings.warn``
    each: a look at ``information_schema`` warns of another client's table whose DDL is in
    flight, which ``-W error`` (as in this suite) turned into a failed connect."""

    async def main() -> None:
        async with await dblock.connect_async(MYSQL_URL, table=table) as client:
            store = store_of(client._sync)

            def divide(conn: Any) -> Any:
                with conn.cursor() as cur:
                    cur.execute("SELECT 1 / 0")  # NULL, and the warning "Division by 0"
                    return cur.fetchone()

            with warnings.catch_warnings():
                warnings.simplefilter("error")
                assert await spawn(functools.partial(store.run, "dividing", divide)) == (None,)

    asyncio.run(main())


def test_a_short_read_timeout_ends_a_statement_stuck_on_a_row_lock(table: str, raw: Any) -> None:
    key = "k-" + uuid.uuid4().hex
    with dblock.connect(MYSQL_URL, table=table) as client:  # the key's row
        client.lock(key, ttl=0.5).acquire()
    raw.execute("BEGIN")
    raw.execute(f"SELECT * FROM `{table}` WHERE lock_key = %s FOR UPDATE", (key,))

    async def main() -> None:
        url = f"{MYSQL_URL}?read_timeout=1"
        async with await dblock.connect_async(url, table=table) as client:
            with pytest.raises(dblock.BackendError, match="Lost connection"):
                await asyncio.wait_for(client.lock(key, ttl=30).acquire(blocking=False), 20)

    try:
        asyncio.run(main())
    finally:
        raw.execute("ROLLBACK")


def test_sync_and_async_processes_exclude_each_other_on_one_key(table: str, tmp_path: Path) -> None:
    key = "k-" + uuid.uuid4().hex
    counter = tmp_path / "counter"
    counter.write_text("0")
    per_worker = 8
    logs = [tmp_path / f"log{i}" for i in range(4)]
    kinds = ["count", "acount", "count", "acount"]
    procs = [
        worker(kind, MYSQL_URL, table, key, str(per_worker), str(counter), str(log))
        for kind, log in zip(kinds, logs, strict=True)
    ]
    for proc in procs:
        proc.communicate(timeout=180)
        assert proc.returncode == 0
    assert int(counter.read_text()) == len(procs) * per_worker
    holds = sorted(
        tuple(map(int, line.split())) for log in logs for line in log.read_text().splitlines()
    )
    assert len(holds) == len(procs) * per_worker
    for (_, end, token), (start, _, next_token) in itertools.pairwise(holds):
        assert end <= start, "two holds overlapped"
        assert token < next_token, "fencing tokens did not increase with time"


def test_connect_async_without_aiomysql_names_the_extra(table: str) -> None:
    script = (
        "import asyncio, sys\n"
        "sys.modules['aiomysql'] = None  # import aiomysql raises ImportError\n"
        "import dblock\n"
        f"url, table = {MYSQL_URL!r}, {table!r}\n"
        "async def main():\n"
        "    try:\n"
        "        await dblock.connect_async(url, table=table)\n"
        "    except dblock.ConfigurationError as exc:\n"
        "        print(exc)\n"
        "asyncio.run(main())\n"
        "with dblock.connect(url, table=table):\n"
        "    print('sync ok')\n"
    )
    out = subprocess.check_output([sys.executable, "-c", script], cwd=ROOT, text=True, timeout=60)
    assert "pip install 'dblock[mysql-async]'" in out
    assert "aiomysql" in out
    assert "sync ok" in out, "the blocking client needs no aiomysql"


def test_errors_of_the_async_driver_classify_as_pymysqls(table: str) -> None:
    """A statement the server refuses is a BackendError at once (not retried, not a driver
    error); a deadlock-class error is retried."""
    calls: list[int] = []

    async def main() -> None:
        async with await dblock.connect_async(MYSQL_URL, table=table) as client:
            store = store_of(client._sync)

            def bad(conn: Any) -> None:
                calls.append(1)
                with conn.cursor() as cur:
                    cur.execute("SELECT * FROM no_such_table_here")

            with pytest.raises(dblock.BackendError, match="no_such_table_here"):
                await spawn(store.run, "bad", bad)
            assert len(calls) == 1, "a refused statement was retried"

            attempts = itertools.count()

            def deadlocked_once(conn: Any) -> int:
                with conn.cursor() as cur:
                    if next(attempts) == 0:
                        cur.execute("SIGNAL SQLSTATE '40001' SET MYSQL_ERRNO = 1213")
                    cur.execute("SELECT 7")
                    return int(cur.fetchone()[0])

            assert await spawn(store.run, "deadlock", deadlocked_once) == 7

    asyncio.run(main())
