"""Cancelling an async acquire leaves nothing behind (API.md § Async; docs/async.md
§ Cancellation): no hold, no queue entry, no connection checked out or left open; a grant
that raced the cancellation is ended before ``CancelledError`` reaches the caller; the
cleanup survives a second cancellation. Every check is made from outside the client under
test: a fresh blocking client, raw SQL where the provider has it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dblock import _drive
from dblock._engine import Call, Wait
from dblock._green import await_
from tests._internals import ConnectionTracker, pool_busy, store_of
from tests._worker import enter_fenced, leave_fenced
from tests.contract._async_kit import (
    KINDS,
    Outside,
    assert_quiet,
    cancel_at,
    kinds_of,
    make_lock,
    outside,
)
from tests.providers import Provider

# the async client under test is made here (provider.connect_async); the clients that look
# from outside are blocking ones: one run per store, the [sync] one
pytestmark = pytest.mark.needs("blocking", "asyncio")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop the test drives step by step (its blocking checks run between steps)."""
    loop = asyncio.new_event_loop()
    try:
        yield loop
    finally:
        loop.close()


@pytest.fixture
def view(provider: Provider, table: str) -> Iterator[Outside]:
    with outside(provider, table) as v:
        yield v


@pytest.fixture
def aclient(provider: Provider, table: str, loop: asyncio.AbstractEventLoop) -> Iterator[Any]:
    client = loop.run_until_complete(provider.connect_async(table=table))
    try:
        yield client
    finally:
        loop.run_until_complete(client.close())


def _fresh_key() -> str:
    return "k-" + uuid.uuid4().hex


async def _acquire_and_keep(lock: Any, timeout: float, got: list[int]) -> None:
    """Acquire; if granted, keep it until cancelled, then release (the cancellation then
    came after the grant, which is not what these tests are about)."""
    if not await lock.acquire(timeout=timeout):
        return
    got.append(lock.token)
    try:
        await asyncio.Event().wait()
    finally:
        await lock.release()


# points of cancellation: loop turns (steps of the acquire) or seconds (statements in flight)
POINTS = st.one_of(st.integers(0, 60), st.just(0.0), st.floats(0.0, 0.03))


def test_cancel_at_any_point_leaves_nothing(
    provider: Provider,
    table: str,
    loop: asyncio.AbstractEventLoop,
    aclient: Any,
    view: Outside,
) -> None:
    holder = provider.connect(table=table)
    tracker = ConnectionTracker(aclient)

    @settings(
        max_examples=30,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(
        kind=st.sampled_from(kinds_of(provider)),
        held=st.booleans(),
        first=POINTS,
        second=st.none() | st.integers(0, 30),
    )
    def example(kind: str, held: bool, first: float | int, second: int | None) -> None:
        key = _fresh_key()
        tracker.forget()
        theirs = make_lock(holder, kind, key)
        if held:
            assert theirs.acquire(blocking=False)
        got: list[int] = []

        async def attempt() -> None:
            task = asyncio.ensure_future(_acquire_and_keep(make_lock(aclient, kind, key), 5, got))
            await cancel_at(task, first)
            if second is not None:  # a second cancel, maybe while the first one's cleanup runs
                await cancel_at(task, second)
            await asyncio.wait([task])
            assert task.cancelled()

        loop.run_until_complete(attempt())
        assert not (held and got), "granted while another client held the key"
        view.assert_clean(key, but=(theirs.owner,) if held else ())
        assert_quiet(aclient, tracker)
        if held:
            theirs.release()
        view.next_gets(kind, key)

    try:
        example()
    finally:
        holder.close()


class _AfterGrant:
    """Stops the async acquire at its ``at``-th store operation after a grant (0: the first),
    once that operation is done, until the task is cancelled there: a cancellation that lands
    in a worker thread's call (an unsubscribe, a renewal) just as it finishes."""

    def __init__(self, at: int, store: Any) -> None:
        self.at = at
        self.store = store
        self.granted = False
        self.active = True  # (not in the release of an acquire that was not stopped)
        self.after = 0
        self.reached = asyncio.Event()

    def execute(self, real: Any, op: Any, store: Any) -> Any:
        value = real(op, store)
        if store is not self.store or not self.active:
            pass  # another client's
        elif self.granted:
            self.after += 1
            if self.after - 1 == self.at:
                self.reached.set()
                await_(asyncio.Event().wait())  # until cancelled
        elif isinstance(op, Call) and op.method.startswith("acquire") and type(value) is int:
            self.granted = True  # a fresh grant's token
        elif isinstance(op, Wait) and op.subscription.granted is not None:
            self.granted = True  # a hold handed over by its releaser
        return value


@pytest.mark.parametrize("kind", list(KINDS))
def test_cancel_in_each_step_after_a_grant_leaves_nothing(
    provider: Provider,
    table: str,
    loop: asyncio.AbstractEventLoop,
    aclient: Any,
    view: Outside,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
) -> None:
    """A waiter is granted the key as its holder lets go, and cancelled in each store
    operation that follows the grant in turn (its unsubscribe, a renewal of a hand-over),
    once that operation is done: it ends with no hold and no queue entry."""
    provider.require(*KINDS[kind])
    tracker = ConnectionTracker(aclient)
    real = _drive._execute
    for at in range(6):
        key = _fresh_key()
        tracker.forget()
        hook = _AfterGrant(at, store_of(aclient))
        monkeypatch.setattr(_drive, "_execute", functools.partial(hook.execute, real))
        holder = provider.connect(table=table)
        theirs = make_lock(holder, kind, key)
        # the holder's calls run on a thread of their own (its owner), never on the loop: a
        # blocking release there would stop the waiter's statements, whose row locks it may
        # wait for (MariaDB: until the 5 s statement deadline)
        own = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        assert own.submit(theirs.acquire, blocking=False).result()

        async def scenario(
            hook: _AfterGrant = hook,
            theirs: Any = theirs,
            key: str = key,
            own: concurrent.futures.Executor = own,
        ) -> bool:
            got: list[int] = []
            task = asyncio.ensure_future(_acquire_and_keep(make_lock(aclient, kind, key), 10, got))
            await asyncio.sleep(0.2)  # it waits now
            # the waiter is granted the key
            await asyncio.get_running_loop().run_in_executor(own, theirs.release)
            while not (task.done() or hook.reached.is_set() or got):
                await asyncio.sleep(0.01)
            hook.active = False
            task.cancel()
            await asyncio.wait([task])
            assert task.cancelled()
            return hook.reached.is_set()

        try:
            reached = loop.run_until_complete(scenario())
        finally:
            monkeypatch.setattr(_drive, "_execute", real)
            own.shutdown()
            holder.close()
        assert hook.granted, "the waiter was not granted the key"
        view.assert_clean(key)
        assert_quiet(aclient, tracker)
        view.next_gets(kind, key)
        if not reached:
            break  # the acquire had no more steps after the grant: all were cancelled in
    else:
        raise AssertionError("more steps after a grant than expected")


@pytest.mark.needs("sql")
@pytest.mark.parametrize("cancels", [1, 2])
@pytest.mark.parametrize("let_go", ["with_the_cancel", "after_it"])
def test_grant_won_in_flight_is_released_before_cancelled_error(
    provider: Provider,
    table: str,
    loop: asyncio.AbstractEventLoop,
    aclient: Any,
    view: Outside,
    let_go: str,
    cancels: int,
) -> None:
    """The acquiring statement waits for another session's row (or file) lock and is
    cancelled there; the blocker lets go in the same turn of the loop as the cancel (the
    statement commits the grant before the cancellation reaches it) or after it (the store
    may abort the statement first). A second cancel lands while the first one's cleanup
    runs. Whichever won, the caller's ``except CancelledError`` finds the key free."""
    key = _fresh_key()
    view.next_gets("lock", key)  # the key's row exists, for a row lock to hold up
    blocker = provider.raw()
    cur = blocker.cursor()
    provider.hold_up_writes(cur, table, key)
    seen: dict[str, Any] = {}

    async def caller() -> None:
        try:
            await aclient.lock(key, ttl=30).acquire(timeout=30)
        except asyncio.CancelledError:
            seen["holds"] = await asyncio.to_thread(view.holds, key)
            raise
        seen["acquired"] = True

    async def scenario() -> None:
        task = asyncio.ensure_future(caller())
        slept = time.monotonic()
        await asyncio.sleep(0.3)  # the statement now waits for the blocker's lock
        if time.monotonic() - slept > 3:
            cur.execute("COMMIT")
            await asyncio.wait([task])
            if not task.cancelled():
                task.exception()  # retrieved: it is the frozen loop's doing, reported below
            pytest.xfail("the store's driver blocks the event loop while a statement waits")
        task.cancel()
        if let_go == "with_the_cancel":
            cur.execute("COMMIT")  # before the task runs again: the grant is committed
        for _ in range(cancels - 1):
            await asyncio.sleep(0)  # lands in the store's own reaction to the first
            task.cancel()
        if let_go == "after_it":
            await asyncio.sleep(0.1)
            cur.execute("COMMIT")
        await asyncio.wait([task])
        assert task.cancelled()

    try:
        loop.run_until_complete(scenario())
    finally:
        blocker.close()
    assert seen == {"holds": []}
    view.assert_clean(key)
    assert pool_busy(aclient) == (0, 0)
    view.next_gets("lock", key)


def _hold_elsewhere(provider: Provider, table: str, kind: str, key: str) -> Any:
    """A client of its own holding ``key`` (the caller closes it)."""
    holder = provider.connect(table=table)
    assert make_lock(holder, kind, key).acquire(blocking=False)
    return holder


async def _by_timeout(lock: Any) -> None:
    async with asyncio.timeout(0.2):
        await lock.acquire()


async def _by_wait_for(lock: Any) -> None:
    await asyncio.wait_for(lock.acquire(), 0.2)


async def _by_leaving_async_with(lock: Any) -> None:
    async def body() -> None:
        async with lock:
            raise AssertionError("entered a held lock")

    task = asyncio.ensure_future(body())
    await asyncio.sleep(0.2)
    task.cancel()
    await asyncio.wait([task])
    assert task.cancelled()
    raise TimeoutError  # the same outcome as the other two, for the test below


@pytest.mark.parametrize("how", [_by_timeout, _by_wait_for, _by_leaving_async_with])
@pytest.mark.parametrize("kind", ["lock", "fair"])
def test_timeout_wait_for_and_async_with_leave_nothing(
    provider: Provider,
    table: str,
    loop: asyncio.AbstractEventLoop,
    aclient: Any,
    view: Outside,
    how: Any,
    kind: str,
) -> None:
    provider.require(*KINDS[kind])
    if how is _by_timeout and sys.version_info < (3, 11):
        pytest.skip("asyncio.timeout is new in Python 3.11")
    key = _fresh_key()
    holder = _hold_elsewhere(provider, table, kind, key)
    tracker = ConnectionTracker(aclient)
    try:
        # asyncio.TimeoutError: wait_for's before Python 3.11, where it is not TimeoutError
        with pytest.raises((TimeoutError, asyncio.TimeoutError)):
            loop.run_until_complete(how(make_lock(aclient, kind, key)))
        view.assert_clean(key, but=tuple(info.owner for info in view.holds(key)[:1]))
        assert_quiet(aclient, tracker)
        # the holder's hold was left alone; force it before its client closes (closing
        # ends a ZooKeeper session, and the holds that live in it, at once)
        assert view.client.force_release(key)
    finally:
        holder.close()
    view.next_gets(kind, key)


@pytest.mark.needs("pool")
def test_thousand_tasks_ten_keys_a_third_cancelled(
    provider: Provider,
    table: str,
    loop: asyncio.AbstractEventLoop,
    view: Outside,
) -> None:
    """1,000 tasks of one client on 10 keys, a third of them cancelled at random moments:
    never two inside one key, every task not cancelled gets its turn, nothing is left, and
    the connections stay within what docs/async.md § "Connections and waiting" promises:
    the pool's bound, plus one per key waited for (SQLite, MySQL) or one LISTEN connection
    (PostgreSQL)."""
    pool = 4
    keys = [_fresh_key() for _ in range(10)]
    client = loop.run_until_complete(provider.connect_async(table=table, max_connections=pool))
    tracker = ConnectionTracker(client)
    inside = dict.fromkeys(keys, 0)
    entered: set[int] = set()
    rng = random.Random(20261125)

    overlaps: list[str] = []

    async def work(i: int, key: str) -> None:
        async with client.lock(key, ttl=30):
            inside[key] += 1
            try:
                if inside[key] > 1:
                    overlaps.append(key)
                await asyncio.sleep(0)
            finally:  # a task cancelled at the sleep leaves too (its release follows)
                inside[key] -= 1
            entered.add(i)

    async def run() -> list[asyncio.Task[None]]:
        tasks = [asyncio.ensure_future(work(i, keys[i % len(keys)])) for i in range(1000)]
        for task in rng.sample(tasks, len(tasks) // 3):
            loop.call_later(rng.uniform(0, 0.5), task.cancel)
        await asyncio.wait(tasks)
        return tasks

    try:
        tasks = loop.run_until_complete(run())
        cancelled = {i for i, task in enumerate(tasks) if task.cancelled()}
        errors = [task.exception() for task in tasks if not task.cancelled() and task.exception()]
        assert errors == []
        assert overlaps == [], "two tasks were inside one key at once"
        assert cancelled, "no task was cancelled before it was done"
        assert set(range(1000)) - cancelled <= entered
        for key in keys:
            view.assert_clean(key)
        assert_quiet(client, tracker)
        assert tracker.peak <= pool + len(keys) + 1
    finally:
        loop.run_until_complete(client.close())


@pytest.mark.needs("processes")
def test_sync_process_and_async_tasks_take_turns_with_rising_tokens(
    provider: Provider,
    table: str,
    loop: asyncio.AbstractEventLoop,
    aclient: Any,
    tmp_path: Path,
) -> None:
    """A blocking client in another process and async tasks contend on one key; each holder
    checks a shared record: nobody else inside, and its token above every earlier one."""
    key = _fresh_key()
    record = tmp_path / "record"
    record.write_text("0 0")
    assert provider.url is not None
    per_side = 30
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests._worker",
            "fence",
            provider.url,
            table,
            key,
            str(per_side),
            str(record),
        ],
        cwd=ROOT,
    )

    async def task(n: int) -> None:
        for _ in range(n):
            async with aclient.lock(key, ttl=30, timeout=120) as lock:
                enter_fenced(str(record), lock.token)
                await asyncio.sleep(0.002)
                leave_fenced(str(record), lock.token)

    try:

        async def tasks() -> None:
            await asyncio.gather(*(task(per_side // 3) for _ in range(3)))

        loop.run_until_complete(tasks())
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    tokens = [int(line) for line in (tmp_path / "record.log").read_text().split()]
    assert len(tokens) == 2 * per_side
    assert tokens == sorted(set(tokens))


@pytest.mark.parametrize("raises", [False, True])
@pytest.mark.parametrize("coroutine", [True, False])
def test_on_lost_runs_on_the_loop_with_the_lock(
    provider: Provider,
    loop: asyncio.AbstractEventLoop,
    aclient: Any,
    view: Outside,
    caplog: pytest.LogCaptureFixture,
    coroutine: bool,
    raises: bool,
) -> None:
    """force_release from outside while an auto_renew lock is held: ``on_lost`` (a coroutine
    function, run as a task on the client's loop, or a plain function) gets the lock object;
    an exception it raises is logged on the ``dblock`` logger."""
    key = _fresh_key()
    calls: list[tuple[Any, asyncio.AbstractEventLoop | None]] = []
    called = asyncio.Event()

    def note(lock: Any) -> None:
        calls.append((lock, _running_loop()))
        loop.call_soon_threadsafe(called.set)
        if raises:
            raise RuntimeError("on_lost failed")

    async def async_note(lock: Any) -> None:
        assert asyncio.current_task() is not None
        note(lock)

    async def scenario() -> Any:
        lock = aclient.lock(
            key, ttl=1.5, auto_renew=True, on_lost=async_note if coroutine else note
        )
        assert await lock.acquire()
        assert await asyncio.to_thread(view.client.force_release, key)
        await asyncio.wait_for(called.wait(), 20)
        await asyncio.sleep(0.05)  # the exception, if any, is logged after the call
        return lock

    with caplog.at_level(logging.WARNING, logger="dblock"):
        lock = loop.run_until_complete(scenario())
    assert len(calls) == 1
    assert calls[0][0] is lock
    if coroutine:
        assert calls[0][1] is loop
    logged = [r for r in caplog.records if r.name == "dblock" and r.exc_info]
    assert bool(logged) == raises
    if raises:
        assert "on_lost failed" in str(logged[0].exc_info[1])


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


@pytest.mark.needs("LossPush")
def test_a_cancellation_while_a_grant_starts_its_loss_watch_ends_the_hold(
    provider: Provider,
    table: str,
    loop: asyncio.AbstractEventLoop,
    aclient: Any,
    view: Outside,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The last step of an acquire with ``on_lost`` or ``auto_renew``, on a store that pushes
    losses, registers the loss watch (I/O on some stores). A cancellation that lands there,
    after the grant, must end the hold: before, it was left held and renewed forever (found
    by a cancelled election campaign on ZooKeeper)."""
    store = store_of(aclient)
    real_watch = store.watch
    reached = asyncio.Event()

    def slow_watch(key: str, owner: str, heard: Any) -> Any:
        loop.call_soon_threadsafe(reached.set)
        await_(asyncio.sleep(0.5))  # where the cancellation lands
        return real_watch(key, owner, heard)

    monkeypatch.setattr(store, "watch", slow_watch)
    key = _fresh_key()

    async def attempt() -> None:
        lock = aclient.lock(key, ttl=30, auto_renew=True)
        task = asyncio.ensure_future(lock.acquire())
        await asyncio.wait_for(reached.wait(), 10)
        task.cancel()
        await asyncio.wait([task])
        assert task.cancelled()

    loop.run_until_complete(attempt())
    view.assert_clean(key)
    view.next_gets("lock", key)
