"""``lock_many`` across real processes, on every store with ManyKeys, sync and async: overlapping
sets given in random orders never deadlock and never overlap on a key; no observer ever sees a
holder with part of its set; a holder killed with SIGKILL frees every key when its lease ends;
a cancelled async waiter leaves nothing behind."""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

import dblock
from tests._worker import start as start_worker
from tests.providers import Provider

pytestmark = [pytest.mark.slow, pytest.mark.needs("ManyKeys", "processes")]


def _finish(procs: list[subprocess.Popen[str]], timeout: float) -> None:
    try:
        for p in procs:
            p.communicate(timeout=timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert [p.returncode for p in procs] == [0] * len(procs)


def _snapshot(client: dblock.Client, prefix: str) -> dict[str, tuple[str, int]] | None:
    """Who holds each key of ``prefix`` at one moment, or None if two reads disagree. Each
    read goes through the keys in one order; finding every key unchanged (owner and token)
    means each hold seen was there from its first read to its second, and one holder's keys
    share one interval, so no key of a holder seen can have come and gone unseen between."""
    passes = [
        {i.key: (i.owner, i.token) for i in client.list(prefix)},
        {i.key: (i.owner, i.token) for i in client.list(prefix)},
    ]
    return passes[0] if passes[0] == passes[1] else None


def test_overlapping_sets_in_random_orders_never_deadlock_overlap_or_show_a_part(
    provider: Provider, db_url: str, table: str, tmp_path: Path
) -> None:
    """Three processes each take a random 3 of 6 keys, given in random order, 6 times, each
    hold 0.15 s (long enough for an observer on a loaded machine to read the keys twice within
    it). The referee: each key's holds never overlap in time and its tokens rise with time;
    every process finished (no deadlock). An observer meanwhile takes consistent snapshots of
    the six keys: an owner seen there holds its whole set or none of it."""
    provider.connect(table=table).close()
    prefix = "lmp-" + uuid.uuid4().hex[:8] + "-"
    keys = [f"{prefix}{i}" for i in range(6)]
    logs = [tmp_path / f"log{i}" for i in range(3)]
    procs = [
        start_worker("many", db_url, table, prefix, "6", "3", "6", "0.15", str(log)) for log in logs
    ]
    snapshots: list[dict[str, tuple[str, int]]] = []
    stop = threading.Event()

    def observe() -> None:
        with provider.connect(table=table) as client:
            while not stop.is_set():
                view = _snapshot(client, prefix)
                if view:
                    snapshots.append(view)
                time.sleep(0.005)  # leave the two cores to the workers

    observer = threading.Thread(target=observe)
    observer.start()
    try:
        _finish(procs, 240)
    finally:
        stop.set()
        observer.join(60)
    sets: dict[str, set[str]] = {}
    holds: dict[str, list[tuple[int, int, int]]] = {k: [] for k in keys}
    for log in logs:
        lines = [line.split() for line in log.read_text().splitlines()]
        enters = [line for line in lines if line[0] == "enter"]
        exits = {line[2]: int(line[1]) for line in lines if line[0] == "exit"}
        assert len(enters) == 6
        for _, at, owner, names, tokens in enters:
            sets[owner] = set(names.split(","))
            for key, token in zip(names.split(","), tokens.split(","), strict=True):
                holds[key].append((int(at), exits[owner], int(token)))
    for key, spans in holds.items():
        spans.sort()
        for (_, end, token), (start, _, next_token) in itertools.pairwise(spans):
            assert end <= start, f"two holds of {key} overlapped"
            assert token < next_token, f"tokens of {key} did not rise with time"
    seen = 0
    for view in snapshots:
        owners: dict[str, set[str]] = {}
        for key, (owner, _) in view.items():
            owners.setdefault(owner, set()).add(key)
        for owner, held in owners.items():
            if owner in sets:  # a holder of this run (its set is known)
                assert held == sets[owner], f"{owner} seen holding {held} of {sets[owner]}"
                seen += 1
    # On a loaded machine the observer may take no consistent view with a hold in it (the
    # stores' own many-key tests make sure of seeing some); the views it took are checked.
    print(f"consistent views with holds: {seen} of {len(snapshots)}")


@pytest.mark.needs("blocking")  # the holder's client dies with it: the mode changes nothing
def test_a_holder_killed_frees_every_key_at_its_lease_end(
    provider: Provider, db_url: str, table: str
) -> None:
    provider.connect(table=table).close()
    keys = ["lmk-" + uuid.uuid4().hex[:8] + f"-{i}" for i in range(3)]
    holder = start_worker("many_hold", db_url, table, ",".join(keys), "2", stdin=subprocess.PIPE)
    try:
        assert holder.stdout is not None
        line = holder.stdout.readline()
        assert line, "the holder did not report its hold"
        held = json.loads(line)["tokens"]
        holder.kill()
        holder.communicate(timeout=30)
        with provider.connect(table=table) as client:
            assert all(client.info(k) is not None for k in keys), "held until the lease ends"
            started = time.monotonic()
            with client.lock_many(keys, ttl=30, timeout=30) as many:
                waited = time.monotonic() - started
                assert many.tokens is not None
                assert all(many.tokens[k] > held[k] for k in keys)
        assert waited < 25
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.communicate()


@pytest.mark.needs("blocking", "asyncio")
def test_a_cancelled_async_waiter_leaves_no_key_held_and_no_queue_entry(
    provider: Provider, table: str
) -> None:
    """An async lock_many waits behind a blocker and is cancelled at several moments; then no
    key is held, and a newcomer takes a free key of the set at once (a queue entry left
    behind would make it wait)."""
    keys = ["lmc-" + uuid.uuid4().hex[:8] + f"-{i}" for i in range(3)]

    async def scenario() -> None:
        client = await provider.connect_async(table=table)
        try:
            for delay in (0.0, 0.01, 0.05, 0.2):
                task = asyncio.ensure_future(client.lock_many(keys, ttl=30).acquire(timeout=30))
                await asyncio.sleep(delay)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
        finally:
            await client.close()

    with provider.connect(table=table) as outside:
        blocker = outside.lock(keys[1], ttl=30)
        assert blocker.acquire(timeout=5)
        asyncio.run(scenario())
        assert outside.info(keys[0]) is None and outside.info(keys[2]) is None
        for key in (keys[0], keys[2]):
            newcomer = outside.lock(key, ttl=30)
            assert newcomer.acquire(blocking=False), f"{key}: left held or queued"
            newcomer.release()
        blocker.release()
