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
Targets (issue 27): (a) quorum ≥ 1.3× Redlock; (b) quorum fairness ≥ 0.9.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import Any

HOLD = 0.005
WORKERS = 8
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
            os.mkdir(os.path.join(root, str(i)))
            procs.append(
                subprocess.Popen(
                    [server, "--bind", "127.0.0.1", "--port", str(port), "--save", ""]
                    + ["--appendonly", "no", "--dir", os.path.join(root, str(i))],
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


def uncontended(name: str, urls: list[str], ops: int) -> float:
    c = CONTENDERS[name](urls)
    prefix = uuid.uuid4().hex[:8]
    for i in range(20):  # warm-up: connections, scripts
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
    name: str, urls: list[str], key: str, duration: float, out: Any, inside: Any, ready: Any
) -> None:
    c = CONTENDERS[name](urls)
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


def contended(name: str, urls: list[str], duration: float) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    inside = ctx.Value("i", 0)
    ready = ctx.Barrier(WORKERS)
    key = f"c-{uuid.uuid4().hex[:8]}"
    procs = [
        ctx.Process(target=_worker, args=(name, urls, key, duration, out, inside, ready))
        for _ in range(WORKERS)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=duration + 300) for _ in procs]
    for p in procs:
        p.join(30)
    counts = [len(w) for _, w, _ in results]
    waits = sorted(x for _, w, _ in results for x in w[1:])  # each first wait: start-up
    p99 = waits[int(0.99 * (len(waits) - 1))] if waits else float("nan")
    return {
        "sections_per_s": sum(counts) / duration,
        "wait_p50_ms": 1000 * statistics.median(waits) if waits else float("nan"),
        "wait_p99_ms": 1000 * p99,
        "fairness": min(counts) / max(counts) if max(counts) else 0.0,
        "overlaps": sum(o for _, _, o in results),
    }


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
                rates[name].append(uncontended(name, urls, args.ops))
        for name in CONTENDERS:
            report[name]["uncontended_ops_per_s"] = statistics.median(rates[name])
            report[name].update(contended(name, urls, args.duration))
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
    for what, value, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {what}: {value}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
