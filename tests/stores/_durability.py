"""A hand-over as the server dies (for the durability tests of the client-server stores):
a private server is SIGKILLed the moment a waiter in another process has the lock."""

from __future__ import annotations

import contextlib
import json
import select
import subprocess
import threading
import time
from typing import Any

import dblock
from tests._private_servers import PrivateServer
from tests._servers import raw_connect
from tests._waiting import until
from tests.contract.test_processes import finish, worker


def crash_as_the_waiter_gets_it(
    db: PrivateServer, slow_ms: int, waiter_query: str
) -> tuple[int, int, str | None]:
    """A holder that waited for the lock (on MySQL it keeps the key's bell) releases it to a
    waiter in another process while each log write waits ``slow_ms``; the server is killed
    the moment the waiter has the lock, and started again. Checks that the hold the waiter
    was told of is the one on disk, and that the next token is higher; returns the holder's
    token, the waiter's, and the lease row's ``note``."""
    key = "k"
    raw = raw_connect(db.url)
    cur = raw.cursor()
    cur.execute("CREATE TABLE slow_check (id INT PRIMARY KEY)")
    with db.slow_redo(slow_ms):
        started = time.monotonic()
        cur.execute("INSERT INTO slow_check VALUES (1)")
        assert time.monotonic() - started >= slow_ms / 1000 * 0.9, "commits wait for the log"

    with dblock.connect(db.url) as client:
        first, holder = client.lock(key, ttl=30), client.lock(key, ttl=30)
        assert first.acquire()
        # the holder waits for the lock; it releases in the thread that acquired (a hold is
        # its thread's)
        tokens: list[int | None] = []
        release = threading.Event()
        holding = threading.Thread(target=_hold_until, args=(holder, release, tokens), daemon=True)
        holding.start()
        until(lambda: _queued(cur, 1), "the holder-to-be waits")
        first.release()
        until(lambda: bool(tokens), "the holder has the lock")
        held = tokens[0]
        assert held is not None

        url = db.url + waiter_query
        waiter = worker("hold", url, "dblock_locks", key, "2", stdin=subprocess.PIPE)
        try:
            until(lambda: _queued(cur, 1), "the waiter waits")
            time.sleep(0.5)  # asleep (MySQL: at the bell)
            with db.slow_redo(slow_ms):
                release.set()
                assert waiter.stdout is not None
                ready, _, _ = select.select([waiter.stdout], [], [], 15)
                assert ready, "the waiter never got the lock"
                db.kill()
                told = json.loads(waiter.stdout.readline())
                handed, waiter_owner = told["token"], told["owner"]
            holding.join(15)
        finally:
            finish(waiter)
    raw.close()

    db.start()
    raw = raw_connect(db.url)
    cur = raw.cursor()
    cur.execute("SELECT owner, token, note FROM dblock_locks WHERE lock_key = %s", (key,))
    owner, token, note = cur.fetchone()
    raw.close()
    assert (owner, token) == (waiter_owner, handed), "the hold the waiter had is on disk"
    with dblock.connect(db.url) as client:
        after = client.lock(key, ttl=30)
        assert after.acquire(timeout=10)  # once the waiter's 2 s lease has ended
        assert after.token is not None and after.token > handed
    return held, handed, note


def _queued(cur: Any, n: int) -> bool:
    cur.execute("SELECT count(*) FROM dblock_locks_holders WHERE waiting = 1")
    return int(cur.fetchone()[0]) >= n


def _hold_until(lock: dblock.Lock, release: threading.Event, tokens: list[int | None]) -> None:
    """Acquire, tell the token, release once told to (the server may be killed meanwhile)."""
    assert lock.acquire(timeout=15)
    tokens.append(lock.token)
    release.wait(30)
    with contextlib.suppress(dblock.BackendError, dblock.LockLost):
        lock.release()
