"""A client created before fork() keeps working in the child (fresh connections and threads)."""

from __future__ import annotations

import os
import time

import pytest

import dblock

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")


def test_auto_renew_and_waiting_work_in_a_forked_child(
    client: dblock.Client, key: str, db_url: str, table: str
) -> None:
    warm = client.lock(key + "-warm", ttl=5, auto_renew=True)
    warm.acquire()  # the parent's renewal thread and pool exist before the fork
    warm.release()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: no pytest machinery, report through the exit status
        status = 1
        try:
            lock = client.lock(key, ttl=0.6, auto_renew=True)
            lock.acquire()
            time.sleep(1.5)  # renewed by a renewal thread of the child's own
            with dblock.connect(db_url, table=table) as other:
                taken = other.lock(key).acquire(blocking=False)
            status = 0 if lock.held and not taken else 2
            lock.release()
        finally:
            os.write(write, b"x")
            os._exit(status)
    os.read(read, 1)
    _, status = os.waitpid(pid, 0)
    os.close(read)
    os.close(write)
    assert os.WEXITSTATUS(status) == 0
