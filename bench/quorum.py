"""dblock's quorum client over three Redis servers beside pottery's ``Redlock`` on the same
three servers, and the quorum's cost against one store, in one run.

    python -m bench.quorum [--ops 300] [--duration 10] [--rounds 3] [--json out.json]

It starts three private redis-servers (loopback, free ports, nothing on disk) and stops
them at the end.

(a) uncontended: one process, ``--ops`` acquire+release of fresh keys, ops/s (the median of
    ``--rounds`` rounds, contenders alternating);
(b) contended: 8 processes on one key for ``--duration`` s, each holding it 5 ms per turn:
    sections/s, wait p50/p99, fairness (fewest/most sections per worker), and overlaps (a
    second holder inside a section).
Contenders: ``dblock quorum`` (3 stores), ``pottery Redlock`` (3 masters), and ``dblock
redis`` (the first server alone: what the quorum costs).
Targets (issue 27): (a) quorum ≥ 1.3x Redlock; (b) quorum fairness ≥ 0.9.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from bench._side_by_side import contended, finish, uncontended

MODULE = "bench.quorum"
TTL = 30.0


class _Quorum:
    def __init__(self, urls: list[str]) -> None:
        import dblock

        self.client = dblock.connect(urls, table="bench_quorum")

    def lock(self, key: str) -> Any:
        return self.client.lock(key, ttl=TTL, reentrant=False)

    def take(self, lock: Any) -> None:
        assert lock.acquire(timeout=120)

    def close(self) -> None:
        self.client.close()


class _Single(_Quorum):
    def __init__(self, urls: list[str]) -> None:
        import dblock

        self.client = dblock.connect(urls[0], table="bench_quorum_one")


class _Redlock:
    def __init__(self, urls: list[str]) -> None:
        import redis

        self.masters = {redis.Redis.from_url(u) for u in urls}

    def lock(self, key: str) -> Any:
        from pottery import Redlock

        return Redlock(key="bench-redlock:" + key, masters=self.masters, auto_release_time=TTL)

    def take(self, lock: Any) -> None:
        assert lock.acquire(blocking=True, timeout=120)

    def close(self) -> None:
        for m in self.masters:
            m.close()


CONTENDERS = {"dblock quorum": _Quorum, "pottery Redlock": _Redlock, "dblock redis": _Single}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def redis_servers(n: int = 3) -> Iterator[list[str]]:
    """``n`` private redis-servers (no persistence); their URLs."""
    server = shutil.which("redis-server") or "/usr/bin/redis-server"
    root = tempfile.mkdtemp(prefix="dblock-bench-quorum-")
    procs, urls = [], []
    try:
        for i in range(n):
            port = _free_port()
            data = os.path.join(root, str(i))
            os.mkdir(data)
            options = ["--port", str(port), "--save", "", "--appendonly", "no", "--dir", data]
            procs.append(
                subprocess.Popen(
                    [server, "--bind", "127.0.0.1", *options],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            urls.append(f"redis://127.0.0.1:{port}/0")
        import redis

        for url in urls:
            for _ in range(100):
                with contextlib.suppress(redis.ConnectionError):
                    redis.Redis.from_url(url).ping()
                    break
                time.sleep(0.05)
        yield urls
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", type=int, default=300)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    report: dict[str, dict[str, Any]] = {name: {} for name in CONTENDERS}
    with redis_servers() as urls:
        rates: dict[str, list[float]] = {name: [] for name in CONTENDERS}
        names = list(CONTENDERS)
        for r in range(max(1, args.rounds)):  # alternate, the order rotating each round
            for name in names[r % len(names) :] + names[: r % len(names)]:
                rates[name].append(uncontended(MODULE, name, urls, args.ops))
        for name in CONTENDERS:
            report[name]["uncontended_ops_per_s"] = statistics.median(rates[name])
            report[name].update(contended(MODULE, name, urls, args.duration))
    print(
        "| contender | uncontended ops/s | sections/s | p50 wait ms | p99 wait ms "
        "| fairness | overlaps |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, v in report.items():
        print(
            f"| {name} | {v['uncontended_ops_per_s']:.0f} | {v['sections_per_s']:.1f} "
            f"| {v['wait_p50_ms']:.1f} | {v['wait_p99_ms']:.1f} | {v['fairness']:.2f} "
            f"| {v['overlaps']} |"
        )
    ours, theirs = report["dblock quorum"], report["pottery Redlock"]
    one = report["dblock redis"]
    ratio = ours["uncontended_ops_per_s"] / theirs["uncontended_ops_per_s"]
    cost = one["uncontended_ops_per_s"] / ours["uncontended_ops_per_s"]
    print(f"the quorum's cost: one store does {cost:.2f}× its uncontended rate")
    checks = [
        ("(a) uncontended ≥ 1.3× Redlock", f"{ratio:.2f}×", ratio >= 1.3),
        ("(b) fairness ≥ 0.9", f"{ours['fairness']:.2f}", ours["fairness"] >= 0.9),
        ("(b) no overlapping holds", str(ours["overlaps"]), ours["overlaps"] == 0),
    ]
    finish(checks, report, args.json)


if __name__ == "__main__":
    main()
