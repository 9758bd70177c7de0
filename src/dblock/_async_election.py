"""Leader election on the async client: the blocking election's own code (:mod:`dblock._election`)
run in greenlets on the event loop, with an ``asyncio.Event`` for ``lost`` and a coroutine
function allowed as ``on_lost``."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ._election import Election, Term
from ._green import spawn
from ._loop_runtime import AnyThreadEvent
from ._types import LeaderInfo

if TYPE_CHECKING:
    from ._core import Core

#: runs an awaitable in the client's background, logging what it raises
Background = Callable[[Awaitable[Any], str], None]


class AsyncTerm:
    """A term of the async client's election (see :class:`dblock.Term`): ``await
    proclaim(value)``, ``await resign()``, ``async with``; ``lost`` is an ``asyncio.Event``."""

    def __init__(self, term: Term) -> None:
        self._term = term

    @property
    def name(self) -> str:
        return self._term.name

    @property
    def token(self) -> int:
        return self._term.token

    @property
    def value(self) -> str | None:
        return self._term.value

    @property
    def lost(self) -> asyncio.Event:
        lost: asyncio.Event = self._term.lost
        return lost

    @property
    def leading(self) -> bool:
        return self._term.leading

    @property
    def lease_end(self) -> float | None:
        return self._term.lease_end

    async def proclaim(self, value: str | None) -> None:
        """Change the leader's value (LockLost if the term is over)."""
        await spawn(self._term.proclaim, value)

    async def resign(self) -> None:
        """Give up leadership now (see :meth:`dblock.Term.resign`); a cancellation waits for
        it to complete, then propagates."""
        await spawn(self._term.resign, shielded=True)

    async def __aenter__(self) -> AsyncTerm:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.resign()

    def __repr__(self) -> str:
        return repr(self._term).replace("dblock.Term", "dblock.AsyncTerm")


class _Campaign:
    """What ``election.campaign()`` returns: awaited, the term; or an async context manager
    that resigns on leaving."""

    def __init__(self, start: Callable[[], Any]) -> None:
        self._start = start
        self._term: AsyncTerm | None = None

    def __await__(self) -> Generator[Any, None, AsyncTerm]:
        term: AsyncTerm = yield from self._start().__await__()
        return term

    async def __aenter__(self) -> AsyncTerm:
        self._term = await self._start()
        return self._term

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._term is not None:
            await self._term.resign()


class AsyncElection:
    """``client.election(name)`` of the async client (see :class:`dblock.Election`)."""

    def __init__(
        self,
        core: Core,
        background: Background,
        name: str,
        *,
        ttl: float,
        on_lost: Callable[[AsyncTerm], object] | None,
    ) -> None:
        self._background = background
        self._on_lost = on_lost
        self._sync = Election(
            core,
            name,
            ttl=ttl,
            on_lost=None if on_lost is None else self._lost,
            new_event=AnyThreadEvent,
        )

    @property
    def name(self) -> str:
        return self._sync.name

    @property
    def ttl(self) -> float:
        return self._sync.ttl

    def campaign(self, value: str | None = None, timeout: float | None = None) -> _Campaign:
        """Wait until this client leads, then proclaim ``value``: ``term = await
        election.campaign(...)``, or ``async with election.campaign(...) as term``."""

        async def start() -> AsyncTerm:
            term = await spawn(self._sync.campaign, value, timeout)
            outer = AsyncTerm(term)
            lost_already, term.outer = term.outer is _LOST, outer
            if lost_already:  # lost before it was handed out
                self._call_on_lost(outer)
            return outer

        return _Campaign(start)

    def _lost(self, term: Term) -> None:
        outer = term.outer
        if isinstance(outer, AsyncTerm):
            self._call_on_lost(outer)
        else:  # not handed out yet: start() calls on_lost when it does
            term.outer = _LOST

    def _call_on_lost(self, term: AsyncTerm) -> None:
        if self._on_lost is None:
            return
        result = self._on_lost(term)
        if inspect.isawaitable(result):
            self._background(result, f"on_lost of election {self.name!r}")

    async def leader(self) -> LeaderInfo | None:
        """Who leads now, or None."""
        return await spawn(self._sync.leader)

    async def observe(self) -> AsyncIterator[LeaderInfo | None]:
        """The leader now, then each change, in order (see :meth:`dblock.Election.observe`)."""
        watch = await spawn(self._sync.watch)
        try:
            last: LeaderInfo | object | None = _NOTHING
            while True:
                last = await spawn(self._sync.next_change, last, watch)
                yield last
        finally:
            await spawn(watch.close, shielded=True)

    def __repr__(self) -> str:
        return repr(self._sync).replace("dblock.Election", "dblock.AsyncElection")


_NOTHING = object()
_LOST = object()
