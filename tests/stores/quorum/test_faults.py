"""A quorum of three stores under faults: a store down, two down, a store restarted empty, a
holder paused past its lease. Private Redis servers (killed and restarted here) and SQLite
files (made unreadable); several processes where the claim is about concurrency."""

from __future__ import annotations

import itertools
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import dblock
import dblock.fencing
from tests.providers import fresh_table

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]


def _sqlite_trio(tmp_path: Path) -> list[str]:
    return [f"sqlite:///{tmp_path}/member{i}.sqlite3" for i in range(3)]


def _unreadable(url: str) -> None:
    """Overwrite a SQLite store's files in place: every connection, open or new, then reads
    'file is not a database' (chmod does not stop root)."""
    path = Path(url.removeprefix("sqlite:///"))
    for part in (path, path.with_name(path.name + "-wal")):
        if part.exists():
            with part.open("r+b") as f:
                f.write(b"not a database! " * 512)


def count_in_processes(url: str, table: str, tmp_path: Path, procs: int = 3, each: int = 8) -> None:
    """``procs`` processes increment a file counter under the quorum's lock; the total is
    exact, no two holds overlap, and tokens increase with time."""
    counter = tmp_path / "counter"
    counter.write_text("0")
    logs = [tmp_path / f"log{i}" for i in range(procs)]
    each = 8
    args = ["count", url, table, "count", str(each), str(counter)]
    workers = [
        subprocess.Popen([sys.executable, "-m", "tests._worker", *args, str(log)], cwd=ROOT)
        for log in logs
    ]
    for w in workers:
        assert w.wait(timeout=240) == 0
    assert int(counter.read_text()) == procs * each
    holds = sorted(
        tuple(map(int, line.split())) for log in logs for line in log.read_text().splitlines()
    )
    for (_, end, token), (start, _, later) in itertools.pairwise(holds):
        assert end <= start, "two holds overlapped"
        assert token < later, "fencing tokens did not increase with time"


def test_with_one_redis_killed_processes_still_take_turns_with_rising_tokens(
    redis_trio: list[Any], tmp_path: Path
) -> None:
    url = " ".join(s.url for s in redis_trio)
    table = fresh_table()
    dblock.connect(url, table=table).close()
    redis_trio[0].kill()
    count_in_processes(url, table, tmp_path)


def test_with_one_sqlite_file_unreadable_processes_still_take_turns_with_rising_tokens(
    tmp_path: Path,
) -> None:
    urls = _sqlite_trio(tmp_path)
    table = fresh_table()
    with dblock.connect(urls, table=table) as client, client.lock("count"):
        pass
    _unreadable(urls[1])
    count_in_processes(" ".join(urls), table, tmp_path)


@pytest.mark.timeout(60)  # "in bounded time": a hang fails the test
def test_with_two_stores_down_acquisition_fails_and_nothing_is_granted(
    redis_trio: list[Any],
) -> None:
    urls = [s.url for s in redis_trio]
    table = fresh_table()
    with dblock.connect(urls, table=table) as client:
        with client.lock("k") as lock:
            before = lock.token
        redis_trio[0].kill()
        redis_trio[1].kill()
        with pytest.raises(dblock.BackendError, match="2 needed"):
            client.lock("k", timeout=5).acquire()
        with pytest.raises(dblock.BackendError):
            client.lock("k").acquire(blocking=False)
    with dblock.connect(urls[2], table=table) as survivor:
        assert survivor.info("k") is None  # no grant left behind on the one that answered
        assert survivor.lock("k").acquire(blocking=False)  # and its fence is not past before
        assert before is not None


def test_a_store_restarted_empty_sends_no_token_backwards_and_lets_no_one_in(
    redis_trio: list[Any],
) -> None:
    urls = [s.url for s in redis_trio]
    table = fresh_table()
    tokens: list[int] = []
    with dblock.connect(urls, table=table) as a, dblock.connect(urls, table=table) as b:
        for round_ in range(6):
            holder = a.lock("k", ttl=30)
            assert holder.acquire(timeout=10)
            assert holder.token is not None
            tokens.append(holder.token)
            victim = redis_trio[round_ % 3]
            victim.kill()
            victim.start()  # empty: no record, no fence, no table marker
            # the forgotten hold still stands on the other two: nobody else gets in
            assert not b.lock("k").acquire(blocking=False)
            info = b.info("k")
            assert info is not None and (info.owner, info.token) == (holder.owner, holder.token)
            # a reader that creates nothing (the CLI's list and info) sees it too, though one
            # store has no lock table any more
            with dblock.connect(urls, table=table, create_schema=False) as reader:
                assert reader.info("k") == info
            holder.release()
    assert tokens == sorted(set(tokens)), f"tokens went backwards: {tokens}"


_PAUSED_HOLDER = textwrap.dedent(
    """
    import sqlite3, sys
    import dblock, dblock.fencing
    urls, table, resource = sys.argv[1].split(), sys.argv[2], sys.argv[3]
    client = dblock.connect(urls, table=table)
    lock = client.lock("resource", ttl=1)
    lock.acquire()
    print(lock.token, flush=True)
    sys.stdin.readline()  # paused (SIGSTOP) before this line comes, then resumed
    stmt = dblock.fencing.fenced_update("sqlite", "res", set_columns=["v"], key_columns=["id"])
    conn = sqlite3.connect(resource, isolation_level=None)
    print("accepted" if stmt.execute(conn.cursor(), ["stale"], [1], lock.token) else "rejected",
          flush=True)
    """
)


def test_a_holder_paused_past_its_lease_has_its_fenced_write_rejected(
    redis_trio: list[Any], tmp_path: Path
) -> None:
    urls = [s.url for s in redis_trio]
    table = fresh_table()
    resource = tmp_path / "resource.sqlite3"
    conn = sqlite3.connect(resource, isolation_level=None)
    conn.execute("CREATE TABLE res (id INTEGER PRIMARY KEY, v TEXT, fence_token INTEGER)")
    conn.execute("INSERT INTO res VALUES (1, NULL, NULL)")
    holder = subprocess.Popen(
        [sys.executable, "-c", _PAUSED_HOLDER, " ".join(urls), table, str(resource)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert holder.stdout is not None and holder.stdin is not None
        stale = int(holder.stdout.readline())
        holder.send_signal(signal.SIGSTOP)
        with dblock.connect(urls, table=table) as client:
            # its 1 s lease runs out while it is stopped; then this client gets the key
            with client.lock("resource", ttl=30, timeout=30) as lock:
                assert lock.token is not None and lock.token > stale
                stmt = dblock.fencing.fenced_update(
                    "sqlite", "res", set_columns=["v"], key_columns=["id"]
                )
                assert stmt.execute(conn.cursor(), ["fresh"], [1], lock.token)
                holder.send_signal(signal.SIGCONT)
                holder.stdin.write("go\n")
                holder.stdin.flush()
                assert holder.stdout.readline().strip() == "rejected"
        assert conn.execute("SELECT v FROM res WHERE id = 1").fetchone() == ("fresh",)
    finally:
        holder.send_signal(signal.SIGCONT)
        holder.kill()
        holder.communicate(timeout=10)
        conn.close()


def test_a_quorum_needs_three_distinct_stores_of_fenced_grants(tmp_path: Path) -> None:
    urls = _sqlite_trio(tmp_path)
    with pytest.raises(dblock.ConfigurationError, match="at least three"):
        dblock.connect(urls[:2])
    with pytest.raises(dblock.ConfigurationError, match="twice"):
        dblock.connect([urls[0], urls[1], urls[0]])


def test_a_quorum_client_says_what_it_offers(tmp_path: Path) -> None:
    with dblock.connect(_sqlite_trio(tmp_path), table=fresh_table()) as client:
        for call in (
            lambda: client.rwlock("k").read_lock().acquire(),
            lambda: client.semaphore("k", 2).acquire(),
            lambda: client.once("k").__enter__(),
            lambda: client.state("k"),
        ):
            with pytest.raises(dblock.ConfigurationError, match="quorum client offers lock"):
                call()


def test_dblock_url_may_name_a_quorum(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    urls = _sqlite_trio(tmp_path)
    monkeypatch.setenv("DBLOCK_URL", "  ".join(urls))
    table = fresh_table()
    with dblock.connect(table=table) as client, client.lock("k") as lock:
        for url in urls:  # held on every member
            with dblock.connect(url, table=table) as member:
                info = member.info("k")
                assert info is not None and info.token == lock.token


def test_the_async_client_goes_on_with_one_store_killed_and_fails_with_two(
    redis_trio: list[Any],
) -> None:
    import asyncio

    urls = [s.url for s in redis_trio]
    table = fresh_table()

    async def main() -> list[int]:
        tokens = []
        async with await dblock.connect_async(urls, table=table) as client:
            redis_trio[0].kill()
            for _ in range(5):
                async with client.lock("k", ttl=5, timeout=10) as lock:
                    assert lock.token is not None
                    tokens.append(lock.token)
            redis_trio[1].kill()
            with pytest.raises(dblock.BackendError):
                await client.lock("k").acquire(timeout=5)
        return tokens

    tokens = asyncio.run(main())
    assert tokens == sorted(set(tokens)) and len(tokens) == 5


@pytest.mark.timeout(90)  # a slow store must cost a vote, not a hang
def test_a_frozen_store_costs_its_vote_and_is_backed_off_from(redis_trio: list[Any]) -> None:
    import os

    urls = [s.url for s in redis_trio]
    table = fresh_table()
    tokens: list[int] = []
    with dblock.connect(urls, table=table) as client:
        with client.lock("k") as lock:  # connected to every store before the freeze
            assert lock.token is not None
        group = os.getpgid(redis_trio[2]._proc.pid)
        os.killpg(group, signal.SIGSTOP)  # it keeps its sockets open and answers nothing
        try:
            for _ in range(4):
                with client.lock("k", ttl=10, timeout=30) as lock:
                    assert lock.token is not None
                    tokens.append(lock.token)
        finally:
            os.killpg(group, signal.SIGCONT)
    assert tokens == sorted(set(tokens)) and len(tokens) == 4


def test_a_release_that_too_few_stores_answered_counts_the_one_that_did(
    redis_trio: list[Any],
) -> None:
    """Issue 44, point 4: the message counts the stores that really answered."""
    urls = [s.url for s in redis_trio]
    with dblock.connect(urls, table=fresh_table()) as client:
        lock = client.lock("k", ttl=30)
        assert lock.acquire()
        redis_trio[0].kill()
        redis_trio[1].kill()
        with pytest.raises(dblock.BackendError) as caught:
            lock.release()
    message = str(caught.value)
    assert "only 1 of the quorum's 3 stores answered, 2 needed" in message
    assert "unknown" not in message
    assert urls[2] not in message  # the one that answered is not among the failed ones


@pytest.mark.timeout(90)
def test_a_frozen_queue_keeper_neither_overruns_the_timeout_nor_stalls_every_call(
    redis_trio: list[Any],
) -> None:
    """Issue 44, point 7: the first store (the wait queue's keeper) frozen."""
    import os
    import time

    urls = [s.url for s in redis_trio]
    table = fresh_table()
    with (
        dblock.connect(urls, table=table) as client,
        dblock.connect(urls, table=table) as holder,
        holder.lock("k", ttl=30),
    ):
        assert client.info("k") is not None  # connected to every store before the freeze
        group = os.getpgid(redis_trio[0]._proc.pid)
        os.killpg(group, signal.SIGSTOP)  # it keeps its sockets open and answers nothing
        try:
            start = time.monotonic()
            assert not client.lock("k").acquire(timeout=1.5)
            # bounded by the caller's timeout, not the store's 5 s statement deadline
            assert time.monotonic() - start < 3.5
            # the frozen store is not asked again, and waited for, by every call once its
            # backoff has passed: five rounds of calls take less than two of its answer
            # windows (2 s each) besides their pauses
            start = time.monotonic()
            for _ in range(5):
                time.sleep(0.3)  # past the backoff after a failure
                assert client.info("k") is not None
                assert not client.lock("k").acquire(blocking=False)
            assert time.monotonic() - start < 1.5 + 4.0
        finally:
            os.killpg(group, signal.SIGCONT)


def test_every_call_waits_the_answer_window_the_module_has_then(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The contract suite's quorum runs widen ``ANSWER_WITHIN`` (tests/stores/quorum/
    provider.py): each call must read it then, not the value it had at import."""
    from dblock.stores.quorum import store

    with dblock.connect(_sqlite_trio(tmp_path), table=fresh_table()) as client:
        assert client.info("k") is None  # the stores answer within the usual window
        monkeypatch.setattr(store, "ANSWER_WITHIN", 0.0)
        unanswered = []
        for _ in range(5):  # a store's answer may beat the look for it now and then
            try:
                client.info("k")
            except dblock.BackendError as exc:
                unanswered.append(str(exc))
        assert any("no answer in time" in reason for reason in unanswered), unanswered
