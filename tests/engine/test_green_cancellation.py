"""The greenlet bridge of the async client (dblock._green) under cancellation, without a store:
a cancellation that the awaited step swallowed (returned a value anyway, as ``wait_for`` does
before Python 3.12 when its inner future finished in the same turn, or turned into an error of
its own, as aiomysql does) still reaches the blocking-style code as ``CancelledError`` and ends
the task cancelled, on every supported Python (3.10 has no ``Task.cancelling``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from dblock._green import await_, spawn


async def _returns_anyway() -> str:
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        return "granted"
    raise AssertionError("not reached")


async def _own_error() -> str:
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        raise RuntimeError("Cancelled during execution") from None
    raise AssertionError("not reached")


async def _plain() -> str:
    await asyncio.Event().wait()
    raise AssertionError("not reached")


def _run(step: Callable[[], Awaitable[str]], cancels: int) -> tuple[list[Any], bool]:
    """Cancel a task whose greenlet awaits ``step()`` ``cancels`` times: what the code saw
    (a value, or the exception and its context), and whether the task ended cancelled."""
    seen: list[Any] = []

    def code() -> None:
        try:
            seen.append(await_(step()))
        except BaseException as exc:
            seen.append((type(exc), type(exc.__context__)))
            raise
        seen.append(await_(asyncio.sleep(0, "went on")))

    return seen, asyncio.run(_cancelled(code, [1] * cancels)).cancelled()


async def _cancelled(code: Callable[[], None], turns: list[int]) -> asyncio.Task[None]:
    """Run ``code`` in a task of its own, cancel it after each of ``turns`` turns of the
    loop; the task, once done."""
    task = asyncio.ensure_future(spawn(code))
    for n in turns:
        for _ in range(n):
            await asyncio.sleep(0)
        task.cancel()
    await asyncio.wait([task])
    return task


@pytest.mark.parametrize("cancels", [1, 2])
def test_a_swallowed_cancellation_still_cancels_the_code(cancels: int) -> None:
    seen, cancelled = _run(_returns_anyway, cancels)
    assert seen == [(asyncio.CancelledError, type(None))]
    assert cancelled


@pytest.mark.parametrize("cancels", [1, 2])
def test_a_cancellation_turned_into_a_driver_error_reaches_the_code_as_one(cancels: int) -> None:
    seen, cancelled = _run(_own_error, cancels)
    assert seen == [(asyncio.CancelledError, RuntimeError)]
    assert cancelled


def test_a_plain_cancellation_reaches_the_code() -> None:
    seen, cancelled = _run(_plain, 1)
    assert seen == [(asyncio.CancelledError, type(None))]
    assert cancelled


@pytest.mark.parametrize("turns", range(8))
def test_a_cancellation_after_the_step_finished_lands_at_the_next_await(turns: int) -> None:
    """An ``asyncio.Lock`` taken by the step (the runtime's mutex) is the code's once the step
    finished: a cancellation that comes before the code resumes must not make it look failed
    (the code would never release it), but end the code at its next await."""
    mutex = asyncio.Lock()
    seen: list[str] = []

    def code() -> None:
        await_(mutex.acquire())
        seen.append("acquired")
        try:
            await_(asyncio.sleep(0))
        finally:
            mutex.release()

    task = asyncio.run(_cancelled(code, [turns]))
    assert task.cancelled() or task.result() is None  # or it was done before the cancel
    assert not mutex.locked(), f"the lock was left taken ({seen})"


def test_an_uncancelled_step_returns_its_value() -> None:
    async def main() -> list[str]:
        def code() -> list[str]:
            return [await_(asyncio.sleep(0, "first")), await_(asyncio.sleep(0.01, "second"))]

        return await spawn(code)

    assert asyncio.run(main()) == ["first", "second"]
