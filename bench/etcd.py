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
import json
import multiprocessing as mp
import os
import statistics
import time
import uuid
from typing import Any

HOLD = 0.005
WORKERS = 8


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


def uncontended(name: str, url: str, ops: int) -> float:
    c = CONTENDERS[name](url)
    prefix = uuid.uuid4().hex[:8]
    for i in range(20):  # warm-up: connections, leases
        lock = c.lock(f"w-{prefix}-{i}")
        c.take(lock)
        lock.release()
    started = time.perf_counter()
    for i in range(ops):
        lock = c.lock(f"u-{prefix}-{i}")
        c.take(lock)
        lock.release()
    elapsed = time.perf_counter() - started
    c.close()
    return ops / elapsed


def _worker(
    name: str, url: str, key: str, duration: float, out: Any, inside: Any, ready: Any
) -> None:
    c = CONTENDERS[name](url)
    waits: list[float] = []
    overlaps = 0
    lock = c.lock(key)
    ready.wait()  # every worker connected: they start together
    until = time.time() + duration
    while time.time() < until:
        asked = time.perf_counter()
        c.take(lock)
        waits.append(time.perf_counter() - asked)
        with inside.get_lock():
            inside.value += 1
            overlaps += inside.value > 1
        time.sleep(HOLD)
        with inside.get_lock():
            inside.value -= 1
        lock.release()
    c.close()
    out.put((os.getpid(), waits, overlaps))


def contended(name: str, url: str, duration: float) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    inside = ctx.Value("i", 0)
    ready = ctx.Barrier(WORKERS)
    key = f"c-{uuid.uuid4().hex[:8]}"
    procs = [
        ctx.Process(target=_worker, args=(name, url, key, duration, out, inside, ready))
        for _ in range(WORKERS)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=duration + 120) for _ in procs]
    for p in procs:
        p.join(30)
    counts = [len(w) for _, w, _ in results]
    waits = sorted(x for _, w, _ in results for x in w[1:])  # each first wait: start-up
    throughput = sum(counts) / duration
    ideal = (WORKERS - 1) / throughput if throughput else float("inf")
    p99 = waits[int(0.99 * (len(waits) - 1))] if waits else float("nan")
    return {
        "sections_per_s": throughput,
        "wait_p50_ms": 1000 * statistics.median(waits) if waits else float("nan"),
        "wait_p99_ms": 1000 * p99,
        "ideal_wait_ms": 1000 * ideal,
        "p99_over_ideal": p99 / ideal if ideal else float("nan"),
        "fairness": min(counts) / max(counts) if max(counts) else 0.0,
        "overlaps": sum(o for _, _, o in results),
    }


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
        report[name] = {"uncontended_ops_per_s": uncontended(name, args.url, args.ops)}
        report[name].update(contended(name, args.url, args.duration))
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
    for what, value, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {what}: {value}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
