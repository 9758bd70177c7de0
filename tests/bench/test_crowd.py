"""The crowd scenarios' own arithmetic and /proc readings (bench/waiters.py,
bench/crowd_servers.py)."""

from __future__ import annotations

import os
import socket

from bench.crowd_servers import listener_pid, tree_cpu
from bench.waiters import _stats


def test_hand_offs_count_only_waiters_queued_before_the_release() -> None:
    # task, requested, acquired, release called
    records = [
        (0, 0.0, 0.0, 1.0),
        (1, 0.5, 1.002, 2.0),  # queued before 1.0: a hand-off of 2 ms
        (0, 1.5, 2.004, 3.0),  # queued before 2.0: 4 ms
        (1, 3.5, 3.6, 4.0),  # asked after the release: not a hand-off
    ]
    stats = _stats(records, 2)
    assert round(stats["handoff_p50_ms"], 3) in (2.0, 4.0)
    assert round(stats["handoff_p99_ms"], 3) == 4.0
    assert stats["fairness"] == 1.0 and stats["min_max"] == "2/2"


def test_jain_s_index_tells_a_starved_task() -> None:
    fair = [(t, 0.0, float(i), float(i) + 0.5) for i, t in enumerate([0, 1, 2, 3] * 3)]
    starved = [(t, 0.0, float(i), float(i) + 0.5) for i, t in enumerate([0, 1, 2] * 4)]
    assert _stats(fair, 4)["fairness"] == 1.0
    assert _stats(starved, 4)["fairness"] < 0.8, "one of four tasks never had a turn"


def test_the_listening_process_and_its_cpu_are_found() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert listener_pid(s.getsockname()[1]) == os.getpid()
    cpu = tree_cpu(os.getpid())
    assert cpu is not None and cpu > 0
    assert tree_cpu(None) is None
