"""One chaos worker process: acquire a key, do a fenced write, release; log every hold.

Log lines (JSON, one per event, flushed at once so a SIGKILL loses nothing written):
``hold`` when acquired, ``write`` after the fenced write, ``end`` after the release, ``error``
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
from _chaos_db import FencedWriter


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
    writer = FencedWriter(config["resource_url"], config["resource"], config["audit"])
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
                client = dblock.connect(config["url"], table=config["table"], create_schema=False)
            one_hold(
                client=client,
                writer=writer,
                log=log,
                rng=rng,
                keys=keys,
                ttl=ttl,
                deadline=deadline,
                auto_renew=auto_renew,
            )
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
    log: Log,
    rng: random.Random,
    keys: list[str],
    ttl: float,
    deadline: float,
    auto_renew: bool,
) -> None:
    rid = rng.randrange(len(keys))
    key = keys[rid]
    lost: list[float] = []
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
        return
    except Exception as exc:
        log(
            "escape",
            op="acquire",
            key=key,
            cls=type(exc).__name__,
            msg=str(exc)[:300],
            tb=traceback.format_exc()[-2000:],
        )
        return
    got_at = time.monotonic()
    if got_at - sent > wait + 5.0:  # acquire(timeout=T) should take about T seconds
        log("slow", op="acquire", key=key, took=got_at - sent, wait=wait, got=got)
    if not got:
        return
    token, owner = lock.token, lock.owner
    if token is None:
        # lost between the grant and this line: a store that pushes losses (ZooKeeper's
        # session expired in a restart) may end a hold at once; there is nothing to protect
        log("error", op="acquire", key=key, cls="LockLost", msg="lost at once", took=0.0)
        with contextlib.suppress(dblock.DBLockError):
            lock.release()
        return
    log(
        "hold",
        key=key,
        rid=rid,
        token=token,
        owner=owner,
        sent=sent,
        got=got_at,
        auto_renew=auto_renew,
    )
    # the work: read-ish pause, then the fenced write; auto-renewing holders sometimes work
    # past their ttl (renewal keeps them safe), the others stay inside it (unless paused)
    work = rng.uniform(0.02, 0.5 * ttl)
    if auto_renew and rng.random() < 0.2:
        work = rng.uniform(ttl, 2 * ttl)
    time.sleep(min(work, max(0.0, deadline - time.monotonic())))
    w0 = time.monotonic()
    try:
        accepted: bool | None = writer.write(rid, int(token or 0), owner)
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
    rel_sent = time.monotonic()
    outcome, detail, tries = "error", None, 0
    # a release that fails with BackendError leaves the hold ours (and renewing): retry it a
    # few times, as a careful user would, then give up (the lease runs out by itself)
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
    log(
        "end",
        key=key,
        rid=rid,
        token=token,
        owner=owner,
        rel_sent=rel_sent,
        rel_ret=time.monotonic(),
        outcome=outcome,
        detail=detail,
        tries=tries,
        on_lost=lost[:1],
    )
    time.sleep(rng.uniform(0.0, 0.05))


def main() -> int:
    config_path, index = sys.argv[1], int(sys.argv[2])
    with open(config_path, encoding="utf-8") as fh:
        config = json.load(fh)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the orchestrator ends us; Ctrl-C is its
    return run(config, index)


if __name__ == "__main__":
    sys.exit(main())
