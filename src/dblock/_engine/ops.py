"""What the engine asks its driver to do: the only way the lock semantics touch the world.

An engine step is a generator that yields these operations and receives their results; a
blocking driver runs each one and sends back its value, an asyncio driver awaits it. A
failed operation is thrown into the generator at the ``yield``, so its ``finally`` clauses
(leave the queue, stop listening) run on both drivers alike, also on cancellation.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar, Union

if TYPE_CHECKING:
    from .._contract import Subscription

T = TypeVar("T")
P = ParamSpec("P")


# Plain classes with __slots__: one is built for every step, on the hot path of every
# acquire and release, and a frozen dataclass costs several times more to construct.


class Call:
    """Run one operation of the store contract (or of a capability the store declares), named
    by the contract's own method: ``Call(FairQueue.probe, key, owner)`` runs
    ``store.probe(key, owner)`` (the store's implementation of it); the value is its result.
    mypy checks the arguments against the contract's signature."""

    __slots__ = ("args", "method")

    def __init__(
        self, operation: Callable[Concatenate[Any, P], Any], *args: P.args, **kwargs: P.kwargs
    ) -> None:
        if kwargs:
            raise TypeError("a store call's arguments are positional")
        #: the operation's name, which the store's class implements
        self.method: str = operation.__name__
        self.args: tuple[Any, ...] = args

    def __repr__(self) -> str:
        return f"Call({self.method!r}, {self.args!r})"


class Subscribe:
    """``store.subscribe(key, owner, queue)`` (a store with ``Wakeups``); the value is the
    Subscription."""

    __slots__ = ("key", "owner", "queue")

    def __init__(self, key: str, owner: str, queue: str | None) -> None:
        self.key, self.owner, self.queue = key, owner, queue


class Wait:
    """Wait on a subscription up to ``timeout`` s; the value: True if woken early."""

    __slots__ = ("subscription", "timeout")

    def __init__(self, subscription: Subscription, timeout: float) -> None:
        self.subscription, self.timeout = subscription, timeout


class Sleep:
    """Sleep ``seconds`` (a waiter on a store that does not wake it)."""

    __slots__ = ("seconds",)

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds


class Unsubscribe:
    """Close a subscription."""

    __slots__ = ("subscription",)

    def __init__(self, subscription: Subscription) -> None:
        self.subscription = subscription


Op = Union[Call, Subscribe, Wait, Sleep, Unsubscribe]  # noqa: UP007 - a runtime alias on 3.10
#: an engine step: yields operations, returns ``T``
Steps = Generator[Op, Any, T]
