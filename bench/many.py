"""Scenarios ``many`` and ``many-contended``: ``client.lock_many`` (issue 47) beside per-key
locks taken in sorted order, the way to take several keys without it.

``many``: one process per store and repeat runs, interleaved in 0.1 s slices (the order
rotated every slice) so that the machine's drifts fall on each alike:

- ``lock_many``: ``lock_many`` of 5 keys, acquired and released (one pair);
- ``sorted singles``: 5 ``client.lock`` locks acquired in sorted order, then released (one
  pair: all 5 acquired and released);
- ``single key``: one ``client.lock`` acquired and released;
- ``store step, 5 keys`` and ``store step, 1 key``: the store's own ``acquire_many`` and
  ``release_many`` called directly, on 5 keys and on 1: what a ``lock_many`` pair costs the
  store, without the client. They bound the ratios: ``lock_many`` cannot beat its store
  step, nor the single key its own.

Targets: ``lock_many`` pairs/s >= 3x sorted singles' pairs/s, and a ``lock_many`` pair's time
<= 1.5x a single-key pair's time.

``many-contended``: ``--workers`` (8) processes, each repeatedly taking a random 3 of 10 keys
(in random order) and holding them about 1 ms (a read-modify-write of each key's counter
file, then the rest of the millisecond asleep), with ``lock_many`` or with per-key locks
taken in sorted order (the variants alternate round by round). Sets/s, the wait per set
(p50, p99), fairness (fewest/most sets per worker), the hand-off (a freed set's passing to
a waiter), and exclusion per key: a lost update on a key's counter or two overlapping holds
of a key make the variant FAILING.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from bench import procs, servers, workload
from bench.contenders import Targets
from dblock.bench import (
    BARRIER_WAIT,
    Record,
    contended_stats,
    exclusion,
    median,
    new_counter,
    percentile,
    read_counter,
    read_modify_write,
)

#: the stores with ManyKeys that the bench reaches by URL
BACKENDS = ("sqlite", "postgresql", "mysql", "redis", "zookeeper", "etcd")
KEYS = 5
SIDES = ("lock_many", "sorted singles", "single key", "store step, 5 keys", "store step, 1 key")
SLICE = 0.1
#: many-contended: keys in all, keys per set, the hold's length
POOL, PER_SET, HOLD = 10, 3, 0.001
VARIANTS = ("lock_many", "sorted singles")
TARGET_VS_SORTED, TARGET_VS_SINGLE = 3.0, 1.5
ACQUIRE_BOUND = 60.0  # seconds: a set not had by then fails the measurement


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- many: uncontended ------------------------------------------------------------------------
class _InOrder:
    """Locks acquired in the order given, released in reverse: one pair is all of them."""

    def __init__(self, locks: list[Any]) -> None:
        self.locks = locks

    def acquire(self) -> None:
        for lk in self.locks:
            lk.acquire()

    def release(self) -> None:
        for lk in reversed(self.locks):
            lk.release()


class _Step:
    """The store's own acquire_many and release_many on ``keys``, called directly."""

    def __init__(self, store: Any, keys: list[str]) -> None:
        self.store, self.keys, self.owner = store, keys, uuid.uuid4().hex
        self.tokens: dict[str, int] = {}

    def acquire(self) -> None:
        tokens = self.store.acquire_many(self.keys, self.owner, 30.0)
        if tokens is None:
            raise RuntimeError(f"the store refused free keys {self.keys}")
        self.tokens = tokens

    def release(self) -> None:
        self.store.release_many(self.tokens, self.owner)


def _pairs(client: Any, tag: str) -> dict[str, Any]:
    """Each side's lock (acquire and release make one pair), on keys of its own."""
    keys = [f"{tag}-{i:02d}" for i in range(4 * KEYS + 1)]  # sorted
    sides = (
        client.lock_many(keys[:KEYS], ttl=30),
        _InOrder([client.lock(k, ttl=30) for k in keys[KEYS : 2 * KEYS]]),
        client.lock(keys[2 * KEYS], ttl=30),
        _Step(client._store, keys[3 * KEYS : 4 * KEYS]),
        _Step(client._store, keys[4 * KEYS :]),
    )
    return dict(zip(SIDES, sides, strict=True))


def _uncontended(
    t: Targets, backend: str, table: str, duration: float, max_ops: int
) -> dict[str, Any]:
    """In a fresh process: each side's pairs/s and client CPU µs per pair, interleaved."""
    import dblock

    with dblock.connect(t.url(backend), table=table) as client:
        pairs = _pairs(client, f"bench-many-{uuid.uuid4().hex[:8]}")
        for lock in pairs.values():
            for _ in range(20):  # warm-up: connections, statements, scripts
                lock.acquire()
                lock.release()
        slices = {s: functools.partial(workload.timed_slice, pairs[s]) for s in SIDES}
        out = workload.interleave(slices, duration, max_ops, SLICE)
    return {
        side: {
            "pairs_per_s": v["ops"] / v["wall"],
            "cpu_us_per_pair": v["cpu"] / v["ops"] * 1e6,
        }
        for side, v in out.items()
    }


def ratios(v: dict[str, Any]) -> dict[str, float]:
    """The targets' ratios, and what the store's own 5-key step allows them (what lock_many
    would reach if the client added nothing): its rate against sorted singles' (the most
    lock_many ÷ sorted could be) and its time against a single-key pair's (the least
    lock_many ÷ single could be)."""
    rate = {side: v[side]["pairs_per_s"] for side in SIDES}
    return {
        "vs_sorted": rate["lock_many"] / rate["sorted singles"],
        "vs_single": rate["single key"] / rate["lock_many"],
        "ceiling_vs_sorted": rate["store step, 5 keys"] / rate["sorted singles"],
        "floor_vs_single": rate["single key"] / rate["store step, 5 keys"],
        "step_5_vs_1": rate["store step, 1 key"] / rate["store step, 5 keys"],
    }


def scenario_many(backends: list[str], t: Targets, b: Any) -> dict[str, Any]:
    def measure(backend: str, table: str, res: dict[str, Any]) -> None:
        def logged(r: int, v: dict[str, Any]) -> None:
            log(
                f"[many] round {r + 1}/{b.repeats} {backend}: "
                + ", ".join(f"{s} {v[s]['pairs_per_s']:,.0f}" for s in SIDES)
                + " pairs/s"
            )

        workload.repeat_interleaved(
            res,
            lambda: procs.run_one(
                _uncontended,
                (t, backend, table, b.duration, b.max_ops),
                timeout=b.duration * len(SIDES) + 120,
            ),
            b.repeats,
            SIDES,
            ("pairs_per_s", "cpu_us_per_pair"),
            ratios,
            logged,
        )

    return servers.each_store([x for x in backends if x in BACKENDS], t, "many", "many", measure)


# -- many-contended ---------------------------------------------------------------------------
def _taker(client: Any, variant: str, keys: list[str]) -> Callable[[list[str]], Any]:
    """What takes a set of keys, as a context manager, for ``variant``."""
    singles = {k: client.lock(k, ttl=30, timeout=ACQUIRE_BOUND) for k in keys}

    @contextlib.contextmanager
    def in_sorted_order(chosen: list[str]) -> Any:
        with contextlib.ExitStack() as stack:
            for k in sorted(chosen):
                stack.enter_context(singles[k])
            yield

    if variant == "lock_many":
        return lambda chosen: client.lock_many(chosen, ttl=30, timeout=ACQUIRE_BOUND)
    return in_sorted_order


def _set_worker(
    t: Targets,
    backend: str,
    table: str,
    variant: str,
    keys: list[str],
    counters: list[str],
    worker: int,
    barrier: Any,
    duration: float,
    max_ops: int,
) -> tuple[list[Record], list[tuple[int, ...]]]:
    """Loop: pick PER_SET of the keys at random, in random order; take them; add one to each
    key's counter; hold until HOLD has passed; release. The records, and each one's keys."""
    import dblock

    rng = random.Random(worker * 7919 + os.getpid())
    fds = [os.open(path, os.O_RDWR) for path in counters]
    records: list[Record] = []
    sets: list[tuple[int, ...]] = []
    try:
        with dblock.connect(t.url(backend), table=table) as client:
            take = _taker(client, variant, keys)
            barrier.wait(BARRIER_WAIT)
            end = time.monotonic() + duration
            while len(records) < max_ops and time.monotonic() < end:
                chosen = rng.sample(range(len(keys)), PER_SET)
                t_req = time.monotonic()
                with take([keys[i] for i in chosen]):
                    t_acq = time.monotonic()
                    for i in chosen:
                        read_modify_write(fds[i])
                    rest = HOLD - (time.monotonic() - t_acq)
                    if rest > 0:
                        time.sleep(rest)
                    t_rel = time.monotonic()
                records.append((worker, t_req, t_acq, t_rel))
                sets.append(tuple(chosen))
    finally:
        for fd in fds:
            os.close(fd)
    return records, sets


def set_handoffs(records: list[Record], sets: list[tuple[int, ...]]) -> list[float]:
    """For each set taken after waiting: from the last release of one of its keys by the
    holder before it to its own acquisition, the time a freed set takes to pass on (a
    waiter woken by a push, or polling)."""
    previous: dict[int, Record] = {}  # key -> its latest holder so far
    gaps = []
    for rec, keys in sorted(zip(records, sets, strict=True), key=lambda x: x[0][2]):
        freed = max((previous[k][3] for k in keys if k in previous), default=None)
        if freed is not None and rec[1] < freed <= rec[2]:
            gaps.append(rec[2] - freed)
        for k in keys:
            previous[k] = rec
    return gaps


def _contended_once(
    t: Targets, backend: str, table: str, variant: str, b: Any, tmp: str
) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    keys = [f"bench-mc-{tag}-{i}" for i in range(POOL)]
    counters = [os.path.join(tmp, f"many-{tag}-{i}") for i in range(POOL)]
    for path in counters:
        new_counter(path)
    try:
        barrier = procs._CTX.Barrier(b.workers)
        args = [
            (t, backend, table, variant, keys, counters, w, barrier, b.contended, b.max_ops)
            for w in range(b.workers)
        ]
        results = procs.run_parallel(_set_worker, args, timeout=b.contended + 120)
        records = [rec for recs, _ in results for rec in recs]
        sets = [s for _, ss in results for s in ss]
        lost = overlaps = 0
        for i, path in enumerate(counters):
            held = [rec for rec, s in zip(records, sets, strict=True) if i in s]
            key_lost, key_overlaps = exclusion(held, read_counter(path))
            lost, overlaps = lost + key_lost, overlaps + key_overlaps
        stats = contended_stats(records, b.workers)
        gaps = set_handoffs(records, sets)
        return {
            **stats,
            "handoff_p50_ms": percentile(gaps, 50) * 1000,
            "sets": len(records),
            "lost_updates": lost,
            "overlaps": overlaps,
            "exclusive": lost == 0 and overlaps == 0,
        }
    finally:
        for path in counters:
            with contextlib.suppress(OSError):
                os.unlink(path)


def scenario_many_contended(backends: list[str], t: Targets, b: Any, tmp: str) -> dict[str, Any]:
    def measure(backend: str, table: str, res: dict[str, Any]) -> None:
        res.update({v: {"repeats": []} for v in VARIANTS})
        for r in range(b.contended_repeats):
            for variant in workload.rounds(list(VARIANTS), r):
                v = _contended_once(t, backend, table, variant, b, tmp)
                res[variant]["repeats"].append(v)
                flag = "" if v["exclusive"] else "  FAILING"
                log(
                    f"[many-contended] round {r + 1}/{b.contended_repeats} {backend} "
                    f"{variant}: {v['throughput']:,.0f} sets/s, p99 wait "
                    f"{v['wait_p99_ms']:.1f} ms{flag}"
                )
        for variant in VARIANTS:
            v = res[variant]
            reps = v["repeats"]
            for field in ("throughput", "wait_p50_ms", "wait_p99_ms", "fairness", "handoff_p50_ms"):
                v[field] = median([x[field] for x in reps])
            v["lost_updates"] = sum(x["lost_updates"] for x in reps)
            v["overlaps"] = sum(x["overlaps"] for x in reps)
            v["exclusive"] = all(x["exclusive"] for x in reps)

    stores = [x for x in backends if x in BACKENDS]
    return servers.each_store(stores, t, "manyc", "many-contended", measure)


def failing(res: dict[str, Any]) -> list[str]:
    """The variants that lost an update or overlapped holds of a key."""
    return [
        f"{backend}/{variant}"
        for backend, cells in res.items()
        for variant in VARIANTS
        if cells.get(variant, {}).get("repeats") and not cells[variant]["exclusive"]
    ]


# -- report -----------------------------------------------------------------------------------
def _measured(res: dict[str, Any], lines: list[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The stores measured; a row for each one whose measurement failed goes to ``lines``."""
    for backend, v in res.items():
        if "error" in v:
            lines.append(f"| {backend} | error: {v['error'][:100]} |")
        else:
            yield backend, v


def markdown_many(res: dict[str, Any], repeats: int) -> list[str]:
    lines = [
        f"### (many) lock_many of {KEYS} keys vs {KEYS} single locks in sorted order vs one "
        "single-key lock, uncontended",
        "",
        "One process per store and repeat, the sides interleaved in 0.1 s slices; pairs/s "
        f"(medians of {repeats} repeats); each ratio is taken within a repeat, the median "
        f"quoted (the repeats' in brackets). A sorted-singles pair is all {KEYS} acquired and "
        "released. The store steps are the store's own acquire_many + release_many, called "
        f"directly on {KEYS} keys and on 1. Targets: lock_many ≥ {TARGET_VS_SORTED:g}× sorted "
        f"singles; a lock_many pair ≤ {TARGET_VS_SINGLE:g}× a single-key pair's time. What "
        f"the store allows them, were the client free: the {KEYS}-key store step against "
        "sorted singles (ceiling) and against a single-key pair (floor).",
        "",
        "| backend | lock_many | sorted singles | single key "
        f"| store step, {KEYS} keys | store step, 1 key | lock_many ÷ sorted (repeats) "
        f"| ceiling: step {KEYS} ÷ sorted | lock_many time ÷ single (repeats) "
        f"| floor: step {KEYS} ÷ single | step {KEYS} ÷ step 1 "
        "| client CPU µs/pair (lock_many / sorted / single) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for backend, v in _measured(res, lines):
        rates = " | ".join(f"{v[s]['pairs_per_s']:,.0f}" for s in SIDES)
        vs_sorted = ", ".join(f"{x:.2f}" for x in v["vs_sorted_repeats"])
        vs_single = ", ".join(f"{x:.2f}" for x in v["vs_single_repeats"])
        cpu = " / ".join(f"{v[s]['cpu_us_per_pair']:,.0f}" for s in SIDES[:3])
        lines.append(
            f"| {backend} | {rates} | {v['vs_sorted']:.2f}× ({vs_sorted}) "
            f"| {v['ceiling_vs_sorted']:.2f}× | {v['vs_single']:.2f}× ({vs_single}) "
            f"| {v['floor_vs_single']:.2f}× "
            f"| {v['step_5_vs_1']:.2f}× | {cpu} |"
        )
    lines.append("")
    return lines


def markdown_contended(res: dict[str, Any], budget: dict[str, Any]) -> list[str]:
    lines = [
        f"### (many-contended) {budget['workers']} processes, random {PER_SET} of {POOL} keys, "
        f"held {HOLD * 1000:g} ms",
        "",
        f"Each set is taken with lock_many, or with per-key locks in sorted order (the variants "
        f"alternate round by round; medians of {budget['contended_repeats']} repeats of "
        f"{budget['contended']:g} s). Exclusion is checked per key (a counter file each). "
        "Hand-off: from the release that freed the last key a waiting set needed to that set's "
        "acquisition.",
        "",
        "| backend | variant | sets/s | p50 wait ms | p99 wait ms | fairness | hand-off p50 ms "
        "| exclusion |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for backend, cells in _measured(res, lines):
        for variant in VARIANTS:
            v = cells[variant]
            lines.append(
                f"| {backend} | {variant} | {v['throughput']:,.0f} | {v['wait_p50_ms']:.1f} "
                f"| {v['wait_p99_ms']:.1f} | {v['fairness']:.2f} | {v['handoff_p50_ms']:.1f} "
                f"| {workload.exclusion_status(v)} |"
            )
    lines.append("")
    return lines


def targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for backend, v in res.items():
        if "error" in v:
            continue
        out.append(
            {
                "target": f"(many) {backend}: lock_many ≥ {TARGET_VS_SORTED:g}× sorted singles",
                "measured": f"{v['vs_sorted']:.2f}× (ceiling {v['ceiling_vs_sorted']:.2f}×)",
                "met": v["vs_sorted"] >= TARGET_VS_SORTED,
            }
        )
        out.append(
            {
                "target": f"(many) {backend}: lock_many pair ≤ {TARGET_VS_SINGLE:g}× single-key "
                "pair",
                "measured": f"{v['vs_single']:.2f}× (floor {v['floor_vs_single']:.2f}×)",
                "met": v["vs_single"] <= TARGET_VS_SINGLE,
            }
        )
    return out
