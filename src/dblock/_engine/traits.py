"""What a store declares, read once per client: the engine's choices by capability."""

from __future__ import annotations

from dataclasses import dataclass, field

from .._contract import FairQueue, OnceRecords, QueueJoin, Store, Wakeups, provides
from .replies import Replies


@dataclass(frozen=True)
class Traits:
    """The capabilities of one store that change how the engine waits."""

    #: waiters keep a queue entry and are served in arrival order
    fair: bool
    #: a waiter reads before each try (``FairQueue.probe_before_try``)
    probe_before_try: bool
    #: the store wakes waiters; else they sleep between tries
    wakeups: bool
    #: longest pause between two tries of a waiter that is not woken
    poll_cap: float
    #: the store as ``QueueJoin`` (take-or-join in one step, when it says wake-ups flow now),
    #: if it declares it and ``Wakeups``
    joiner: QueueJoin | None
    #: the store keeps once-records, which share the keys' namespace with locks
    records: bool = False
    #: round trips seen by this client's acquisitions (mutable, in a frozen record)
    replies: Replies = field(default_factory=Replies, compare=False, repr=False)

    @classmethod
    def of(cls, store: Store) -> Traits:
        wakeups = provides(store, Wakeups)
        joiner = store if wakeups and provides(store, QueueJoin) else None
        return cls(
            fair=provides(store, FairQueue),
            probe_before_try=store.probe_before_try if provides(store, FairQueue) else False,
            wakeups=wakeups,
            poll_cap=store.poll_cap,
            joiner=joiner,
            records=provides(store, OnceRecords),
        )
