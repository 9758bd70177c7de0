"""A stateful model of the lock table, checked against every backend.

Random sequences of acquire / release / renew / force_release / purge by several owners (two
clients, two lock objects each). Invariants: at most one holder, the database agrees with the
model about who it is, and fencing tokens only go up.
"""

from __future__ import annotations

import uuid

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

import dblock
from tests.providers import Provider


class LockTable(RuleBasedStateMachine):
    def __init__(self, clients: list[dblock.Client]) -> None:
        super().__init__()
        self.key = "model-" + uuid.uuid4().hex
        self.clients = clients
        self.locks = [c.lock(self.key, ttl=60, reentrant=False) for c in clients for _ in (0, 1)]
        self.holder: int | None = None  # index into self.locks of the live hold
        # each lock object's holds, newest last: "live", or "lost" (forced away; the object
        # learns it only when it renews or releases, so it may acquire again meanwhile)
        self.stacks: list[list[str]] = [[] for _ in self.locks]
        self.last_token = 0

    @rule(i=st.integers(0, 3))
    def acquire(self, i: int) -> None:
        got = self.locks[i].acquire(blocking=False)
        if self.holder is not None:
            assert not got
            return
        assert got
        token = self.locks[i].token
        assert token is not None and token > self.last_token
        self.last_token = token
        self.holder = i
        self.stacks[i].append("live")

    @rule(i=st.integers(0, 3))
    def release(self, i: int) -> None:
        if not self.stacks[i]:
            with pytest.raises(dblock.NotHeld) as info:
                self.locks[i].release()
            assert not isinstance(info.value, dblock.LockLost)
        elif self.stacks[i].pop() == "live":
            self.locks[i].release()
            self.holder = None
        else:
            with pytest.raises(dblock.LockLost):
                self.locks[i].release()

    @rule(i=st.integers(0, 3))
    def renew(self, i: int) -> None:
        if self.stacks[i] and self.stacks[i][-1] == "live":
            self.locks[i].renew()
        else:
            with pytest.raises(dblock.NotHeld):
                self.locks[i].renew()

    @rule(c=st.integers(0, 1))
    def force_release(self, c: int) -> None:
        assert self.clients[c].force_release(self.key) is (self.holder is not None)
        if self.holder is not None:
            self.stacks[self.holder][-1] = "lost"
            self.holder = None

    @rule(c=st.integers(0, 1))
    def purge(self, c: int) -> None:
        self.clients[c].purge()

    @invariant()
    def database_agrees(self) -> None:
        info = self.clients[0].info(self.key)
        if self.holder is None:
            assert info is None
        else:
            assert info is not None
            assert (info.owner, info.token) == (
                self.locks[self.holder].owner,
                self.locks[self.holder].token,
            )

    def teardown(self) -> None:
        self.clients[0].force_release(self.key)


@pytest.mark.slow
def test_lock_table_model(client: dblock.Client, provider: Provider, table: str) -> None:
    with provider.connect(table=table) as other:
        run_state_machine_as_test(
            lambda: LockTable([client, other]),
            settings=settings(max_examples=40, stateful_step_count=25, deadline=None),
        )
