"""Cancelling an async acquire leaves nothing behind (API.md § Async; docs/async.md
§ Cancellation): no hold, no queue entry, no connection checked out or left open; a grant
that raced the cancellation is ended before ``CancelledError`` reaches the caller; the
cleanup survives a second cancellation. Every check is made from outside the client under
test: a fresh blocking client, raw SQL where the provider has it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests._internals import ConnectionTracker
from tests.contract._async_kit import (
    Outside,
    assert_quiet,
    cancel_at,
    kinds_of,
    make_lock,
    outside,
)
from tests.providers import Provider


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
