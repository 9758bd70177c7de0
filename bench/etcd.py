"""dblock's etcd store beside tooz's etcd3gw driver, in one run on one etcd.

    python -m bench.etcd [--url etcd://127.0.0.1:2379] [--ops 300] [--duration 10]

(a) uncontended: one process, ``--ops`` acquire+release of fresh keys, ops/s;
(b) contended: 8 processes on one key for ``--duration`` s, each holding it 5 ms per turn:
    sections/s, wait p50/p99, the ideal FIFO wait ((workers-1)/throughput), p99/ideal, and
    fairness (fewest/most sections per worker). A second holder inside a section fails it.
Targets (issue 25): (a) dblock ≥ 1.3x tooz; (b) fairness ≥ 0.9, p99 ≤ 2x ideal.
"""

from __future__ import annotations

import argparse
import os
import uuid
from typing import Any

from bench._side_by_side import contended, finish, uncontended

MODULE = "bench.etcd"


def _gateway(url: str) -> str:
    """tooz's URL of the same etcd (its HTTP gateway, through etcd3gw)."""
    host = url.split("://", 1)[1].split(",", maxsplit=1)[0]
    return f"etcd3+http://{host}"


class _Dblock:
    def __init__(self, url: str) -> None:
        import dblock

        self.client = dblock.connect(url, table="bench_etcd")

    def lock(self, key: str) -> Any:
        return self.client.lock(key, ttl=30, reentrant=False)

    def take(self, lock: Any) -> None:
        assert lock.acquire(timeout=60)

    def close(self) -> None:
        self.client.close()


class _Tooz:
    def __init__(self, url: str) -> None:
        from tooz import coordination

        self.coord = coordination.get_coordinator(
            _gateway(url), f"bench-{uuid.uuid4().hex[:8]}".encode()
        )
        self.coord.start()

    def lock(self, key: str) -> Any:
        return self.coord.get_lock(key.encode())

    def take(self, lock: Any) -> None:
        assert lock.acquire(blocking=True)

    def close(self) -> None:
        self.coord.stop()


CONTENDERS = {"dblock etcd": _Dblock, "tooz etcd3gw": _Tooz}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--url", default=os.environ.get("DBLOCK_BENCH_ETCD_URL", "etcd://127.0.0.1:2379")
    )
    p.add_argument("--ops", type=int, default=300)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    report: dict[str, Any] = {}
    for name in CONTENDERS:
        report[name] = {"uncontended_ops_per_s": uncontended(MODULE, name, args.url, args.ops)}
        report[name].update(contended(MODULE, name, args.url, args.duration))
    print(
        "| contender | uncontended ops/s | sections/s | p50 wait ms | p99 wait ms | ideal ms "
        "| p99/ideal | fairness | overlaps |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, v in report.items():
        print(
            f"| {name} | {v['uncontended_ops_per_s']:.0f} | {v['sections_per_s']:.1f} "
            f"| {v['wait_p50_ms']:.1f} | {v['wait_p99_ms']:.1f} | {v['ideal_wait_ms']:.1f} "
            f"| {v['p99_over_ideal']:.2f} | {v['fairness']:.2f} | {v['overlaps']} |"
        )
    ours, tooz = report["dblock etcd"], report["tooz etcd3gw"]
    ratio = ours["uncontended_ops_per_s"] / tooz["uncontended_ops_per_s"]
    checks = [
        ("(a) uncontended ≥ 1.3× tooz", f"{ratio:.2f}×", ratio >= 1.3),
        ("(b) fairness ≥ 0.9", f"{ours['fairness']:.2f}", ours["fairness"] >= 0.9),
        ("(b) p99 wait ≤ 2× ideal", f"{ours['p99_over_ideal']:.2f}×", ours["p99_over_ideal"] <= 2),
        ("(b) no overlapping holds", str(ours["overlaps"]), ours["overlaps"] == 0),
    ]
    finish(checks, report, args.json)


if __name__ == "__main__":
    main()
