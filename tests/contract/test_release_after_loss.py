"""A release after a detected loss (issue 44, point 4): the hold is known lost, so release()
raises LockLost and forgets it, whatever the store answers (here: nothing, it is out of
reach)."""

from __future__ import annotations

import threading

import pytest

import dblock
from tests.providers import Provider


@pytest.mark.slow  # a store that is out of reach answers at its statement deadline
@pytest.mark.needs("outage")
def test_a_release_after_on_lost_raises_lock_lost_even_with_the_store_out_of_reach(
    provider: Provider, table: str, key: str
) -> None:
    lost = threading.Event()
    with provider.own_store() as url, provider.connect(table=table, url=url) as client:
        lock = client.lock(key, ttl=0.5, on_lost=lambda _lock: lost.set())
        assert lock.acquire()
        assert lost.wait(10)  # the unrenewed lease ran out: on_lost has run
        assert not lock.held
        with provider.outage(url, table):
            with pytest.raises(dblock.LockLost):
                lock.release()
            assert not lock.held
            with pytest.raises(dblock.NotHeld):
                lock.release()  # the lost hold is forgotten, not left registered
