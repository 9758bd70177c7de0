"""A client created before fork() keeps working in the child (fresh connections and threads)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Any

import pytest

import dblock
from tests._forked import wait_for, wrong_in_child
from tests._internals import store_of
from tests.providers import Provider

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()"),
    # a forked child reaches the locks through the store as another process would; a fork
    # takes only the calling thread, not the async client's event loop
    pytest.mark.needs("processes", "blocking"),
]


def test_auto_renew_and_waiting_work_in_a_forked_child(
    client: dblock.Client, key: str, provider: Provider, table: str
) -> None:
    warm = client.lock(key + "-warm", ttl=5, auto_renew=True)
    warm.acquire()  # the parent's renewal thread and pool exist before the fork
    warm.release()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: no pytest machinery, report through the exit status
        status = 1
        try:
            # a ttl that the child's first grant (a new connection) beats on a loaded
            # machine, and that its renewals keep there (1 s ran out on a quorum: CI)
            lock = client.lock(key, ttl=2.0, auto_renew=True)
            lock.acquire()
            time.sleep(3.0)  # renewed by a renewal thread of the child's own
            with provider.connect(table=table) as other:
                taken = other.lock(key).acquire(blocking=False)
            status = 3 if taken else 0 if lock.held else 2
            lock.release()
        finally:
            os.write(write, b"x")
            os._exit(status)
    os.read(read, 1)
    _, status = os.waitpid(pid, 0)
    os.close(read)
    os.close(write)
    problem = {2: "the child lost its hold", 3: "another client took it"}
    assert os.WEXITSTATUS(status) == 0, problem.get(os.WEXITSTATUS(status))


def _internal_locks(client: dblock.Client) -> list[Any]:
    """Every lock of the client's that a background or other thread can hold at a fork."""
    backend: Any = store_of(client)
    found = [client._core.scheduler._cond, client._core._registry_lock, backend._pool_lock]
    for name in ("_quiet_lock", "_listener_lock"):  # PostgreSQL
        if hasattr(backend, name):
            found.append(getattr(backend, name))
    bells = getattr(backend, "_bells", None)  # MySQL's doorbells
    if bells is not None:
        found.append(bells._mutex)
    return found


@pytest.mark.needs("pool")
def test_a_child_forked_while_another_thread_holds_a_client_lock_does_not_hang(
    client: dblock.Client, key: str
) -> None:
    warm = client.lock(key + "-warm", ttl=5, auto_renew=True)
    warm.acquire()
    warm.release()
    held, go = threading.Event(), threading.Event()

    def sit_on_them() -> None:  # as a renewal or a checkout would, at the wrong moment
        with contextlib.ExitStack() as stack:
            for inner in _internal_locks(client):
                stack.enter_context(inner)
            held.set()
            go.wait()

    thread = threading.Thread(target=sit_on_them)
    thread.start()
    held.wait()
    try:
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                lock = client.lock(key, ttl=0.6, auto_renew=True)
                lock.acquire()
                time.sleep(1)  # renewed by the child's own thread
                status = 0 if lock.held else 2
                lock.release()
            finally:
                os._exit(status)
    finally:
        go.set()
        thread.join()
    assert wait_for(pid, 30) == 0


def test_a_forked_child_does_not_renew_its_parents_leases(
    client: dblock.Client, key: str, provider: Provider, table: str
) -> None:
    read, write = os.pipe()
    holder = os.fork()
    if holder == 0:  # holds the key with auto_renew, forks, and dies holding it
        try:
            client.lock(key, ttl=1, auto_renew=True).acquire()
            if os.fork() == 0:  # starts a renewal thread of its own, and lives on
                client.lock(key + "-child", ttl=1, auto_renew=True).acquire()
                # told once it holds: a loaded machine took seconds to get that far (CI)
                os.write(write, str(os.getpid()).encode())
                time.sleep(30)
                os._exit(0)
        finally:
            os.kill(os.getpid(), signal.SIGKILL)
    os.close(write)
    child = int(os.read(read, 32) or b"0")
    os.close(read)
    os.waitpid(holder, 0)
    try:
        assert child
        with provider.connect(table=table) as other:
            # the holder's 1 s lease ends unrenewed, unless the child renews it for its parent
            assert other.lock(key, timeout=6).acquire()
            assert client.lock(key + "-child").locked()  # the child itself is alive and holding
    finally:
        if child:
            os.kill(child, signal.SIGKILL)  # not ours to wait for: the holder's orphan


def _child_keeps_off(lock: dblock.Lock, key: str, provider: Provider, table: str) -> str:
    """In a child forked while ``lock`` was held: what it did wrong with the parent's hold."""
    if lock.held or lock.token is not None:
        return "the child believes it holds the lock"
    if lock.acquire(blocking=False):
        return "the child re-entered the parent's hold"
    with contextlib.suppress(dblock.NotHeld):
        lock.renew()
        return "the child renewed the parent's lease"
    lock.__exit__(None, None, None)  # leaving the parent's `with` block
    with provider.connect(table=table) as other:
        if other.lock(key).acquire(blocking=False):
            return "leaving the block freed the parent's lock"
    return ""


def test_a_hold_inherited_by_a_forked_child_stays_the_parents(
    provider: Provider, client: dblock.Client, key: str, table: str
) -> None:
    with client.lock(key, ttl=30, auto_renew=True) as lock:
        token = lock.token
        assert wrong_in_child(lambda: _child_keeps_off(lock, key, provider, table)) == ""
        assert lock.held and lock.token == token
        with provider.connect(table=table) as other:
            assert not other.lock(key).acquire(blocking=False), "the parent lost its lock"
    assert not lock.held
