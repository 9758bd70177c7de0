"""A process that takes a ZooKeeper lock, for the fault tests (``python -m``).

``python -m tests.stores.zookeeper._holder URL TABLE KEY LOG ROUNDS HOLD TTL``: connect
and append ``ready <pid>`` to LOG; then ROUNDS times, acquire KEY (ttl TTL, auto_renew off),
append ``enter <token> <monotonic>`` to LOG, keep it HOLD seconds, append
``exit <token> <monotonic> <lost>``, release (a LockLost is recorded as ``lost`` and not an
error). ``on_lost`` appends ``on_lost <token>``. The monotonic clock is the host's: the
referee compares lines of different processes.
"""

from __future__ import annotations

import os
import sys
import time

import dblock


def _log(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def main(argv: list[str]) -> int:
    url, table, key, log, rounds, hold, ttl = argv
    with dblock.connect(url, table=table) as client:
        _log(log, f"ready {os.getpid()}")
        for _ in range(int(rounds)):
            lock = client.lock(
                key,
                ttl=float(ttl),
                timeout=120,
                on_lost=lambda lk: _log(log, f"on_lost {lk.token} {os.getpid()}"),
            )
            lock.acquire()
            token = lock.token
            _log(log, f"enter {token} {time.monotonic()} {os.getpid()}")
            time.sleep(float(hold))
            _log(log, f"exit {token} {time.monotonic()} {os.getpid()}")
            try:
                lock.release()
            except dblock.LockLost:
                _log(log, f"lost {token} {os.getpid()}")
        time.sleep(0.5)  # an on_lost that is on its way
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
