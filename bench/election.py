"""Scenario ``election``: how fast leadership moves, per store, beside etcd's and kazoo's own
elections (issue 48).

- **Resign hand-over**: two forked processes campaign for one election in turn: one leads,
  the other campaigns (and waits); ``SETTLE`` later the leader resigns at t0 and the
  standby's ``campaign()`` returns at t1 (its value proclaimed). Then the roles swap. t1 - t0
  (``time.monotonic()``, one clock for every process on Linux), the first ``WARMUP`` rounds
  left out; target: median <= 100 ms.
- **Failover**: ``dblock lead NAME --ttl FAILOVER_TTL -- CMD`` in several candidate processes,
  CMD a shell that appends its start time (``date +%s.%N``) to a file, then sleeps. At t0
  (``time.time()``: the same wall clock as ``date``) the leading ``dblock lead`` and its CMD
  are SIGKILLed (a host dying), ``KILL_PHASE`` into a renewal period of its lease (dblock
  renews every ttl/3), so that every repeat's lease has about ttl - KILL_PHASE left; t1 is the
  start of the next leader's CMD. Expected: about the ttl plus the standby's wait
  granularity, less KILL_PHASE.
- **Peers** (on etcd and ZooKeeper): ``etcdctl elect`` and kazoo's ``Election`` measured the
  same way (bench/_election_peers.py). Their failovers wait out a session of 60 s (etcdctl's
  fixed default) and 10 s (kazoo's default), so they run in a process of their own beside
  the rest of the scenario, which their idle waiting does not disturb.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import procs, servers
from bench._election_peers import (
    ETCDCTL_SESSION_TTL,
    KAZOO_SESSION_TIMEOUT,
    die_with_parent,
    etcdctl_available,
    etcdctl_resign,
    kazoo_side,
    new_lines,
    ping_pong,
    stop_process,
    summary,
)
from bench.contenders import Targets
from dblock.bench import median, percentile

#: the stores measured, in this order; the quorum when its members' servers answer
STORES = ("sqlite", "postgresql", "mysql", "redis", "etcd", "zookeeper", "quorum")
#: the quorum's stores: three independent servers
QUORUM_MEMBERS = ("postgresql", "mysql", "redis")
#: how long the leader waits, once the standby has started campaigning, before it resigns
SETTLE = 0.25
#: resign rounds left out: connections warming, first waits set up
WARMUP = 2
#: the failover's --ttl (``dblock lead`` accepts 0.75 s and more with its default kill grace)
FAILOVER_TTL = 3.0
#: how far into a renewal period of its lease a leader is killed
KILL_PHASE = 0.25
#: the term's ttl in the resign hand-over (the default: no renewal is due while it runs)
RESIGN_TTL = 15.0
#: issue 48: resign() hands over at once
TARGET_RESIGN_MS = 100.0
#: seconds: any one wait of the scenario (a failure, not a figure, past it)
BOUND = 60.0
PEERS_MODULE = "bench._election_peers"
ROOT = Path(__file__).resolve().parent.parent


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def store_url(t: Targets, store: str) -> str:
    if store == "quorum":
        return " ".join(t.url(m) for m in QUORUM_MEMBERS)
    return t.url(store)


def stores_of(live: list[str]) -> list[str]:
    """The stores this run measures: the live ones, and the quorum if its members are."""
    have = set(live)
    if all(m in have for m in QUORUM_MEMBERS):
        have.add("quorum")
    return [s for s in STORES if s in have]


# -- resign hand-over ---------------------------------------------------------------------------
def _dblock_side(
    url: str, table: str, name: str, i: int, rounds: int, events: tuple[Any, Any, Any]
) -> dict[str, dict[int, float]]:
    """One of the two dblock candidates (a forked process)."""
    import dblock

    with dblock.connect(url, table=table) as client:
        election = client.election(name, ttl=RESIGN_TTL)

        def lead_once(body: Callable[[], None]) -> None:
            with election.campaign(value=f"side-{i}", timeout=BOUND):
                body()

        return ping_pong(i, rounds, SETTLE, lead_once, events)


def hand_overs(results: list[dict[str, dict[int, float]]], rounds: int) -> list[float]:
    """Each measured round's t1 - t0 in ms: round r's resigner is side r % 2, its taker the
    other side."""
    out = []
    for r in range(WARMUP, rounds):
        t0 = results[r % 2]["t0"][r]
        t1 = results[1 - r % 2]["t1"][r]
        out.append((t1 - t0) * 1000)
    return out


def resign_pair(side: Callable[..., Any], args: tuple[Any, ...], rounds: int) -> list[float]:
    """Run ``side(*args, i, rounds, events)`` in two forked processes; the hand-overs."""
    events = (procs._CTX.Event(), procs._CTX.Event(), procs._CTX.Event())
    results = procs.run_parallel(
        side,
        [(*args, i, rounds, events) for i in (0, 1)],
        timeout=BOUND + rounds * (SETTLE + 1),
    )
    return hand_overs(results, rounds)


def summary_ms(samples: list[float]) -> dict[str, Any]:
    return {
        "median_ms": median(samples),
        "p90_ms": percentile(samples, 90),
        "max_ms": max(samples),
        "samples_ms": samples,
    }


# -- failover: dblock lead ----------------------------------------------------------------------
CMD = 'echo "$1 $$ $(date +%s.%N)" >> "$2"; exec sleep 600'


class _Candidate:
    """A ``dblock lead`` process, in a session of its own (so its group can be killed), dying
    with the bench (PR_SET_PDEATHSIG); its CMD dies with it (dblock sets the same)."""

    def __init__(
        self, idx: int, url: str, table: str, name: str, starts: Path, tmp: Path, ttl: float
    ) -> None:
        self.idx = idx
        self.stderr_path = tmp / f"candidate-{idx}.stderr"
        with self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "dblock",
                    "--debug",
                    "lead",
                    "--url",
                    url,
                    "--table",
                    table,
                    "--ttl",
                    f"{ttl:g}",
                    name,
                    "--",
                    "sh",
                    "-c",
                    CMD,
                    "sh",
                    str(idx),
                    str(starts),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
                preexec_fn=die_with_parent,  # noqa: PLW1509 - no locks taken
            )

    def campaigning(self) -> bool:
        with contextlib.suppress(OSError):
            return b"campaigning for" in self.stderr_path.read_bytes()
        return False

    def kill(self, cmd_pid: int | None) -> None:
        """SIGKILL ``dblock lead`` and CMD's group together: the host is gone."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        if cmd_pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(cmd_pid, signal.SIGKILL)

    def close(self, cmd_pid: int | None = None) -> None:
        self.kill(cmd_pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)

    def why_not(self) -> str:
        """The end of its stderr: why it did not get as far as expected."""
        with contextlib.suppress(OSError):
            lines = self.stderr_path.read_text(errors="replace").strip().splitlines()
            useful = [x for x in lines if "DEBUG" not in x] or lines
            if useful:
                return useful[-1][:200]
        return f"exit status {self.proc.poll()}"


def _wait_for(what: str, done: Callable[[], bool], bound: float = BOUND) -> None:
    deadline = time.monotonic() + bound
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {bound:g} s")
        time.sleep(0.005)


def kill_at(started: float, now: float, ttl: float) -> float:
    """When to kill a leader whose CMD started at ``started``: ``KILL_PHASE`` into a renewal
    period (dblock renews every ttl/3 from the grant, which CMD's start follows closely), the
    first such moment from ``now``. Every repeat's lease then has about ttl - KILL_PHASE left,
    whatever the standbys' start-up took."""
    period = ttl / 3
    k = max(0, math.ceil((now - started - KILL_PHASE) / period))
    return started + KILL_PHASE + k * period


def failover(url: str, table: str, repeats: int, tmp: Path, ttl: float) -> list[float]:
    """``repeats`` failovers of ``dblock lead`` (seconds): ``repeats + 1`` candidates, the
    first leading, the others queued; each repeat kills the leader and times the next
    leader's CMD start."""
    run_dir = tmp / f"failover-{uuid.uuid4().hex[:8]}"
    run_dir.mkdir()
    starts = run_dir / "starts"
    starts.touch()
    name = f"bench-failover-{uuid.uuid4().hex[:12]}"
    seen: list[tuple[int, int, float]] = []  # (candidate, CMD pid, start time)
    offset = 0

    def read() -> None:
        nonlocal offset
        offset, lines = new_lines(starts, offset)
        for line in lines:
            idx, pid, when = line.split()
            seen.append((int(idx), int(pid), float(when)))

    cands: list[_Candidate] = []
    try:
        cands.append(_Candidate(0, url, table, name, starts, run_dir, ttl))

        def first_leads() -> bool:
            read()
            if cands[0].proc.poll() is not None:
                raise RuntimeError(f"dblock lead exited: {cands[0].why_not()}")
            return bool(seen)

        _wait_for("the first candidate's CMD", first_leads)
        for k in range(1, repeats + 1):
            cands.append(_Candidate(k, url, table, name, starts, run_dir, ttl))
        for c in cands[1:]:
            _wait_for(f"candidate {c.idx} campaigning", c.campaigning)
        time.sleep(SETTLE * 2)  # queued
        out = []
        for _ in range(repeats):
            leader, pid, started = seen[-1]
            time.sleep(max(0.0, kill_at(started, time.time(), ttl) - time.time()))
            t0 = time.time()
            cands[leader].kill(pid)
            before = len(seen)

            def next_leads(before: int = before) -> bool:
                read()
                return len(seen) > before

            _wait_for("the next leader's CMD", next_leads, ttl * 3 + 30)
            if seen[-1][0] == leader:
                raise RuntimeError("the killed candidate's CMD started again")
            out.append(seen[-1][2] - t0)
        return out
    finally:
        pids = {idx: pid for idx, pid, _ in seen}
        for c in cands:
            c.close(pids.get(c.idx))


# -- per store ------------------------------------------------------------------------------------
def _measure_store(
    t: Targets, store: str, table: str, res: dict[str, Any], b: Any, tmp: Path
) -> None:
    url = store_url(t, store)
    rounds = WARMUP + resign_rounds(b)
    name = f"bench-election-{uuid.uuid4().hex[:12]}"
    samples = resign_pair(_dblock_side, (url, table, name), rounds)
    res["resign"] = summary_ms(samples)
    log(
        f"[election] {store}: resign hand-over median {res['resign']['median_ms']:.1f} ms, "
        f"p90 {res['resign']['p90_ms']:.1f} ms ({len(samples)} rounds)"
    )
    fo = failover(url, table, b.contended_repeats, tmp, FAILOVER_TTL)
    res["failover"] = summary(fo, FAILOVER_TTL)
    log(
        f"[election] {store}: failover (--ttl {FAILOVER_TTL:g}) median "
        f"{res['failover']['median_s']:.2f} s, max {res['failover']['max_s']:.2f} s"
    )


def resign_rounds(b: Any) -> int:
    """Measured resign rounds: 4 per repeat (20 with the default 5)."""
    return max(4, 4 * int(b.repeats))


def _kazoo_resign(t: Targets, rounds: int) -> list[float]:
    from bench.contenders import Kazoo

    k = Kazoo(t.zookeeper)
    chroot = k.chroot
    k.close()
    path = f"{chroot}/kazoo_bench/election-{uuid.uuid4().hex[:12]}"
    return resign_pair(kazoo_side, (t.zookeeper, path, SETTLE, BOUND), rounds)


def _peers_background(t: Targets, live: list[str], b: Any, tmp: Path) -> Any:
    """Start the peers' failovers in a process of their own; None if there is nothing to run."""
    args = []
    if "etcd" in live and etcdctl_available():
        args += ["--etcd", etcd_endpoint(t), "--etcdctl-repeats", "1"]
    if "zookeeper" in live:
        kazoo_repeats = max(1, min(2, int(b.contended_repeats)))
        args += ["--zookeeper", t.zookeeper, "--kazoo-repeats", str(kazoo_repeats)]
    if not args:
        return None
    return subprocess.Popen(
        [sys.executable, "-m", PEERS_MODULE, "failover", "--tmp", str(tmp), *args],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        preexec_fn=die_with_parent,  # noqa: PLW1509 - no locks taken
    )


def _peers_result(proc: Any) -> dict[str, Any]:
    import json

    try:
        out, _ = proc.communicate(timeout=ETCDCTL_SESSION_TTL * 2 + KAZOO_SESSION_TIMEOUT * 6)
    except subprocess.TimeoutExpired:
        stop_process(proc)
        return {"error": "the peers' failovers did not finish in time"}
    if proc.returncode != 0:
        return {"error": f"the peers' failovers exited {proc.returncode}"}
    result: dict[str, Any] = json.loads(out)
    return result


def etcd_endpoint(t: Targets) -> str:
    from urllib.parse import urlsplit

    return urlsplit(t.etcd).netloc.split(",")[0]


def scenario_election(live: list[str], t: Targets, b: Any, tmp: str, peers: bool) -> dict[str, Any]:
    """Every store's resign hand-over and failover, and the peers' beside etcd and
    ZooKeeper."""
    work = Path(tmp) / f"election-{uuid.uuid4().hex[:8]}"
    work.mkdir(parents=True)
    background = _peers_background(t, live, b, work) if peers else None
    out: dict[str, Any] = {"stores": {}, "peers": {}}
    try:
        for store in stores_of(live):
            res: dict[str, Any] = {}
            out["stores"][store] = res
            table = f"{t.table}_election"
            try:
                _measure_store(t, store, table, res, b, work)
            except Exception as exc:
                res["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
                log(f"[election] {store}: {res['error']}")
            finally:
                for member in QUORUM_MEMBERS if store == "quorum" else (store,):
                    servers.drop_dblock_tables(t, member, table)
        if peers:
            rounds = WARMUP + resign_rounds(b)
            if "etcd" in live and etcdctl_available():
                out["peers"]["etcdctl"] = _peer(
                    "etcdctl", lambda: etcdctl_resign(etcd_endpoint(t), rounds, SETTLE, WARMUP)
                )
            if "zookeeper" in live:
                out["peers"]["kazoo"] = _peer("kazoo", lambda: _kazoo_resign(t, rounds))
        if background is not None:
            for peer, fo in _peers_result(background).items():
                if peer == "error":
                    for v in out["peers"].values():
                        v.setdefault("failover", {"error": fo})
                    continue
                out["peers"].setdefault(peer, {})["failover"] = fo
    finally:
        if background is not None:
            stop_process(background)
        servers.drop_dblock_tables(t, "zookeeper", f"{t.table}_election")  # kazoo's nodes too
        shutil.rmtree(work, ignore_errors=True)
    return out


def _peer(peer: str, resign: Callable[[], list[float]]) -> dict[str, Any]:
    try:
        samples = resign()
    except Exception as exc:
        log(f"[election] {peer}: {type(exc).__name__}: {exc}".splitlines()[0])
        return {"resign": {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}}
    res = summary_ms(samples)
    log(f"[election] {peer}: resign hand-over median {res['median_ms']:.1f} ms")
    return {"resign": res}


# -- report -------------------------------------------------------------------------------------
def _ms(v: dict[str, Any]) -> tuple[str, str]:
    if "error" in v:
        return f"error: {v['error'][:80]}", "–"
    return f"{v['median_ms']:.1f}", f"{v['p90_ms']:.1f}"


def _s(v: dict[str, Any] | None) -> tuple[str, str, str, str]:
    if not v:
        return "–", "–", "–", "–"
    if "error" in v:
        return f"error: {v['error'][:80]}", "–", "–", "–"
    each = ", ".join(f"{x:.2f}" for x in v["samples_s"])
    return (
        f"{v['median_s']:.2f} ({each})",
        f"{v['max_s']:.2f}",
        f"{v['ttl_s']:g}",
        f"{v['minus_ttl_s']:+.2f}",
    )


PEER_ROWS = {
    "etcdctl": ("etcd", f"etcdctl elect (session ttl {ETCDCTL_SESSION_TTL:g} s, its default)"),
    "kazoo": (
        "zookeeper",
        f"kazoo Election (session timeout {KAZOO_SESSION_TIMEOUT:g} s, its default)",
    ),
}


def _store_row(store: str, v: dict[str, Any]) -> str:
    label = f"quorum ({', '.join(QUORUM_MEMBERS)})" if store == "quorum" else store
    if "error" in v and "resign" not in v:
        return f"| {label} | dblock | error: {v['error'][:100]} |"
    med, p90 = _ms(v["resign"])
    met = "yes" if v["resign"]["median_ms"] <= TARGET_RESIGN_MS else "**no**"
    fo = v.get("failover") or ({"error": v["error"]} if "error" in v else None)
    return (
        f"| {label} | dblock | {med} | {p90} | ≤ {TARGET_RESIGN_MS:g} ms: {met} | "
        + " | ".join(_s(fo))
        + " |"
    )


def _peer_row(peer: str, v: dict[str, Any]) -> str:
    store, label = PEER_ROWS[peer]
    med, p90 = _ms(v["resign"]) if "resign" in v else ("–", "–")
    return f"| {store} | {label} | {med} | {p90} | – | " + " | ".join(_s(v.get("failover"))) + " |"


def markdown(res: dict[str, Any], budget: dict[str, Any]) -> list[str]:
    rounds = max(4, 4 * int(budget["repeats"]))
    lines = [
        "### (election) resign hand-over and failover, per store",
        "",
        f"Resign hand-over: two processes campaign in turn; {SETTLE * 1000:g} ms after the "
        "standby started campaigning the leader resigns (t0); t1 = the standby's campaign() "
        f"returns, its value proclaimed; {rounds} rounds after {WARMUP} of warm-up, median "
        f"and p90 of t1 - t0. Target (issue 48): median ≤ {TARGET_RESIGN_MS:g} ms. "
        f"Failover: `dblock lead NAME --ttl {FAILOVER_TTL:g} -- CMD` in "
        f"{budget['contended_repeats'] + 1} processes; the leader's dblock lead and CMD are "
        "SIGKILLed (t0), t1 = the next leader's CMD start (its `date +%s.%N`); "
        f"{budget['contended_repeats']} repeats, median and max. Each leader is killed "
        f"{KILL_PHASE:g} s into a renewal period (dblock renews every ttl/3; CMD starts just "
        f"after the grant), so its lease has about ttl − {KILL_PHASE:g} s left: failover − ttl "
        f"is the standby's wait granularity less those {KILL_PHASE:g} s. "
        "Peers: etcdctl elect (resign = SIGINT; failover = SIGKILL about 1 s after its "
        "session began, its lease left to expire) "
        "and kazoo's Election (resign = its func returns; failover = SIGKILL of its process, "
        "its session left to expire), their failovers run beside the rest.",
        "",
        "| store | election | resign median ms | resign p90 ms | target "
        "| failover median s (repeats) | failover max s | ttl s | failover − ttl s |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    peers = res.get("peers", {})
    for store, v in res.get("stores", {}).items():
        lines.append(_store_row(store, v))
        lines += [_peer_row(peer, peers[peer]) for peer in peers if PEER_ROWS[peer][0] == store]
    measured = set(res.get("stores", {}))
    lines += [_peer_row(peer, v) for peer, v in peers.items() if PEER_ROWS[peer][0] not in measured]
    lines.append("")
    return lines


def targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for store, v in res.get("stores", {}).items():
        if "resign" not in v:
            continue
        med = v["resign"]["median_ms"]
        out.append(
            {
                "target": f"(election) {store}: resign hand-over median ≤ {TARGET_RESIGN_MS:g} ms",
                "measured": f"{med:.1f} ms (p90 {v['resign']['p90_ms']:.1f} ms)",
                "met": med <= TARGET_RESIGN_MS,
            }
        )
    return out
