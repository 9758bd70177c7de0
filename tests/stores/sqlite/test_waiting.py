"""SQLite's waiters: a change watch wakes at every commit to the file, so only the head of a
queue and the next in line watch; waiters further back pace themselves (issue 52: with 64
waiting processes each polling the file, the machine ran out of CPU)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import dblock
from tests._internals import store_of
from tests._waiting import start_in_turn

#: the last has 9 ahead: it looks about every 45 ms (TurnPacer), the head at every commit, and
#: the head's looks stay at least twice the last's on a machine 2-3 times slower than usual
#: (with 6 waiters and a factor 3, such a run saw 74 against 33)
WAITERS = 10
CHURN_S = 1.0


def _counting_probes(client: dblock.Client) -> list[int]:
    store = store_of(client)
    probe = store.probe
    count = [0]

    def counted(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return probe(*args, **kwargs)

    store.probe = counted
    return count


def test_waiters_behind_the_next_in_line_do_not_look_at_every_commit(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/locks.sqlite3"
    clients = [dblock.connect(url) for _ in range(WAITERS + 2)]
    holder, churner, waiters = clients[0], clients[1], clients[2:]
    order: list[int] = []
    try:
        lock = holder.lock("job", ttl=60)
        lock.acquire()
        counts = []
        threads = []
        look = store_of(churner)
        for i, client in enumerate(waiters):
            counts.append(_counting_probes(client))

            def wait(i: int = i, client: dblock.Client = client) -> None:
                mine = client.lock("job", ttl=60)
                mine.acquire(timeout=30)
                order.append(i)
                mine.release()

            threads.append(threading.Thread(target=wait, daemon=True))
        start_in_turn(threads, lambda: look.probe("job", "nobody")[1])  # queued in this order
        before = [c[0] for c in counts]
        end = time.monotonic() + CHURN_S
        other = churner.lock("other", ttl=60)
        while time.monotonic() < end:  # a commit every few hundred microseconds
            other.acquire()
            other.release()
        looks = [c[0] - b for c, b in zip(counts, before, strict=True)]
        lock.release()
        for thread in threads:
            thread.join(30)
        assert order == list(range(WAITERS)), "served in arrival order"
        head, last = looks[0], looks[-1]
        # the head looks at (nearly) every commit; the last, nine behind it, by the pace of
        # its queue (a wrong waiter looks as often as the head)
        assert head >= 20, looks
        assert last * 2 <= head, looks
    finally:
        for client in clients:
            client.close()
