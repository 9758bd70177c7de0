"""The crowd scenarios' own arithmetic and /proc readings (bench/waiters.py,
bench/crowd_servers.py), and the waiters scenario's floors on the shared servers."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from bench.contenders import Targets
from bench.crowd_servers import listener_pid, tree_cpu
from bench.waiters import FLOORS, _stats, run_cell, targets

from tests._servers import POSTGRESQL_URL, REDIS_URL, require_server


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


def test_a_floor_beside_dblock_tells_whether_a_target_is_beyond_it() -> None:
    def cell(handoff: float, work: float, fairness: float = 1.0) -> dict[str, float]:
        return {"handoff_p50_ms": handoff, "work_per_handoff": work, "fairness": fairness}

    cells = {
        "8": cell(1.0, 10.0),
        "8 floor": cell(0.2, 2.0, 0.5),  # a floor's fairness is not dblock's
        "512": cell(2.0, 60.0),
        "512 floor": cell(0.4, 2.0),
    }
    handoff, work, fairness = targets({"postgresql": cells})
    times = "\u00d7"
    assert handoff["measured"] == (
        f"2.00{times} (2.00 vs 1.00 ms); floor 2.00{times} (0.40 vs 0.20 ms); the floor misses "
        "it too"
    )
    assert not handoff["met"]
    assert work["measured"] == f"6.00{times} (60.00 vs 10.00); floor 1.00{times} (2.00 vs 2.00)"
    assert fairness["met"] and fairness["measured"] == "1.00 (lowest)"
    alone = targets({"redis": {"8": cell(1.0, 4.0), "512": cell(1.2, 4.0)}})
    assert [t["met"] for t in alone] == [True, True, True]
    assert "floor" not in alone[0]["measured"]


@pytest.mark.parametrize(
    ("backend", "floor"), [(store, kind) for store, kinds in FLOORS.items() for kind in kinds]
)
def test_a_floor_cell_runs_and_excludes(backend: str, floor: str, tmp_path: Path) -> None:
    url = POSTGRESQL_URL if backend == "postgresql" else REDIS_URL
    require_server(backend, url)
    t = Targets(**{backend: url})
    rep = run_cell(t, backend, "unused", 2, 2, 0.5, str(tmp_path), floor=floor)
    assert rep["exclusive"], rep
    assert rep["sections"] > 4 and rep["fairness"] > 0
