"""One chaos worker process: acquire a key, do a fenced write and (on the SQL stores) a
guarded transaction, release; log every hold.

Log lines (JSON, one per event, flushed at once so a SIGKILL loses nothing written):
``hold`` when acquired, ``write`` after the fenced write, ``gbegin`` before the guarded
transaction begins and ``guarded`` after it ended, ``end`` after the release, ``error``
for a failed dblock call, ``escape`` for an exception outside dblock's hierarchy (a bug).
Times are ``time.monotonic()``, which on Linux is one clock for every process of the host.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sys
import time
import traceback
from typing import Any, TextIO

import dblock
from _chaos_db import FencedWriter, GuardedWriter


class Log:
    def __init__(self, path: str) -> None:
        self.file: TextIO = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        self.pid = os.getpid()

    def __call__(self, event: str, **fields: Any) -> None:
        fields.update(ev=event, pid=self.pid, t=time.monotonic())
        self.file.write(json.dumps(fields) + "\n")


def run(config: dict[str, Any], index: int) -> int:
    deadline: float = config["deadline"]
    ttl: float = config["ttl"]
    keys = [f"chaos:{i}" for i in range(config["keys"])]
    log = Log(os.path.join(config["dir"], f"w{index}-{os.getpid()}.jsonl"))
    rng = random.Random()
    parent = os.getppid()
    auto_renew = index % 2 == 1 and config["auto_renew"]
    # every third worker takes 2-3 keys at once (lock_many) half of the time, beside the
    # single-key holders of the same keys
    many = index % 3 == 2 and config.get("many", False) and config["keys"] >= 3
    writer = FencedWriter(config["resource_url"], config["resource"], config["audit"])
    guarded: dict[str, Any] | None = config.get("guarded")
    gwriter = GuardedWriter(config["url"], guarded["counter"], guarded["log"]) if guarded else None
    # --unguarded (a test's): the same transaction without lock.guard, the lease alone
    use_guard = bool(guarded and guarded["guard"])
    client: dblock.Client | None = None
    log("start", index=index, auto_renew=auto_renew)
    rounds = 0
    # bounded: by the deadline, and by a generous count in case time stood still
    while time.monotonic() < deadline and rounds < 1_000_000:
        rounds += 1
        if os.getppid() != parent:  # the orchestrator is gone: stop
            log("orphaned")
            break
        try:
            if client is None:
                client = dblock.connect(
                    config["url"],
                    table=config["table"],
                    create_schema=config.get("create_schema", False),
                )
            outcome = one_hold(
                client=client,
                writer=writer,
                gwriter=gwriter,
                use_guard=use_guard,
                log=log,
                rng=rng,
                keys=keys,
                ttl=ttl,
                deadline=deadline,
                auto_renew=auto_renew,
                many=many and rng.random() < 0.5,
            )
            if outcome == "error":
                # a release given up on leaves the hold this client's (until its lease ends):
                # a careful service starts afresh rather than take those keys again in the
                # same thread (lock_many would refuse: it would wait for itself)
                with contextlib.suppress(dblock.DBLockError):
                    client.close()
                client = None
        except dblock.DBLockError as exc:
            log("error", op="connect", cls=type(exc).__name__, msg=str(exc)[:300])
            time.sleep(rng.uniform(0.05, 0.2))
        except Exception as exc:
            log(
                "escape",
                op="loop",
                cls=type(exc).__name__,
                msg=str(exc)[:300],
                tb=traceback.format_exc()[-2000:],
            )
            time.sleep(0.1)
    writer.close()
    if gwriter is not None:
        gwriter.close()
    if client is not None:
        t0 = time.monotonic()
        try:
            client.close()
        except dblock.DBLockError as exc:
            log("error", op="close", cls=type(exc).__name__, msg=str(exc)[:300])
        log("closed", took=time.monotonic() - t0)
    log("exit")
    return 0


def one_hold(
    *,
    client: dblock.Client,
    writer: FencedWriter,
    gwriter: GuardedWriter | None,
    use_guard: bool,
    log: Log,
    rng: random.Random,
    keys: list[str],
    ttl: float,
    deadline: float,
    auto_renew: bool,
    many: bool = False,
) -> str | None:
    """One hold of one key, or (``many``) of 2-3 keys at once with lock_many: logged per key
    (one ``hold``, ``write`` and ``end`` line each, with that key's token), so the referee
    judges every key's holds alike whoever took them. The release's outcome (None: nothing
    was held)."""
    rids = (
        sorted(rng.sample(range(len(keys)), rng.randint(2, 3)))
        if many
        else [rng.randrange(len(keys))]
    )
    taken = [keys[rid] for rid in rids]
    key = ",".join(taken)
    lost: list[float] = []
    lock: dblock.Lock
    if many:
        lock = client.lock_many(
            taken, ttl=ttl, auto_renew=auto_renew, on_lost=lambda _: lost.append(time.monotonic())
        )
    else:
        lock = client.lock(
            key,
            ttl=ttl,
            reentrant=False,
            auto_renew=auto_renew,
            on_lost=lambda _lock: lost.append(time.monotonic()),
        )
    wait = max(0.0, min(2 * ttl, deadline - time.monotonic()))
    sent = time.monotonic()
    try:
        got = lock.acquire(timeout=wait)
    except dblock.DBLockError as exc:
        log(
            "error",
            op="acquire",
            key=key,
            cls=type(exc).__name__,
            msg=str(exc)[:300],
            took=time.monotonic() - sent,
        )
        time.sleep(rng.uniform(0.05, 0.2))
        return None
    except Exception as exc:
        log(
            "escape",
            op="acquire",
            key=key,
            cls=type(exc).__name__,
            msg=str(exc)[:300],
            tb=traceback.format_exc()[-2000:],
        )
        return None
    got_at = time.monotonic()
    if got_at - sent > wait + 5.0:  # acquire(timeout=T) should take about T seconds
        log("slow", op="acquire", key=key, took=got_at - sent, wait=wait, got=got)
    if not got:
        return None
    tokens = _tokens(lock, taken)
    owner = lock.owner
    if tokens is None:
        # lost between the grant and this line: a store that pushes losses (ZooKeeper's
        # session expired in a restart) may end a hold at once; there is nothing to protect
        log("error", op="acquire", key=key, cls="LockLost", msg="lost at once", took=0.0)
        with contextlib.suppress(dblock.DBLockError):
            lock.release()
        return None
    for rid, k in zip(rids, taken, strict=True):
        log(
            "hold",
            key=k,
            rid=rid,
            token=tokens[k],
            owner=owner,
            sent=sent,
            got=got_at,
            auto_renew=auto_renew,
            many=many,
        )
    # the work: read-ish pause, then the fenced writes; auto-renewing holders sometimes work
    # past their ttl (renewal keeps them safe), the others stay inside it (unless paused).
    # With a guarded writer part of it falls between the guarded read and write, where a
    # pause is what the guard must hold other holders off from
    work = rng.uniform(0.02, 0.5 * ttl)
    if auto_renew and rng.random() < 0.2:
        work = rng.uniform(ttl, 2 * ttl)
    work = min(work, max(0.0, deadline - time.monotonic()))
    inside = rng.uniform(0.0, work) if gwriter is not None else 0.0
    time.sleep(work - inside)
    for rid, k in zip(rids, taken, strict=True):
        _write(writer, log, rid, k, tokens[k], owner, lock)
    if gwriter is not None:
        _guarded(gwriter, log, lock, rids, taken, tokens, owner, inside, use_guard)
    rel_sent = time.monotonic()
    outcome, detail, tries = _release(lock, log, key)
    for rid, k in zip(rids, taken, strict=True):
        log(
            "end",
            key=k,
            rid=rid,
            token=tokens[k],
            owner=owner,
            rel_sent=rel_sent,
            rel_ret=time.monotonic(),
            outcome=outcome,
            detail=detail,
            tries=tries,
            on_lost=lost[:1],
        )
    time.sleep(rng.uniform(0.0, 0.05))
    return outcome


def _tokens(lock: dblock.Lock, keys: list[str]) -> dict[str, int] | None:
    """Each key's token of the hold, or None if it is already lost."""
    many: dict[str, int] | None = getattr(lock, "tokens", None)
    if len(keys) > 1 or many is not None:
        return many
    return None if lock.token is None else {keys[0]: lock.token}


def _write(
    writer: FencedWriter, log: Log, rid: int, key: str, token: int, owner: str, lock: dblock.Lock
) -> None:
    w0 = time.monotonic()
    try:
        accepted: bool | None = writer.write(rid, token, owner)
        werr = None
    except Exception as exc:
        accepted, werr = None, f"{type(exc).__name__}: {str(exc).strip()[:200]}"
    log(
        "write",
        key=key,
        rid=rid,
        token=token,
        owner=owner,
        w0=w0,
        w1=time.monotonic(),
        accepted=accepted,
        err=werr,
        held=lock.held,
    )


def _guarded(
    gwriter: GuardedWriter,
    log: Log,
    lock: dblock.Lock,
    rids: list[int],
    taken: list[str],
    tokens: dict[str, int],
    owner: str,
    work: float,
    use_guard: bool,
) -> None:
    """One transaction on the business tables for every key held: BEGIN, lock.guard(conn),
    read each key's counter, work, write counter + 1 and a log row, COMMIT. A LockLost from
    the guard (or any failure) rolls it back."""
    g0 = time.monotonic()
    for rid, k in zip(rids, taken, strict=True):
        log("gbegin", key=k, rid=rid, token=tokens[k], owner=owner, g0=g0)
    outcome, err, step = "error", None, "begin"
    try:
        conn = gwriter.begin()
        if use_guard:
            step = "guard"
            lock.guard(conn)
        step = "read"
        seen = {rid: gwriter.read(rid) for rid in rids}
        time.sleep(work)
        step = "write"
        for rid, k in zip(rids, taken, strict=True):
            gwriter.write(rid, seen[rid] + 1, owner, tokens[k])
        step = "commit"
        gwriter.commit()
        outcome = "committed"
    except dblock.LockLost as exc:
        outcome, err = "lost", str(exc)[:200]
    except dblock.DBLockError as exc:
        err = f"{step}: {type(exc).__name__}: {str(exc)[:200]}"
    except Exception as exc:
        err = f"{step}: {type(exc).__name__}: {str(exc).strip()[:200]}"
        if step == "guard":  # not a driver error of ours: dblock let it out
            log(
                "escape",
                op="guard",
                key=",".join(taken),
                cls=type(exc).__name__,
                msg=str(exc)[:300],
                tb=traceback.format_exc()[-2000:],
            )
    finally:
        if outcome != "committed":
            gwriter.rollback()
    for rid, k in zip(rids, taken, strict=True):
        log(
            "guarded",
            key=k,
            rid=rid,
            token=tokens[k],
            owner=owner,
            g1=time.monotonic(),
            goutcome=outcome,
            gerr=err,
        )


def _release(lock: dblock.Lock, log: Log, key: str) -> tuple[str, str | None, int]:
    """Release, retrying a BackendError a few times as a careful user would (the hold stays
    ours and renewing), then giving up (the lease runs out by itself): (outcome, detail,
    tries)."""
    outcome, detail, tries = "error", None, 0
    while outcome == "error" and tries < 4:
        tries += 1
        try:
            lock.release()
            outcome = "ok"
        except dblock.LockLost as exc:
            outcome, detail = "lost", str(exc)[:200]
        except dblock.DBLockError as exc:
            outcome, detail = "error", f"{type(exc).__name__}: {str(exc)[:200]}"
            time.sleep(0.1 * tries)
        except Exception as exc:
            outcome, detail = "escape", f"{type(exc).__name__}: {str(exc)[:200]}"
            log(
                "escape",
                op="release",
                key=key,
                cls=type(exc).__name__,
                msg=str(exc)[:300],
                tb=traceback.format_exc()[-2000:],
            )
    return outcome, detail, tries


def _doorbells_from_the_environment() -> None:
    """The test suite's soak has PostgreSQL's waiters wait at doorbells however short the
    queue (``DBLOCK_TEST_PG_CROWD``: tests/_pg_crowd.py)."""
    crowd = os.environ.get("DBLOCK_TEST_PG_CROWD")
    if crowd is not None:
        with contextlib.suppress(ImportError):  # no psycopg: no PostgreSQL store
            from dblock.stores.postgresql import doorbell

            doorbell.CROWD = int(crowd)


def main() -> int:
    _doorbells_from_the_environment()
    config_path, index = sys.argv[1], int(sys.argv[2])
    with open(config_path, encoding="utf-8") as fh:
        config = json.load(fh)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the orchestrator ends us; Ctrl-C is its
    return run(config, index)


if __name__ == "__main__":
    sys.exit(main())
