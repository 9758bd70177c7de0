"""What the engine asks its driver to do: the only way the lock semantics touch the world.

An engine step is a generator that yields these operations and receives their results; a
blocking driver runs each one and sends back its value, an asyncio driver awaits it. A
failed operation is thrown into the generator at the ``yield``, so its ``finally`` clauses
(leave the queue, stop listening) run on both drivers alike, also on cancellation.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, Union

if TYPE_CHECKING:
    from ..backends._contract import Subscription

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Call:
    """Run one operation of the store contract (or of a capability the store declares):
    ``store.<method>(*args)``; the value is its result."""

    method: str
    args: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class Subscribe:
    """``store.subscribe(key, owner, queue)`` (a store with ``Wakeups``); the value is the
    Subscription."""

    key: str
    owner: str
    queue: str | None


@dataclass(frozen=True, slots=True)
class Wait:
    """Wait on a subscription up to ``timeout`` s; the value: True if woken early."""

    subscription: Subscription
    timeout: float


@dataclass(frozen=True, slots=True)
class Sleep:
    """Sleep ``seconds`` (a waiter on a store that does not wake it)."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """Close a subscription."""

    subscription: Subscription


Op = Union[Call, Subscribe, Wait, Sleep, Unsubscribe]  # noqa: UP007 - a runtime alias on 3.10
#: an engine step: yields operations, returns ``T``
Steps = Generator[Op, Any, T]
