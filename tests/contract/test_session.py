"""Session holds, ``client.lock(key, ttl=None)`` (API.md § "Session locks").

Where the store declares ``SessionHolds`` the hold is the server's own lock, kept by a
connection of its own: shown as kind "session" with no expiry, freed the moment its holder's
process dies, lost (``on_lost``, ``LockLost``) when its connection is killed. Elsewhere it is a
lease renewed in the background; the plain cases below hold for both.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import threading
import time
from pathlib import Path

import pytest

import dblock
from dblock._engine import Hold
from tests.contract import test_chaos
from tests.contract.test_chaos import FreezingProxy
from tests.contract.test_processes import finish, worker
from tests.providers import Provider, fresh_table, table_of

#: how late a lost session is noticed at most: its connection is checked every second, and a
#: check that takes more than two is a loss (hold.SESSION_CHECK, sql/sessions.CHECK_DEADLINE),
#: plus room for a loaded machine
LOSS_BOUND = 6.0


proxy = test_chaos.proxy  # the fixture: a loopback proxy that can freeze


# -- every store ---------------------------------------------------------------------------------
def test_a_session_hold_excludes_others_and_is_reentrant(
    provider: Provider, client: dblock.Client, table: str, key: str
) -> None:
    lock = client.lock(key, ttl=None)
    assert lock.acquire(timeout=5)
    token = lock.token
    assert isinstance(token, int) and lock.held
    assert lock.acquire(timeout=0)  # re-entrant: the same hold, the same token
    assert lock.token == token
    with provider.connect(table=table) as other:
        assert not other.lock(key, ttl=None).acquire(timeout=0)
        assert not other.lock(key, ttl=None).acquire(timeout=0.3)
        assert other.lock(key).locked()
        assert not other.lock(key, ttl=10).acquire(timeout=0)  # a lease waits for it too
        lock.release()
        assert other.lock(key).locked()  # one acquisition still counted
        lock.release()
        assert not other.lock(key).locked()
        with other.lock(key, ttl=None, timeout=5) as again:
            assert again.token is not None and again.token > token
    with pytest.raises(dblock.NotHeld):
        lock.release()


def test_session_and_lease_holds_exclude_each_other_and_tokens_increase(
    provider: Provider, client: dblock.Client, table: str, key: str
) -> None:
    tokens = []
    with provider.connect(table=table) as other:
        for ttl in (None, 10.0, None, None, 10.0, 10.0, None):
            with client.lock(key, ttl=ttl, timeout=5) as lock:
                tokens.append(lock.token)
                opposite = None if ttl is not None else 10.0
                assert not other.lock(key, ttl=opposite).acquire(timeout=0)
    assert all(isinstance(t, int) for t in tokens)
    assert tokens == sorted(set(tokens)), tokens


def test_a_waiting_session_acquire_gets_the_lock_when_it_is_freed(
    provider: Provider, client: dblock.Client, table: str, key: str
) -> None:
    taken = threading.Event()

    def hold_briefly() -> None:
        with client.lock(key, ttl=None):
            taken.set()
            time.sleep(0.3)

    holder = threading.Thread(target=hold_briefly)
    holder.start()
    assert taken.wait(10)
    with provider.connect(table=table) as other:
        started = time.monotonic()
        waiter = other.lock(key, ttl=None)
        assert waiter.acquire(timeout=10)
        assert time.monotonic() - started < 8
        waiter.release()
    holder.join()


def _holds_of(key: str) -> list[object]:
    # type(), not isinstance(): that reads __class__, which a lazy proxy among all the
    # objects (django.conf.settings, in a worker that ran the Django tests) answers by loading
    # what it stands for
    return [o for o in gc.get_objects() if type(o) is Hold and o.key == key]


@pytest.mark.parametrize("renewed", [False, True], ids=["session", "renewed-lease"])
def test_a_released_hold_is_freed_at_once_not_by_the_cycle_collector(
    client: dblock.Client, key: str, renewed: bool
) -> None:
    # a session hold (or a renewed lease) has a background job that refers to it; a job
    # kept until its time after the release, or an error kept with its traceback (whose frames
    # hold the hold), must not keep it in a cycle that only the cycle collector frees: with
    # thousands of short holds a second, its passes cost more than the holds
    lock = client.lock(key, ttl=30, auto_renew=True) if renewed else client.lock(key, ttl=None)
    gc.collect()
    gc.disable()
    try:
        for _ in range(3):
            with lock:
                assert _holds_of(key), "the test sees no hold while it is held"
        assert _holds_of(key) == []
    finally:
        gc.enable()


def test_info_of_a_session_hold(provider: Provider, client: dblock.Client, key: str) -> None:
    with client.lock(key, ttl=None) as lock:
        info = client.info(key)
        assert info is not None
        assert info.key == key and info.token == lock.token
        if provider.has("SessionHolds"):
            assert info.kind == "session" and info.expires_at is None
            assert lock.owner.startswith(info.owner[:20])
        else:  # a lease kept alive
            assert info.kind == "lock" and info.expires_at is not None
    assert client.info(key) is None


def test_session_holds_of_one_key_in_two_tables_are_two_locks(
    provider: Provider, client: dblock.Client, key: str
) -> None:
    """The server's lock is named after the table as well as the key (PostgreSQL's advisory
    key, MariaDB's GET_LOCK name): two applications' tables on one server do not collide."""
    other_table = fresh_table()
    try:
        with provider.connect(table=other_table) as other:
            a, b = client.lock(key, ttl=None), other.lock(key, ttl=None)
            assert a.acquire(timeout=0) and b.acquire(timeout=0)  # two tables, two locks
            a.release()
            b.release()
    finally:
        provider.drop(other_table)


# -- the server's own lock -------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.needs("SessionHolds", "processes")
@pytest.mark.parametrize("mix", ["0", "1"], ids=["session", "session+lease"])
def test_processes_take_turns_with_increasing_tokens(
    provider: Provider, db_url: str, table: str, key: str, tmp_path: Path, mix: str
) -> None:
    """Five processes, 10 holds each, checked by a referee record: nobody inside at once, every
    token above all earlier ones (mix "1": lease and session holds alternate)."""
    provider.connect(table=table).close()
    record = tmp_path / "record"
    record.write_text("0 0")
    procs = [worker("session_fence", db_url, table, key, "10", str(record), mix) for _ in range(5)]
    for proc in procs:
        proc.communicate(timeout=240)
        assert proc.returncode == 0
    tokens = [int(t) for t in (tmp_path / "record.log").read_text().split()]
    assert len(tokens) == 50 and tokens == sorted(set(tokens))


@pytest.mark.needs("SessionHolds", "processes")
def test_a_sigkilled_holder_frees_the_lock_at_once(
    provider: Provider, client: dblock.Client, db_url: str, table: str, key: str
) -> None:
    holder = worker("session_hold", db_url, table, key)
    try:
        assert holder.stdout is not None
        token = int(holder.stdout.readline())
        lock = client.lock(key, ttl=None)
        assert not lock.acquire(timeout=0)
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        started = time.monotonic()
        assert lock.acquire(timeout=10)
        assert time.monotonic() - started < 3  # no lease to wait out
        assert lock.token is not None and lock.token > token
        lock.release()
    finally:
        finish(holder)


@pytest.mark.needs("SessionHolds", "server")
def test_a_server_side_kill_of_the_holder_fires_on_lost_and_release_raises(
    provider: Provider, client: dblock.Client, table: str, key: str
) -> None:
    lost = threading.Event()
    lock = client.lock(key, ttl=None, on_lost=lambda _lock: lost.set())
    assert lock.acquire(timeout=5)
    lock_token = lock.token
    with provider.connect(table=table) as operator:
        killed = time.monotonic()
        assert operator.force_release(key)  # ends the holder's connection in the server
        assert lost.wait(LOSS_BOUND), "on_lost did not fire"
        assert time.monotonic() - killed < LOSS_BOUND
        assert not lock.held
        after = operator.lock(key, ttl=None)
        assert after.acquire(timeout=5)
        assert after.token is not None and lock_token is not None and after.token > lock_token
        with pytest.raises(dblock.LockLost):
            lock.release()
        after.release()


@pytest.mark.slow
@pytest.mark.needs("SessionHolds", "restart", "blocking")
def test_tokens_increase_across_a_server_restart(provider: Provider, tmp_path: Path) -> None:
    root = tmp_path / "server"
    root.mkdir()
    with provider.private_server(root) as server, table_of(provider) as table:
        client = dblock.connect(server.url, table=table)
        lost = threading.Event()
        try:
            lock = client.lock("k", ttl=None, on_lost=lambda _lock: lost.set())
            assert lock.acquire(timeout=10)
            before = lock.token
            assert before is not None
            server.kill()  # SIGKILL: what the sequence had not logged is lost
            assert lost.wait(LOSS_BOUND + 10)
            server.start()
            with pytest.raises(dblock.LockLost):
                lock.release()
            for ttl in (None, 10.0):  # the kept connections died with it: fresh ones
                with client.lock("k", ttl=ttl, timeout=30) as again:
                    assert again.token is not None and again.token > before
                    before = again.token
        finally:
            client.close()


@pytest.mark.needs("SessionHolds", "blocking", "asyncio")
def test_a_cancelled_async_wait_leaves_nothing_held(
    provider: Provider, client: dblock.Client, table: str, key: str
) -> None:
    holder = client.lock(key, ttl=None)
    assert holder.acquire()

    async def cancelled_then_free() -> bool:
        async with await provider.connect_async(table) as aclient:
            waiting = asyncio.ensure_future(aclient.lock(key, ttl=None).acquire(timeout=30))
            await asyncio.sleep(0.3)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            holder.release()  # the cancelled waiter must not get it now
            await asyncio.sleep(0.3)
            lock = aclient.lock(key, ttl=None)
            got = await lock.acquire(timeout=5)
            await lock.release()
            return bool(got)

    assert asyncio.run(cancelled_then_free())
    with provider.connect(table=table) as other:
        assert other.lock(key, ttl=None).acquire(timeout=1)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
@pytest.mark.needs("SessionHolds", "processes", "blocking")
def test_a_forked_child_leaves_the_parents_session_hold_alone(
    provider: Provider, client: dblock.Client, table: str, key: str
) -> None:
    lock = client.lock(key, ttl=None)
    assert lock.acquire(timeout=5)
    pid = os.fork()
    if pid == 0:  # child: its own session holds on its own connections, then close
        status = 1
        try:
            with client.lock(key + "-child", ttl=None, timeout=5):
                pass
            client.close()
            status = 0
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    with provider.connect(table=table) as other:
        assert not other.lock(key, ttl=None).acquire(timeout=0.5)
    assert lock.held
    lock.release()


@pytest.mark.slow
@pytest.mark.needs("SessionHolds", "server")
def test_a_frozen_network_marks_the_session_hold_lost_within_the_bound(
    provider: Provider, table: str, proxy: tuple[str, FreezingProxy]
) -> None:
    """A partition (nothing comes back, nothing is reset): the keep-alive check overruns its
    deadline, so the holder stops believing it holds within the bound."""
    url, p = proxy
    lost = threading.Event()
    with provider.connect(table=table, url=url) as client:
        lock = client.lock("k", ttl=None, on_lost=lambda _lock: lost.set())
        assert lock.acquire(timeout=5)
        p.frozen.set()
        frozen = time.monotonic()
        assert lost.wait(LOSS_BOUND), "on_lost did not fire"
        assert time.monotonic() - frozen < LOSS_BOUND
        assert not lock.held
        with pytest.raises(dblock.LockLost):
            lock.release()
        p.close()  # the server's side of the session ends too


@pytest.mark.needs("SessionHolds", "Wakeups")
def test_a_lease_waiter_behind_a_session_hold_is_woken_by_its_release(
    provider: Provider, client: dblock.Client, table: str, key: str
) -> None:
    """Without a wake-up it would learn of the release only by its fallback poll, 3.75-5 s
    on; the session's release rings the key's queued lease waiters."""
    taken = threading.Event()
    released: list[float] = []

    def hold_briefly() -> None:
        with client.lock(key, ttl=None):
            taken.set()
            time.sleep(1.0)  # the lease waiter below is queued by then
        released.append(time.monotonic())

    holder = threading.Thread(target=hold_briefly)
    holder.start()
    assert taken.wait(10)
    with provider.connect(table=table) as other:
        lease = other.lock(key, ttl=10)
        assert lease.acquire(timeout=10)
        got = time.monotonic()
        lease.release()
    holder.join()
    assert got - released[0] < 3.0
