"""Leader election (API.md "Leader election", issue 48) on every store, sync and async: one
leader at a time across processes (a referee records every term), terms' tokens strictly
increasing, candidates leading in the order they came, a killed leader replaced within its
ttl, a paused one deposed and told on resume, ``observe()`` seeing every change in order."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import dblock
from tests._internals import store_call
from tests._waiting import start_in_turn
from tests._worker import fenced_accepted, fenced_write, freeze_between_operations, start
from tests.providers import Provider

pytestmark = pytest.mark.needs("LeaderValues")


def _name() -> str:
    return "elect-" + uuid.uuid4().hex[:10]


@contextlib.contextmanager
def _worker(*args: str) -> Iterator[subprocess.Popen[str]]:
    """A worker process (tests/_worker.py), ended and its pipe closed on the way out."""
    proc = start(*args)
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def _all_succeed(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        assert p.wait(180) == 0
        if p.stdout is not None:
            p.stdout.close()


def test_a_campaign_leads_with_its_value_and_token_and_leaving_resigns(
    client: dblock.Client,
) -> None:
    name = _name()
    election = client.election(name, ttl=30)
    assert election.leader() is None
    with election.campaign(value="10.0.0.7:8080") as term:
        assert (term.value, term.lost.is_set()) == ("10.0.0.7:8080", False)
        leader = election.leader()
        assert leader is not None
        assert (leader.name, leader.value, leader.token) == (name, "10.0.0.7:8080", term.token)
        assert leader.since.tzinfo is not None
        held = client.info(name)  # an election is a lock on its name: list/info show it
        assert held is not None and held.token == term.token
        term.proclaim("10.0.0.7:9090")
        leader = election.leader()
        assert leader is not None and (leader.value, leader.token) == ("10.0.0.7:9090", term.token)
        assert term.value == "10.0.0.7:9090"
    assert election.leader() is None
    with pytest.raises(dblock.LockLost):
        term.proclaim("late")
    term.resign()  # again: nothing
    with election.campaign() as second:
        assert second.token > term.token
        leader = election.leader()
        assert leader is not None and (leader.value, leader.token) == (None, second.token)


def test_campaign_gives_up_with_lock_timeout(client: dblock.Client) -> None:
    election = client.election(_name(), ttl=30)
    with election.campaign(value="first"):
        started = time.monotonic()
        with pytest.raises(dblock.LockTimeout, match="first"):
            election.campaign(timeout=0.3)
        assert time.monotonic() - started < 10


def test_candidates_lead_in_the_order_they_started_campaigning(
    provider: Provider, table: str
) -> None:
    name = _name()
    clients = [provider.connect(table=table) for _ in range(4)]
    try:
        first = clients[0].election(name, ttl=30).campaign(value="0")
        order: list[int] = []
        t0 = time.monotonic()
        # when each candidate started and led, from t0: a failure under load then says whether
        # a waiter waited longer than its queue entry's lease (which its refresh may miss)
        seen: dict[str, float] = {}

        def candidate(i: int) -> None:
            seen[f"{i} started"] = round(time.monotonic() - t0, 2)
            with clients[i].election(name, ttl=30).campaign(value=str(i), timeout=60):
                seen[f"{i} led"] = round(time.monotonic() - t0, 2)
                order.append(i)
                time.sleep(0.05)

        threads = [threading.Thread(target=candidate, args=(i,)) for i in (1, 2, 3)]
        start_in_turn(threads, lambda: store_call(clients[0], "probe", name, "nobody")[1])
        seen["0 resigned"] = round(time.monotonic() - t0, 2)
        first.resign()
        for t in threads:
            t.join(60)
        assert order == [1, 2, 3], seen
    finally:
        for c in clients:
            c.close()


def test_resign_hands_over_to_a_waiting_candidate(provider: Provider, table: str) -> None:
    name = _name()
    with provider.connect(table=table) as a, provider.connect(table=table) as b:
        term = a.election(name, ttl=30).campaign(value="a")
        got: list[dblock.Term] = []
        waiter = threading.Thread(
            target=lambda: got.append(b.election(name, ttl=30).campaign(value="b", timeout=30))
        )
        waiter.start()
        time.sleep(0.3)
        term.resign()
        waiter.join(30)
        assert got and got[0].token > term.token
        leader = a.election(name).leader()
        assert leader is not None and (leader.value, leader.token) == ("b", got[0].token)
        got[0].resign()


def test_a_term_is_renewed_past_its_ttl(client: dblock.Client) -> None:
    election = client.election(_name(), ttl=1.0)
    with election.campaign(value="v") as term:
        time.sleep(2.5)
        assert not term.lost.is_set()
        leader = election.leader()
        assert leader is not None and leader.token == term.token


def test_a_force_released_term_is_lost_once_and_proclaims_nothing(client: dblock.Client) -> None:
    name = _name()
    calls: list[object] = []
    election = client.election(name, ttl=30, on_lost=calls.append)
    term = election.campaign(value="v")
    assert client.force_release(name)
    with pytest.raises(dblock.LockLost):
        term.proclaim("w")
    assert term.lost.wait(5)
    time.sleep(0.2)
    assert len(calls) == 1
    term.resign()  # a known loss resigns quietly
    assert election.leader() is None


def test_one_leader_at_a_time_across_processes(
    provider: Provider, table: str, db_url: str, tmp_path: Path
) -> None:
    """Four processes campaign five times each; the referee sees no two terms overlap and
    every term's token above all earlier ones."""
    name = _name()
    record = tmp_path / "record"
    record.write_text("0 0")
    procs = [start("lead", db_url, table, name, "5", str(record), "0.01") for _ in range(4)]
    _all_succeed(procs)
    tokens = [int(t) for t in (tmp_path / "record.log").read_text().split()]
    assert len(tokens) == 20
    assert tokens == sorted(set(tokens))


def test_a_killed_leader_is_replaced_soon_after_its_ttl(
    provider: Provider, table: str, db_url: str, tmp_path: Path
) -> None:
    name = _name()
    ttl = 2.0
    with _worker("lead_and_watch", db_url, table, name, str(ttl), str(tmp_path / "w")) as leader:
        token = json.loads(leader.stdout.readline())["token"]  # type: ignore[union-attr]
        with provider.connect(table=table) as client:
            election = client.election(name, ttl=30)
            killed = time.monotonic()
            leader.send_signal(signal.SIGKILL)
            with election.campaign(value="standby", timeout=30) as term:
                took = time.monotonic() - killed
                assert term.token > token
            # the lease, the candidates' recheck (0.5 s) and a loaded 2-core machine's
            # scheduling (CI runs at 1.7x and 2.5x this suite's usual time took 3.2 s and
            # 4.03 s, on a quorum); a candidate that did not recheck would wait for its
            # backoff, up to 5 s past the lease
            assert took <= ttl + 3.0, took


def test_a_paused_leader_is_deposed_and_told_on_resume_and_its_writes_are_refused(
    provider: Provider, table: str, db_url: str, tmp_path: Path
) -> None:
    name = _name()
    writes = tmp_path / "w"
    with _worker("lead_and_watch", db_url, table, name, "1.5", str(writes)) as leader:
        token = json.loads(leader.stdout.readline())["token"]  # type: ignore[union-attr]
        time.sleep(0.2)  # it writes meanwhile
        with provider.connect(table=table) as client:
            # not inside a renewal of its term: on SQLite that would hold up the standby too
            freeze_between_operations(client, name, leader.pid)
            election = client.election(name, ttl=30)
            with election.campaign(value="standby", timeout=30) as term:
                assert term.token > token
                fenced_write(str(writes), term.token)
                leader.send_signal(signal.SIGCONT)
                told = json.loads(leader.stdout.readline())  # type: ignore[union-attr]
                assert told == {"lost": True, "on_lost": 1}
                assert leader.wait(30) == 0
                leader_now = election.leader()
                assert leader_now is not None and leader_now.token == term.token
        entries = fenced_accepted(str(writes))
        ours = entries.index((term.token, True))
        assert (token, True) in entries[:ours]  # it led and wrote before the pause
        assert all(not ok for t, ok in entries[ours:] if t == token)  # refused after ours


def test_observe_sees_every_change_in_order_under_churn(
    provider: Provider, table: str, db_url: str, tmp_path: Path
) -> None:
    name = _name()
    record = tmp_path / "record"
    record.write_text("0 0")
    seen: list[dblock.LeaderInfo | None] = []
    with provider.connect(table=table) as client:
        changes = client.election(name).observe()
        first = next(changes)
        assert first is None
        procs = [start("lead", db_url, table, name, "3", str(record), "0.3") for _ in range(3)]

        def follow() -> None:
            # ends at nobody after the marker term; not at the first nobody after the churn,
            # which a lagging observer may read only after the marker has begun
            for leader in changes:
                seen.append(leader)
                if leader is None and any(s is not None and s.value == "last" for s in seen):
                    return

        watcher = threading.Thread(target=follow)
        watcher.start()
        _all_succeed(procs)
        with client.election(name).campaign(value="last") as last:  # then nobody: the end
            # held until seen: this marker term is the test's, not the churn under test (a
            # read of a quorum under load can take longer than a short term)
            deadline = time.monotonic() + 30
            while not any(s is not None and s.token == last.token for s in seen):
                assert time.monotonic() < deadline, "the observer never saw the last term"
                time.sleep(0.05)
        watcher.join(30)
        assert not watcher.is_alive()
    tokens = [int(t) for t in (tmp_path / "record.log").read_text().split()]
    observed = [leader.token for leader in seen if leader is not None]
    assert observed == [*tokens, last.token]  # every term, once, in order
    pids = {str(p.pid) for p in procs} | {"last"}
    assert all(leader is None or leader.value in pids for leader in seen)


def test_bad_input_is_refused_before_any_io(client: dblock.Client) -> None:
    with pytest.raises(ValueError, match="empty"):
        client.election("")
    with pytest.raises(ValueError):
        client.election(_name(), ttl=0)
    with pytest.raises(TypeError):
        client.election(_name(), on_lost="no")  # type: ignore[arg-type]
    election = client.election(_name())
    with pytest.raises(ValueError, match="1024"):
        election.campaign(value="x" * 1025)
    with pytest.raises(TypeError):
        election.campaign(value=7)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="NUL"):
        election.campaign(value="a\x00b")
    with election.campaign(value="ok") as term:
        with pytest.raises(ValueError, match="1024"):
            term.proclaim("y" * 1025)
        assert term.value == "ok"


def test_leader_value_travels_between_processes(
    provider: Provider, table: str, db_url: str, tmp_path: Path
) -> None:
    name = _name()
    with _worker("lead_and_watch", db_url, table, name, "30", str(tmp_path / "w")) as leader:
        token = json.loads(leader.stdout.readline())["token"]  # type: ignore[union-attr]
        with provider.connect(table=table) as client:
            seen = client.election(name).leader()
            assert seen is not None and (seen.value, seen.token) == (str(leader.pid), token)


@pytest.mark.needs("blocking", "asyncio")
def test_a_cancelled_async_campaign_leaves_no_term_and_no_place_in_line(
    provider: Provider, table: str
) -> None:
    """A campaign cancelled while it waits, or at any moment around its grant and proclaim,
    leaves nothing: the next candidate leads as soon as the leader resigns."""
    import asyncio

    name = _name()

    async def scenario(outside: dblock.Client) -> None:
        def leader() -> dblock.LeaderInfo | None:
            return outside.election(name).leader()

        async with await provider.connect_async(table=table) as aclient:
            first = await asyncio.to_thread(
                lambda: outside.election(name, ttl=30).campaign(value="outside")
            )
            waiting = asyncio.ensure_future(
                aclient.election(name, ttl=30).campaign(value="cancelled")
            )
            await asyncio.sleep(0.5)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            await asyncio.to_thread(first.resign)
            await asyncio.sleep(0.3)
            assert await asyncio.to_thread(leader) is None
            for delay in (0.0, 0.001, 0.003, 0.01, 0.03):  # around the grant and proclaim
                task = asyncio.ensure_future(aclient.election(name, ttl=30).campaign(value="raced"))
                await asyncio.sleep(delay)
                task.cancel()
                try:
                    term = await task
                except asyncio.CancelledError:  # nobody leads (a leaked term would stay)
                    for _ in range(100):
                        if await asyncio.to_thread(leader) is None:
                            break
                        await asyncio.sleep(0.05)
                    assert await asyncio.to_thread(leader) is None, delay
                else:  # it had led before the cancellation came: resign it
                    await term.resign()
            nxt = await asyncio.to_thread(
                lambda: outside.election(name, ttl=30).campaign(value="next", timeout=5)
            )
            await asyncio.to_thread(nxt.resign)

    with provider.connect(table=table) as outside:
        asyncio.run(scenario(outside))
