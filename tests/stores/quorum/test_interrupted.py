"""A quorum's call interrupted in the caller's wait for the members' answers (Ctrl-C, the
exception a signal handler raises: ``dblock run`` raises one at SIGINT while it waits). The
calls go on in the pool's threads and reach the stores anyway. The interruption may surface
as another error: landing inside a condition's wait, between letting go of its lock and
taking it back, it makes the ``with`` around the wait raise ``RuntimeError: release unlocked
lock``. A queue entry made that way must still be removed, or every newcomer waits for its
lease to end (found by `dblock run`'s contract test under load)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

import dblock
from dblock.stores.quorum import store as quorum_store
from tests._internals import store_of


def test_an_interruption_in_the_wait_for_the_enqueue_leaves_no_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = " ".join(f"sqlite:///{tmp_path}/q{i}.sqlite3" for i in range(3))
    with (
        dblock.connect(url, table="locks") as holder,
        dblock.connect(url, table="locks") as waiter,
    ):
        held = holder.lock("k", ttl=30)
        assert held.acquire()
        store = store_of(waiter)
        armed: list[bool] = []
        release_save = threading.Condition._release_save  # type: ignore[attr-defined]

        def release_then_interrupt(self: Any) -> None:
            release_save(self)
            if armed and threading.current_thread() is threading.main_thread():
                armed.clear()
                raise KeyboardInterrupt  # where a signal handler's exception can land

        wait = quorum_store.wait_futures
        enqueue = store.enqueue
        queued = threading.Event()

        def enqueue_then_arm(*args: Any, **kwargs: Any) -> Any:
            def arm_then_wait(*a: Any, **kw: Any) -> Any:
                if not queued.is_set():  # once: the first wait for the enqueue's answer
                    queued.set()
                    armed.append(True)
                return wait(*a, **kw)

            monkeypatch.setattr(quorum_store, "wait_futures", arm_then_wait)
            try:
                return enqueue(*args, **kwargs)
            finally:
                monkeypatch.setattr(quorum_store, "wait_futures", wait)

        monkeypatch.setattr(threading.Condition, "_release_save", release_then_interrupt)
        monkeypatch.setattr(store, "enqueue", enqueue_then_arm)
        with pytest.raises((RuntimeError, KeyboardInterrupt)):
            waiter.lock("k", ttl=30).acquire(timeout=20)
        monkeypatch.undo()
        assert queued.is_set(), "the wait never joined the queue"
        assert not armed, "the interruption never landed"
        # the enqueue went on in its thread and reached the queue's keeper (in milliseconds:
        # a second is ample), and leaving the queue must have removed it after that
        time.sleep(1.0)
        assert store_of(holder).probe("k", "nobody")[1] == 0, "the entry was left behind"
        held.release()
        assert holder.lock("k", ttl=30).acquire(blocking=False), "a newcomer gets the lock"
