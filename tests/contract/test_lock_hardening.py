"""Issue 29, lock semantics: re-entry is confirmed by the database (point 3), and the blocking
API refuses to run on a thread that runs an event loop (point 16). Every backend."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

import dblock
from tests._internals import store_call
from tests.providers import Provider

# -- point 3: a re-entrant acquire asks the database ---------------------------------------


def test_reentry_after_force_release_does_not_trust_memory(
    provider: Provider, table: str, key: str
) -> None:
    lost = threading.Event()
    with (
        provider.connect(table=table) as client,
        provider.connect(table=table) as operator,
    ):
        lock = client.lock(key, ttl=30, on_lost=lambda _lock: lost.set())
        assert lock.acquire()
        first = lock.token
        assert first is not None
        assert operator.force_release(key)
        with operator.lock(key, ttl=30) as other:  # someone else takes it at once
            assert not lock.acquire(blocking=False)  # memory said "mine": the DB says no
            assert lost.wait(5)
            assert not lock.held
            info = operator.info(key)
            assert info is not None and info.token == other.token
        # once free again, a re-entrant acquire is a fresh one: a new, larger token
        assert lock.acquire(blocking=False)
        assert lock.token is not None and lock.token > first
        lock.release()
        with pytest.raises(dblock.LockLost):
            lock.release()  # the first, lost hold still reports itself


def test_a_stale_release_after_a_purge_leaves_the_next_holder_alone(
    provider: Provider, table: str, key: str
) -> None:
    """A hold forced away, the key purged, the key taken anew: the stale holder's release is
    LockLost and ends nothing (a store that names holds by a counter restarted by the purge
    would find the new holder's hold under the old name)."""
    with (
        provider.connect(table=table) as client,
        provider.connect(table=table) as operator,
    ):
        stale = client.lock(key, ttl=60, reentrant=False)
        assert stale.acquire(blocking=False)
        assert operator.force_release(key)
        operator.purge()
        fresh = operator.lock(key, ttl=60)
        assert fresh.acquire(blocking=False)
        with pytest.raises(dblock.LockLost):
            stale.release()
        info = operator.info(key)
        assert info is not None and (info.owner, info.token) == (fresh.owner, fresh.token)
        fresh.release()


def test_reentry_confirms_and_renews_a_live_hold(client: dblock.Client, key: str) -> None:
    # 0.8 s of slack for the re-entry's renewal (a quorum's, on a loaded CI machine, took
    # over 0.3 s once)
    lock = client.lock(key, ttl=2.0)
    with lock:
        token = lock.token
        time.sleep(1.2)
        with lock:  # re-entry renews the lease to its ttl, as a renewal would
            assert lock.token == token
            time.sleep(1.2)  # past the first lease's end
            info = client.info(key)
            assert info is not None and info.token == token


def test_a_new_thread_with_a_dead_threads_id_cannot_reenter(
    client: dblock.Client, key: str
) -> None:
    lock = client.lock(key, ttl=30)
    idents: list[int] = []

    def take_and_die() -> None:
        assert lock.acquire()
        idents.append(threading.get_ident())  # exits holding it, never releasing

    dead = threading.Thread(target=take_and_die)
    dead.start()
    dead.join()
    results: list[bool] = []

    def try_it() -> None:
        if threading.get_ident() == idents[0]:  # Python reused the dead thread's id
            results.append(lock.acquire(blocking=False))
            with pytest.raises(dblock.NotHeld):
                lock.release()

    for _ in range(200):
        thread = threading.Thread(target=try_it)
        thread.start()
        thread.join()
        if results:
            break
    if not results:
        pytest.skip("this platform did not reuse the thread id")
    assert results == [False]  # the dead thread's lease is still live: not ours to enter


_PAUSED_HOLDER = textwrap.dedent(
    """
    import json, sys, dblock
    url, table, key, ttl = sys.argv[1:5]
    with dblock.connect(url, table=table) as client:
        lock = client.lock(key, ttl=float(ttl))
        assert lock.acquire()
        print(json.dumps({"token": lock.token}), flush=True)
        sys.stdin.readline()
        again = lock.acquire(blocking=False)
        print(json.dumps({"reentered": again, "token": lock.token}), flush=True)
    """
)


@pytest.mark.needs("processes")
@pytest.mark.parametrize("how", ["expired", "force-released"])
def test_a_paused_holder_whose_lease_was_taken_cannot_reenter(
    provider: Provider, db_url: str, table: str, key: str, how: str
) -> None:
    ttl = 1.0 if how == "expired" else 30.0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen(
        [sys.executable, "-c", _PAUSED_HOLDER, db_url, table, key, str(ttl)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        first = json.loads(child.stdout.readline())["token"]
        child.send_signal(signal.SIGSTOP)
        with provider.connect(table=table) as other:
            if how == "force-released":
                assert other.force_release(key)  # an operator, while the holder is frozen
            taker = other.lock(key, ttl=30)
            assert taker.acquire(timeout=10)
            child.send_signal(signal.SIGCONT)
            child.stdin.write("go\n")
            child.stdin.flush()
            result = json.loads(child.stdout.readline())
            assert result["reentered"] is False
            info = other.info(key)
            assert info is not None and info.token == taker.token > first
            taker.release()
    finally:
        child.send_signal(signal.SIGCONT)
        child.kill()
        child.communicate()


# -- point 16: the blocking API on an event loop's thread ----------------------------------


def _blocking_paths(client: dblock.Client, key: str) -> dict[str, object]:
    """Each blocking acquire path, as a zero-argument callable."""

    @client.locked("{name}", ttl=30, timeout=0)
    def locked_job(name: str) -> None: ...

    @client.scheduled(key + ":job", at_most=30)
    def scheduled_job() -> None: ...

    def enter(manager: object) -> None:
        with manager:  # type: ignore[attr-defined]
            pass

    return {
        "acquire": lambda: client.lock(key).acquire(),
        "acquire-nonblocking": lambda: client.lock(key, reentrant=False).acquire(blocking=False),
        "with": lambda: enter(client.lock(key, timeout=1)),
        "read": lambda: enter(client.rwlock(key).read_lock()),
        "write": lambda: enter(client.rwlock(key).write_lock()),
        "semaphore": lambda: enter(client.semaphore(key, 3)),
        "once": lambda: enter(client.once(key)),
        "locked": lambda: locked_job(key),
        "scheduled": scheduled_job,
    }


#: the capabilities each blocking path needs of the store
_PATH_NEEDS = {
    "read": ("SharedHolds",),
    "write": ("SharedHolds", "FairQueue"),
    "semaphore": ("SharedHolds",),
    "once": ("OnceRecords",),
}


@pytest.mark.needs("blocking")  # the blocking API on a loop's own thread
def test_blocking_api_refuses_to_run_on_an_event_loop(
    client: dblock.Client, key: str, provider: Provider
) -> None:
    paths = {
        name: call
        for name, call in _blocking_paths(client, key).items()
        if provider.has(*_PATH_NEEDS.get(name, ()))
    }

    async def main() -> dict[str, BaseException | None]:
        errors: dict[str, BaseException | None] = {}
        for name, call in paths.items():
            try:
                call()  # type: ignore[operator]
            except dblock.DBLockError as exc:
                errors[name] = exc
            else:
                errors[name] = None
        return errors

    errors = asyncio.run(main())
    for name, exc in errors.items():
        assert isinstance(exc, dblock.DBLockError) and isinstance(exc, RuntimeError), name
        assert "connect_async" in str(exc) and "to_thread" in str(exc), name
    assert client.list(key) == []  # nothing was taken on the way
    # the same calls work off the loop (a worker thread has none running)
    with client.lock(key, timeout=1):
        pass


@pytest.mark.needs("blocking")  # the blocking API on a loop's own thread
def test_many_coroutines_never_share_a_lock_silently(client: dblock.Client, key: str) -> None:
    """The issue's scenario: a `with client.lock(key)` in concurrent handlers. Each handler
    gets the error at once; none enters, and the loop is never blocked."""
    entered = 0

    async def handler() -> str:
        nonlocal entered
        try:
            with client.lock(key, reentrant=False, timeout=0.5):
                entered += 1
                await asyncio.sleep(0.01)
        except RuntimeError as exc:
            return type(exc).__name__
        return "entered"

    async def main() -> list[str]:
        return await asyncio.wait_for(asyncio.gather(*(handler() for _ in range(10))), 30)

    outcomes = asyncio.run(main())
    assert entered == 0
    assert set(outcomes) == {"EventLoopError"}


def test_the_critical_section_in_a_worker_thread_excludes(client: dblock.Client, key: str) -> None:
    inside = 0
    overlaps = 0
    total = 0
    guard = threading.Lock()

    def critical() -> None:
        nonlocal inside, overlaps, total
        with client.lock(key, ttl=30, timeout=60):
            with guard:
                inside += 1
                overlaps += inside > 1
            time.sleep(0.005)
            value = total
            time.sleep(0.001)
            total = value + 1  # a lost update if two ran at once
            with guard:
                inside -= 1

    async def main() -> None:
        await asyncio.gather(*(asyncio.to_thread(critical) for _ in range(30)))

    asyncio.run(main())
    assert (overlaps, total) == (0, 30)


def test_the_error_is_documented_in_the_tree() -> None:
    from dblock._errors import EventLoopError

    assert issubclass(EventLoopError, dblock.DBLockError)
    assert issubclass(EventLoopError, RuntimeError)
    assert not issubclass(EventLoopError, dblock.NotHeld)


# -- point 4: a force-release reaches the holder -------------------------------------------


@pytest.mark.needs("LossPush")
@pytest.mark.parametrize("auto_renew", [True, False])
def test_force_release_is_pushed_to_the_holder(
    provider: Provider, table: str, key: str, auto_renew: bool
) -> None:
    """With a 60 s lease the next renewal is 20 s away: on_lost comes well before it."""
    lost: list[dblock.Lock] = []
    heard = threading.Event()

    def on_lost(lock: dblock.Lock) -> None:
        lost.append(lock)
        heard.set()

    with (
        provider.connect(table=table) as client,
        provider.connect(table=table) as operator,
    ):
        lock = client.lock(key, ttl=60, auto_renew=auto_renew, on_lost=on_lost)
        lock.acquire()
        time.sleep(0.5)  # the client's listener is up
        other = client.lock(key + ":other", ttl=60, auto_renew=True, on_lost=on_lost)
        other.acquire()
        assert operator.force_release(key)
        assert heard.wait(10)
        assert lost == [lock] and not lock.held and other.held
        with pytest.raises(dblock.LockLost):
            lock.release()
        other.release()
        time.sleep(0.3)
        assert lost == [lock]  # once, and never for the lock that was not freed


@pytest.mark.needs("LossPush", "SharedHolds")
def test_force_release_of_a_shared_hold_is_pushed(provider: Provider, table: str, key: str) -> None:
    heard = threading.Event()
    with (
        provider.connect(table=table) as client,
        provider.connect(table=table) as operator,
    ):
        read = client.rwlock(key, ttl=60).read_lock(on_lost=lambda _l: heard.set(), auto_renew=True)
        read.acquire()
        time.sleep(0.5)
        assert operator.force_release(key)
        assert heard.wait(10)
        assert not read.held


def test_force_release_is_noticed_by_the_next_renewal_elsewhere(
    client: dblock.Client, provider: Provider, table: str, key: str
) -> None:
    """Where nothing is pushed (no LossPush), the documented bound: the next renewal."""
    heard = threading.Event()
    lock = client.lock(key, ttl=1.5, auto_renew=True, on_lost=lambda _l: heard.set())
    lock.acquire()
    with provider.connect(table=table) as operator:
        assert operator.force_release(key)
    assert heard.wait(5)  # renewals run every ttl/3 = 0.5 s
    assert not lock.held


_LOOP_WORKER = textwrap.dedent(
    """
    import asyncio, sys, time, dblock
    url, table, key, counter = sys.argv[1:5]
    client = dblock.connect(url, table=table)

    def critical():  # the whole critical section, acquire to release, off the loop
        with client.lock(key, ttl=30, timeout=120):
            with open(counter) as f:
                value = int(f.read() or 0)
            time.sleep(0.002)
            with open(counter, "w") as f:
                f.write(str(value + 1))

    async def main():
        await asyncio.gather(*(asyncio.to_thread(critical) for _ in range(8)))

    asyncio.run(main())
    client.close()
    """
)


@pytest.mark.needs("processes", "blocking")  # its clients are sync scripts in other processes
def test_to_thread_critical_sections_exclude_across_processes(
    db_url: str, table: str, key: str, tmp_path: Path
) -> None:
    counter = tmp_path / "counter"
    counter.write_text("0")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _LOOP_WORKER, db_url, table, key, str(counter)], env=env
        )
        for _ in range(3)
    ]
    for proc in procs:
        assert proc.wait(timeout=240) == 0
    assert counter.read_text() == str(3 * 8)  # no lost update: they excluded each other


def test_another_owner_with_the_right_token_ends_or_renews_nothing(
    client: dblock.Client, provider: Provider, table: str
) -> None:
    """The store's release and renew check the owner, not the token alone: a token is not a
    secret (it is printed, logged and written beside the data it fences). Asked by the
    client that granted the hold, and by another that never saw it."""
    key, owner = f"owner-{uuid.uuid4().hex[:8]}", f"owner-{uuid.uuid4().hex}"
    token = store_call(client, "acquire", key, owner, 30.0, "lock")
    assert token is not None
    other = f"other-{uuid.uuid4().hex}"
    with provider.connect(table=table) as elsewhere:
        for asked in (client, elsewhere):
            assert store_call(asked, "release", key, other, token) is False
            assert store_call(asked, "renew", key, other, token, 30.0) is False
    info = client.info(key)
    assert info is not None and info.token == token
    assert store_call(client, "release", key, owner, token) is True
    assert client.info(key) is None
