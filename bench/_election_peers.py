"""The election scenario's peers, etcdctl's ``elect`` and kazoo's ``Election``, and the
resign ping-pong it runs for dblock too (bench/election.py).

Run as a module, it measures the peers' failovers, which wait out a session each (etcdctl:
60 s, kazoo: 10 s), so that the scenario can run them beside its other measurements:

    python -m bench._election_peers failover --tmp DIR [--etcd HOST:PORT --etcdctl-repeats N]
        [--zookeeper URL --kazoo-repeats N]

and prints their figures as one JSON object. Every process it starts dies with it
(PR_SET_PDEATHSIG) and is killed on its way out.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: etcdctl 3.4's ``elect`` has no --ttl: its session's lease is concurrency's default
ETCDCTL_SESSION_TTL = 60.0
#: kazoo's default session timeout (KazooClient(timeout=10.0))
KAZOO_SESSION_TIMEOUT = 10.0
ETCDCTL = "etcdctl"
BOUND = 60.0
SETTLE = 0.25


def die_with_parent() -> None:
    """In a child before exec: the kernel SIGKILLs it when the bench dies."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


def stop_process(proc: Any) -> None:
    """SIGKILL a subprocess (and its session's group, if it leads one) and reap it."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


def new_lines(path: Path, offset: int) -> tuple[int, list[str]]:
    """The complete lines appended to ``path`` since ``offset``, and the new offset."""
    with path.open("rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n") + 1
    return offset + end, data[:end].decode().splitlines()


# -- the resign ping-pong -------------------------------------------------------------------------
def ping_pong(
    i: int,
    rounds: int,
    settle: float,
    lead_once: Callable[[Callable[[], None]], None],
    events: tuple[Any, Any, Any],
) -> dict[str, dict[int, float]]:
    """Side ``i`` (0 or 1) of two candidates that lead in turn. Side 0 leads first; in round
    r side r % 2 resigns (t0) ``settle`` after the other side started campaigning, and the
    other side's term starts (t1). ``lead_once(body)`` campaigns, runs ``body`` while leading,
    then resigns at once. Each side's t0 and t1 by round."""
    started, *campaigning = events
    out: dict[str, dict[int, float]] = {"t0": {}, "t1": {}}

    def body(take: int | None) -> Callable[[], None]:
        def leading() -> None:
            if take is None:
                started.set()
            else:
                out["t1"][take] = time.monotonic()
            resign_round = 0 if take is None else take + 1
            if resign_round >= rounds:
                return
            if not campaigning[1 - i].wait(BOUND):
                raise RuntimeError("the other side never campaigned")
            campaigning[1 - i].clear()
            time.sleep(settle)
            out["t0"][resign_round] = time.monotonic()

        return leading

    terms: list[int | None] = [None] if i == 0 else []
    terms += [r for r in range(rounds) if r % 2 != i]
    if i == 1 and not started.wait(BOUND):
        raise RuntimeError("side 0 never led")
    for take in terms:
        if take is not None:
            campaigning[i].set()
        lead_once(body(take))
    return out


def kazoo_side(
    url: str, path: str, settle: float, bound: float, i: int, rounds: int, events: Any
) -> dict[str, dict[int, float]]:
    """One of two kazoo ``Election`` candidates (a forked process): resigning is the leader's
    func returning."""
    from bench.contenders import Kazoo

    k = Kazoo(url)
    try:
        election = k.zk.Election(path, f"side-{i}")
        return ping_pong(i, rounds, settle, election.run, events)
    finally:
        k.close()


# -- etcdctl ----------------------------------------------------------------------------------
def etcdctl_available() -> bool:
    return shutil.which(ETCDCTL) is not None


class Etcdctl:
    """``etcdctl elect NAME PROPOSAL``: it prints the leader's key and its proposal once it
    leads, resigns on SIGINT."""

    def __init__(self, endpoint: str, name: str, proposal: str) -> None:
        self.proposal = proposal
        self.proc = subprocess.Popen(
            [ETCDCTL, "--endpoints", endpoint, "elect", name, proposal],
            env={**os.environ, "ETCDCTL_API": "3"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=die_with_parent,  # noqa: PLW1509 - no locks taken
        )
        self._buffer = b""

    def elected(self, wait: float) -> float | None:
        """The ``time.monotonic()`` at which it printed its proposal, within ``wait`` s."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + wait
        while True:
            if self.proposal.encode() in self._buffer.splitlines():
                return time.monotonic()
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 4096)
                if not chunk:
                    raise RuntimeError(f"etcdctl exited: {self.why_not()}")
                self._buffer += chunk
                if self.proposal.encode() in self._buffer.splitlines():
                    return time.monotonic()

    def why_not(self) -> str:
        stop_process(self.proc)
        assert self.proc.stderr is not None
        return self.proc.stderr.read().decode(errors="replace").strip()[-200:]

    def close(self) -> None:
        stop_process(self.proc)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


def etcdctl_resign(endpoint: str, rounds: int, settle: float, warmup: int) -> list[float]:
    """Resign hand-overs of ``etcdctl elect`` (ms): a new standby each round, the leader
    SIGINTed ``settle`` after it started."""
    name = f"bench-etcdctl-{uuid.uuid4().hex[:12]}"
    started: list[Etcdctl] = []
    try:
        leader = Etcdctl(endpoint, name, "p0")
        started.append(leader)
        if leader.elected(BOUND) is None:
            raise RuntimeError("the first etcdctl never led")
        out = []
        for r in range(rounds):
            standby = Etcdctl(endpoint, name, f"p{r + 1}")
            started.append(standby)
            time.sleep(settle)
            t0 = time.monotonic()
            leader.proc.send_signal(signal.SIGINT)
            t1 = standby.elected(BOUND)
            if t1 is None:
                raise RuntimeError(f"etcdctl p{r + 1} never led")
            if r >= warmup:
                out.append((t1 - t0) * 1000)
            leader.proc.wait(5)
            leader.close()
            leader = standby
        return out
    finally:
        for e in started:
            e.close()


def etcdctl_failover(endpoint: str, repeats: int) -> list[float]:
    """``repeats`` failovers of ``etcdctl elect`` (s): ``repeats + 1`` candidates, each
    repeat SIGKILLs the leader and times the next one's print."""
    name = f"bench-etcdctl-{uuid.uuid4().hex[:12]}"
    cands = [Etcdctl(endpoint, name, "p0")]
    try:
        if cands[0].elected(BOUND) is None:
            raise RuntimeError("the first etcdctl never led")
        cands += [Etcdctl(endpoint, name, f"p{k}") for k in range(1, repeats + 1)]
        time.sleep(SETTLE * 4)
        out = []
        leader = cands[0]
        for k in range(repeats):
            t0 = time.monotonic()
            leader.proc.kill()
            nxt = cands[k + 1]
            t1 = nxt.elected(ETCDCTL_SESSION_TTL * 2)
            if t1 is None:
                raise RuntimeError(f"etcdctl p{k + 1} never led")
            out.append(t1 - t0)
            leader = nxt
        return out
    finally:
        for e in cands:
            e.close()


# -- kazoo failover -------------------------------------------------------------------------------
def kazoo_candidate(url: str, path: str, idx: int, starts: str) -> None:
    """A kazoo ``Election`` candidate (its own process): once it leads, it appends its index
    and the time (``time.time()``) to ``starts``, then sleeps until killed."""
    from urllib.parse import urlsplit

    from kazoo.client import KazooClient

    die_with_parent()
    zk = KazooClient(hosts=urlsplit(url).netloc, timeout=KAZOO_SESSION_TIMEOUT)
    zk.start(timeout=10)

    def lead() -> None:
        with open(starts, "a") as f:
            f.write(f"{idx} {os.getpid()} {time.time()}\n")
        time.sleep(600)

    try:
        zk.Election(path, f"candidate-{idx}").run(lead)
    finally:
        zk.stop()


def kazoo_failover(url: str, repeats: int, tmp: Path) -> list[float]:
    """``repeats`` failovers of kazoo's ``Election`` (s): ``repeats + 1`` candidate
    processes; each repeat SIGKILLs the leader's and times the next one's func start."""
    from urllib.parse import urlsplit

    chroot = urlsplit(url).path.rstrip("/")
    path = f"{chroot}/kazoo_bench/failover-{uuid.uuid4().hex[:12]}"
    starts = tmp / f"kazoo-{uuid.uuid4().hex[:8]}"
    starts.touch()
    seen: list[tuple[int, float]] = []
    offset = 0

    def spawn(idx: int) -> Any:
        code = (
            "import sys; from bench._election_peers import kazoo_candidate as c; c(*sys.argv[1:])"
        )
        return subprocess.Popen(
            [sys.executable, "-c", code, url, path, str(idx), str(starts)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            preexec_fn=die_with_parent,  # noqa: PLW1509 - no locks taken
        )

    def wait_new(before: int, bound: float) -> None:
        nonlocal offset
        deadline = time.monotonic() + bound
        while len(seen) <= before:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no kazoo candidate led within {bound:g} s")
            time.sleep(0.005)
            offset, lines = new_lines(starts, offset)
            seen.extend((int(x.split()[0]), float(x.split()[2])) for x in lines)

    cands = [spawn(0)]
    try:
        wait_new(0, BOUND)
        cands += [spawn(k) for k in range(1, repeats + 1)]
        time.sleep(3.0)  # interpreters started, sessions opened, nodes queued
        out = []
        for _ in range(repeats):
            leader = seen[-1][0]
            t0 = time.time()
            cands[leader].kill()
            wait_new(len(seen), KAZOO_SESSION_TIMEOUT * 4)
            out.append(seen[-1][1] - t0)
        return out
    finally:
        for p in cands:
            stop_process(p)


# -- as a module ----------------------------------------------------------------------------------
def summary(samples: list[float], ttl: float) -> dict[str, Any]:
    from dblock.bench import median

    return {
        "ttl_s": ttl,
        "median_s": median(samples),
        "max_s": max(samples),
        "minus_ttl_s": median(samples) - ttl,
        "samples_s": samples,
    }


def failovers(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    tmp = Path(args.tmp)
    for peer, run, ttl in (
        (
            "etcdctl",
            args.etcd and (lambda: etcdctl_failover(args.etcd, args.etcdctl_repeats)),
            ETCDCTL_SESSION_TTL,
        ),
        (
            "kazoo",
            args.zookeeper and (lambda: kazoo_failover(args.zookeeper, args.kazoo_repeats, tmp)),
            KAZOO_SESSION_TIMEOUT,
        ),
    ):
        if not run:
            continue
        try:
            out[peer] = summary(run(), ttl)
            print(
                f"[election] {peer}: failover median {out[peer]['median_s']:.2f} s "
                f"(session {ttl:g} s)",
                file=sys.stderr,
                flush=True,
            )
        except Exception as exc:
            out[peer] = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
            print(f"[election] {peer} failover: {out[peer]['error']}", file=sys.stderr, flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=f"python -m {__spec__.name if __spec__ else __name__}")
    p.add_argument("what", choices=["failover"])
    p.add_argument("--tmp", required=True)
    p.add_argument("--etcd", help="HOST:PORT of etcd")
    p.add_argument("--etcdctl-repeats", type=int, default=1)
    p.add_argument("--zookeeper", help="zookeeper://HOST:PORT/CHROOT")
    p.add_argument("--kazoo-repeats", type=int, default=2)
    args = p.parse_args(argv)
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the bench decides when this ends
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # finally: children killed
    print(json.dumps(failovers(args)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
