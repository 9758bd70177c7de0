"""Worker processes for the multi-process tests: ``python -m tests._worker CMD ...``."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dblock
from tests import _pg_crowd

_pg_crowd.apply([*sys.argv, os.environ.get("DBLOCK_URL", "")])
if os.environ.get("DBLOCK_TEST_CLIENT") == "async":  # the contract suite's [async] runs
    from tests._async_facade import connect
else:
    connect = dblock.connect


ROOT = Path(__file__).resolve().parents[1]


def start(*args: str, stdin: int | None = None, stderr: int | None = None) -> subprocess.Popen[str]:
    """``python -m tests._worker *args`` from the repository's root, its stdout piped (text)."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests._worker", *args],
        cwd=ROOT,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
    )


def freeze(pid: int, seconds: float = 15.0) -> None:
    """SIGSTOP ``pid`` and return once every thread of it has stopped. ``kill`` returns before
    that: on a loaded machine the thread that must start the stop can wait for a CPU while
    another (an asyncio client's event loop) runs on, and acts on a message sent after the
    ``kill`` (Linux: /proc)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + seconds
    tasks = Path(f"/proc/{pid}/task")
    while True:
        states = []
        for task in tasks.iterdir():
            with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
                states.append(task.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0])
        if states and all(state in ("T", "t") for state in states):
            return
        assert time.monotonic() < deadline, f"process {pid} did not stop: {states}"
        time.sleep(0.005)


def freeze_between_operations(client: Any, key: str, pid: int) -> None:
    """``freeze`` ``pid`` at a moment it is in none of its operations, as ``client`` (of the
    same store) sees it: where the store is one file, a process stopped inside a write
    transaction (a waiter's place refreshed, a term renewed) keeps the file's write lock, and
    every other process's operations wait for it (docs/stores/sqlite.md; ci on 2026-12-01
    stopped a waiter in its place's refresh, and the test's release failed after the busy
    timeout). Taking another key than ``key`` tells: only a stopped write holds that up."""
    for _ in range(50):
        freeze(pid)
        probe = client.lock(f"{key}:probe", ttl=5)
        try:
            had = probe.acquire(timeout=0.5)
        except dblock.BackendError:
            had = False
        if had:
            probe.release()
            return
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.02)
    raise AssertionError(f"process {pid} was always stopped inside an operation")


def count(url: str, table: str, key: str, n: str, counter: str, log: str) -> None:
    """Increment a counter file n times with a non-atomic read-modify-write under the lock."""
    with connect(url, table=table) as client, open(log, "a") as out:
        for _ in range(int(n)):
            with client.lock(key, ttl=30, timeout=120) as lock:
                start = time.monotonic_ns()
                with open(counter) as f:
                    value = int(f.read() or 0)
                time.sleep(0.002)  # widen the race window
                with open(counter, "w") as f:
                    f.write(str(value + 1))
                end = time.monotonic_ns()
                out.write(f"{start} {end} {lock.token}\n")


def acount(url: str, table: str, key: str, n: str, counter: str, log: str) -> None:
    """``count`` through the async client (the file I/O blocks the loop: it is the test's)."""
    import asyncio  # here: a blocking worker of most stores imports no asyncio (0.07 s of CPU)

    async def main() -> None:
        async with await dblock.connect_async(url, table=table) as client:
            with open(log, "a") as out:
                for _ in range(int(n)):
                    async with client.lock(key, ttl=30, timeout=120) as lock:
                        start = time.monotonic_ns()
                        with open(counter) as f:
                            value = int(f.read() or 0)
                        await asyncio.sleep(0.002)  # widen the race window
                        with open(counter, "w") as f:
                            f.write(str(value + 1))
                        end = time.monotonic_ns()
                        out.write(f"{start} {end} {lock.token}\n")

    asyncio.run(main())


def hold(url: str, table: str, key: str, ttl: str) -> None:
    """Acquire, report, wait for 'go' on stdin, then renew and release and report both."""
    with connect(url, table=table) as client:
        lock = client.lock(key, ttl=float(ttl))
        assert lock.acquire(timeout=30)
        print(json.dumps({"token": lock.token, "owner": lock.owner}), flush=True)
        sys.stdin.readline()
        result = {}
        for name, step in (("renew", lock.renew), ("release", lock.release)):
            try:
                step()
                result[name] = "ok"
            except dblock.DBLockError as exc:
                result[name] = type(exc).__name__
        print(json.dumps(result), flush=True)


def schema(url: str, table: str, start_at: str) -> None:
    """Create the schema at a given wall-clock moment (many processes at once)."""
    time.sleep(max(0.0, float(start_at) - time.time()))
    with connect(url, table=table) as client, client.lock("created"):
        print("ok", flush=True)


def once(url: str, table: str, key: str, meet: str, workers: str) -> None:
    """Once ``workers`` processes have connected (each leaves a file in the directory
    ``meet``), run a once-block; print what happened. The one that runs it stays inside
    until another has been refused (its file ``seen``), so the others try while it runs,
    however slowly the machine starts them (at most 60 s)."""
    rendezvous = Path(meet)
    with connect(url, table=table) as client:
        _meet(rendezvous, int(workers))
        try:
            with client.once(key, ttl=90):
                print("ran", flush=True)
                _wait_for((rendezvous / "seen").exists)
        except (dblock.InProgress, dblock.AlreadyDone) as exc:
            (rendezvous / "seen").touch()
            print(type(exc).__name__, flush=True)


def _meet(rendezvous: Path, workers: int) -> None:
    """Leave this process's file in the directory ``rendezvous``; return once ``workers``
    processes have (at most 60 s)."""
    (rendezvous / f"ready.{os.getpid()}").touch()
    _wait_for(lambda: len(list(rendezvous.glob("ready.*"))) >= workers)


def _wait_for(done: Callable[[], bool], bound: float = 60.0) -> None:
    """Poll ``done`` until it is true or ``bound`` s have passed."""
    give_up = time.monotonic() + bound
    while not done() and time.monotonic() < give_up:
        time.sleep(0.01)


def once_crash(url: str, table: str, key: str, ttl: str) -> None:
    """Claim a once-record, report, then wait to be killed."""
    with connect(url, table=table) as client, client.once(key, ttl=float(ttl)):
        print("claimed", flush=True)
        time.sleep(600)


def scheduled(url: str, table: str, name: str, start_at: str, at_least: str = "3") -> None:
    """Fire a scheduled job (at_most 30 s, ``at_least`` s) at a given moment."""
    with connect(url, table=table) as client:

        @client.scheduled(name, at_most=30, at_least=float(at_least))
        def job() -> str:
            return "ran"

        time.sleep(max(0.0, float(start_at) - time.time()))
        print(job() or "skipped", flush=True)


def fair(url: str, table: str, key: str, idx: str, timeout: str) -> None:
    """Wait for a fair lock; print "<idx> <token>" once had (or "<idx> timeout")."""
    with connect(url, table=table) as client:
        lock = client.lock(key, ttl=30, fair=True)
        if not lock.acquire(timeout=float(timeout)):
            print(idx, "timeout", flush=True)
            return
        print(idx, lock.token, flush=True)
        time.sleep(0.1)
        lock.release()


def turn(url: str, table: str, key: str, idx: str, hold: str, stay: str = "0") -> None:
    """Print "queued" once waiting for ``key``; then, once had and held ``hold`` s,
    "<idx> <token> <acquired> <released>" (epoch s); keep the client open ``stay`` s more."""
    with connect(url, table=table) as client:
        lock = client.lock(key, ttl=30)
        if not lock.acquire(blocking=False):
            print("queued", flush=True)
            lock.acquire(timeout=120)
        acquired = time.time()
        time.sleep(float(hold))
        token = lock.token
        released = time.time()
        lock.release()
        print(idx, token, acquired, released, flush=True)
        time.sleep(float(stay))


def bell_passes(url: str, table: str, key: str, n: str, start_at: str) -> None:
    """From ``start_at`` (epoch s), take and release ``key`` n times (MySQL); print how many
    times this process passed the key's doorbell on, woken out of its queue's order."""
    from dblock.stores.mysql import doorbell as _doorbell

    passes = 0
    answer = _doorbell.Doorbell._answer

    def counted(self: _doorbell.Doorbell, row: object, *, durable: bool) -> bool:
        nonlocal passes
        passes += row is not None and tuple(row) == (0, 1)  # type: ignore[call-overload]
        return answer(self, row, durable=durable)

    _doorbell.Doorbell._answer = counted  # type: ignore[method-assign]
    with connect(url, table=table) as client:
        lock = client.lock(key, ttl=30, timeout=120)
        time.sleep(max(0.0, float(start_at) - time.time()))
        for _ in range(int(n)):
            with lock:
                pass
    print(passes, flush=True)


def rw(url: str, table: str, key: str, mode: str, hold: str, count: str, log: str) -> None:
    """Take read or write holds ``count`` times for ``hold`` s; log "<mode> <start> <end>"."""
    with connect(url, table=table) as client, open(log, "a") as out:
        lock = client.rwlock(key, ttl=30, timeout=120)
        for _ in range(int(count)):
            with lock.read_lock() if mode == "read" else lock.write_lock():
                start = time.monotonic_ns()
                time.sleep(float(hold))
                end = time.monotonic_ns()
            out.write(f"{mode} {start} {end}\n")
            out.flush()


def sem(
    url: str,
    table: str,
    key: str,
    permits: str,
    hold: str,
    count: str,
    log: str,
    meet: str = "",
    workers: str = "0",
) -> None:
    """Take a permit ``count`` times for ``hold`` s; log "<start> <end>". With ``meet``, start
    once ``workers`` processes have connected (each leaves a file in that directory), so a
    loaded machine's slow starts do not spread them out."""
    with connect(url, table=table) as client, open(log, "a") as out:
        semaphore = client.semaphore(key, int(permits), ttl=30, timeout=120)
        if meet:
            _meet(Path(meet), int(workers))
        for _ in range(int(count)):
            with semaphore:
                start = time.monotonic_ns()
                time.sleep(float(hold))
                end = time.monotonic_ns()
            out.write(f"{start} {end}\n")
            out.flush()


def sem_hold(url: str, table: str, key: str, permits: str, ttl: str) -> None:
    """Take one permit with a short ttl, report, then wait to be killed."""
    with connect(url, table=table) as client:
        semaphore = client.semaphore(key, int(permits), ttl=float(ttl))
        assert semaphore.acquire(timeout=30)
        print(semaphore.token, flush=True)
        time.sleep(600)


def fence(url: str, table: str, key: str, n: str, record: str) -> None:
    """n times under the lock: check the shared record (nobody inside, every earlier token
    lower than ours), mark it taken with our token, then free it (see tests.contract
    test_async_cancellation's sync + async test)."""
    with dblock.connect(url, table=table) as client:
        for _ in range(int(n)):
            with client.lock(key, ttl=30, timeout=120) as lock:
                enter_fenced(record, lock.token)
                time.sleep(0.002)  # widen the race window
                leave_fenced(record, lock.token)


def fence_through_faults(
    url: str, table: str, key: str, ttl: str, seconds: str, record: str
) -> None:
    """``fence`` for ``seconds`` while the servers fail under it: a BackendError or LockLost
    (a call stuck on a stopped node) is counted and the loop goes on; a second holder inside,
    or a token not above every earlier one, fails the shared record's check (exit 1). Prints
    ``{"sections": n, "faults": m}``."""
    sections = faults = 0
    until = time.monotonic() + float(seconds)
    with dblock.connect(url, table=table) as client:
        while time.monotonic() < until:
            try:
                with client.lock(key, ttl=float(ttl), timeout=30) as lock:
                    enter_fenced(record, lock.token)
                    time.sleep(0.002)  # widen the race window
                    leave_fenced(record, lock.token)
                sections += 1
            except (dblock.BackendError, dblock.LockLost):
                faults += 1
    print(json.dumps({"sections": sections, "faults": faults}), flush=True)


def session_fence(url: str, table: str, key: str, n: str, record: str, mix: str) -> None:
    """``fence`` with session holds (ttl=None); ``mix`` "1": every other hold a lease."""
    with connect(url, table=table) as client:
        for i in range(int(n)):
            ttl = 30.0 if mix == "1" and i % 2 else None
            with client.lock(key, ttl=ttl, timeout=120) as lock:
                enter_fenced(record, lock.token)
                time.sleep(0.002)  # widen the race window
                leave_fenced(record, lock.token)


def session_keys(url: str, table: str, prefix: str, keys: str, records: str, kind: str) -> None:
    """One hold of each key ``<prefix><i>`` in turn (``keys`` of them, each new: no row yet),
    checked by the referee record ``<records>/<i>``: a session hold, a lease (``kind``
    "lease"), or each in turn ("mix")."""
    with connect(url, table=table) as client:
        for i in range(int(keys)):
            session = kind == "session" or (kind == "mix" and i % 2 == 0)
            with client.lock(f"{prefix}{i}", ttl=None if session else 30.0, timeout=120) as lock:
                record = f"{records}/{i}"
                enter_fenced(record, lock.token)
                time.sleep(0.001)  # widen the race window
                leave_fenced(record, lock.token)


def session_hold(url: str, table: str, key: str) -> None:
    """Take a session hold (ttl=None), print its token, and keep it until killed."""
    with connect(url, table=table) as client:
        lock = client.lock(key, ttl=None)
        assert lock.acquire(timeout=30)
        print(lock.token, flush=True)
        time.sleep(600)


def enter_fenced(record: str, token: int | None) -> None:
    with open(record) as f:
        busy, last = map(int, f.read().split())
    assert token is not None and not busy and token > last, (busy, last, token)
    with open(record, "w") as f:
        f.write(f"1 {token}")
    with open(record + ".log", "a") as f:
        f.write(f"{token}\n")


def leave_fenced(record: str, token: int | None) -> None:
    with open(record, "w") as f:
        f.write(f"0 {token}")


def many(
    url: str, table: str, prefix: str, nkeys: str, k: str, rounds: str, hold: str, log: str
) -> None:
    """``rounds`` times, lock_many a random ``k`` of the keys ``prefix0..prefix<nkeys-1>``,
    given in random order; log ``enter <ns> <owner> <key,key,...> <token,token,...>`` once had
    and ``exit <ns> <owner>`` before releasing after ``hold`` s."""
    import random

    names = [f"{prefix}{i}" for i in range(int(nkeys))]
    with connect(url, table=table) as client, open(log, "a") as out:
        for _ in range(int(rounds)):
            keys = random.sample(names, int(k))
            with client.lock_many(keys, ttl=30, timeout=120) as m:
                tokens = m.tokens
                assert tokens is not None and sorted(tokens) == sorted(keys)
                order = sorted(keys)
                out.write(
                    f"enter {time.monotonic_ns()} {m.owner} {','.join(order)} "
                    f"{','.join(str(tokens[key]) for key in order)}\n"
                )
                out.flush()
                time.sleep(float(hold))
                out.write(f"exit {time.monotonic_ns()} {m.owner}\n")
                out.flush()


def many_hold(url: str, table: str, keys: str, ttl: str) -> None:
    """lock_many the comma-separated ``keys``, print its tokens and owner, then wait for
    stdin (the test kills it meanwhile)."""
    with connect(url, table=table) as client:
        m = client.lock_many(keys.split(","), ttl=float(ttl))
        assert m.acquire(timeout=30)
        print(json.dumps({"tokens": m.tokens, "owner": m.owner}), flush=True)
        sys.stdin.readline()
        m.release()


def lead(url: str, table: str, name: str, n: str, record: str, hold: str) -> None:
    """``n`` terms of election ``name``, each checked by the referee ``record`` (nobody else
    leading, every earlier term's token lower), held ``hold`` s, then resigned."""
    with connect(url, table=table) as client:
        election = client.election(name, ttl=30)
        for _ in range(int(n)):
            with election.campaign(value=str(os.getpid()), timeout=120) as term:
                enter_fenced(record, term.token)
                time.sleep(float(hold))
                leave_fenced(record, term.token)


def lead_and_watch(url: str, table: str, name: str, ttl: str, writes: str) -> None:
    """Lead election ``name``; print ``{"token": t}``; then, while ``term.lost`` is not set,
    write the token to the fenced resource ``writes`` (a file that keeps the highest token
    and refuses lower ones) every 10 ms; once lost, print ``{"lost": true, "on_lost": n}``."""
    called: list[object] = []
    with connect(url, table=table) as client:
        election = client.election(name, ttl=float(ttl), on_lost=called.append)
        term = election.campaign(value=str(os.getpid()), timeout=60)
        print(json.dumps({"token": term.token}), flush=True)
        while not term.lost.is_set():
            fenced_write(writes, term.token)
            time.sleep(0.01)
        time.sleep(0.2)  # on_lost runs beside the event
        print(json.dumps({"lost": True, "on_lost": len(called)}), flush=True)
        term.resign()


def fenced_write(path: str, token: int) -> None:
    """A write to the fenced resource: one line appended in one ``write`` (no lock, which a
    SIGSTOPped writer could keep); which writes the resource accepts is judged in the file's
    order by ``fenced_accepted``."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{token}\n".encode())
    finally:
        os.close(fd)


def fenced_accepted(path: str) -> list[tuple[int, bool]]:
    """Each write to the fenced resource, in order, and whether it accepted it: a token at
    least the highest it had accepted."""
    highest, out = 0, []
    with open(path) as f:
        for line in f:
            token = int(line)
            accepted = token >= highest
            highest = max(highest, token)
            out.append((token, accepted))
    return out


if __name__ == "__main__":
    commands = {
        "count": count,
        "acount": acount,
        "hold": hold,
        "schema": schema,
        "once": once,
        "once_crash": once_crash,
        "scheduled": scheduled,
        "fair": fair,
        "turn": turn,
        "rw": rw,
        "bell_passes": bell_passes,
        "sem": sem,
        "sem_hold": sem_hold,
        "fence": fence,
        "fence_through_faults": fence_through_faults,
        "session_fence": session_fence,
        "session_keys": session_keys,
        "session_hold": session_hold,
        "many": many,
        "many_hold": many_hold,
        "lead": lead,
        "lead_and_watch": lead_and_watch,
    }
    commands[sys.argv[1]](*sys.argv[2:])
