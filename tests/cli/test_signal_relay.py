"""The signal relay ends `dblock run`'s wait even when a driver swallows the first Interrupted."""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import suppress

import pytest

from dblock.cli import supervisor
from dblock.cli.supervisor import Interrupted, SignalRelay


@pytest.fixture(autouse=True)
def _quick_redelivery(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervisor, "REDELIVER_INTERVAL", 0.1)


def _signal_soon(signum: int, delay: float = 0.1) -> None:
    threading.Timer(delay, os.kill, (os.getpid(), signum)).start()


def _swallowing_wait(seconds: float) -> None:
    """A driver's call that turns any exception into its own error, as kazoo's ``_call`` does."""
    with suppress(BaseException):
        threading.Event().wait(seconds)


def test_a_swallowed_signal_still_ends_the_wait() -> None:
    with SignalRelay():
        _signal_soon(signal.SIGTERM)
        _swallowing_wait(5)  # the first Interrupted is lost here
        started = time.monotonic()
        with pytest.raises(Interrupted) as caught:
            threading.Event().wait(10)  # the wait goes on, as the engine's retry does
    assert caught.value.signum == signal.SIGTERM
    assert time.monotonic() - started < 5  # redelivered; without it the wait ran its 10 s


def test_a_grant_after_a_swallowed_signal_does_not_start_cmd() -> None:
    with SignalRelay() as relay:
        _signal_soon(signal.SIGINT)
        _swallowing_wait(5)
        with pytest.raises(Interrupted) as caught:
            relay.defer()  # the lock was granted: CMD must not start
    assert caught.value.signum == signal.SIGINT


def test_no_signal_is_redelivered_after_the_relay_ends() -> None:
    got: list[int] = []
    previous = signal.signal(signal.SIGHUP, lambda signum, _frame: got.append(signum))
    try:
        with SignalRelay():
            _signal_soon(signal.SIGHUP)
            with pytest.raises(Interrupted):
                threading.Event().wait(5)
        time.sleep(0.5)  # five redelivery intervals
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert got == []


def _wait_then_clean_up(cleaned: list[str]) -> None:
    try:
        threading.Event().wait(5)
    finally:
        time.sleep(0.5)  # five redelivery intervals
        cleaned.append("finally")


def test_a_redelivery_never_cuts_the_interrupted_waits_cleanup_short() -> None:
    # the wait's own cleanup (leaving the store's queue) runs while the first Interrupted
    # goes up: a redelivery raising in it would leave it half done
    cleaned: list[str] = []
    with SignalRelay():
        _signal_soon(signal.SIGTERM)
        try:
            _wait_then_clean_up(cleaned)
        except Interrupted:
            time.sleep(0.5)  # the caller's handling of it, still in the relay
            cleaned.append("except")
    assert cleaned == ["finally", "except"]


def test_a_signal_sent_again_still_raises_in_the_cleanup() -> None:
    # a second Ctrl-C is the user's: it ends a cleanup they will not wait for (redeliveries
    # come every 0.1 s meanwhile, and do not raise there)
    with SignalRelay() as relay:
        _signal_soon(signal.SIGINT)
        try:
            threading.Event().wait(5)
        except Interrupted:
            _signal_soon(signal.SIGINT, 0.35)
            with pytest.raises(Interrupted):
                threading.Event().wait(5)
            _stop_redelivering(relay)


def test_a_signal_sent_again_while_a_redelivery_is_on_its_way_still_raises() -> None:
    # both land before the main thread runs a handler (held back here by blocking them, as a
    # busy machine holds them back): were the redelivery sent as the same signal, the two
    # would make one handler call, taken for the redelivery (the suite run beside two CPU
    # hogs once lost a second Ctrl-C so)
    main = threading.main_thread().ident or 0
    held = {signal.SIGINT, signal.SIGURG}
    with SignalRelay() as relay:
        _signal_soon(signal.SIGINT)
        try:
            threading.Event().wait(5)
        except Interrupted:
            signal.pthread_sigmask(signal.SIG_BLOCK, held)
            pending: set[int] = set()
            raised = False
            try:
                time.sleep(0.35)  # redeliveries, every 0.1 s, wait in the mask
                signal.pthread_kill(main, signal.SIGINT)  # the second Ctrl-C
                pending = signal.sigpending()
                signal.pthread_sigmask(signal.SIG_UNBLOCK, held)  # the handlers run here
                threading.Event().wait(2)
            except Interrupted:
                raised = True
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
            _stop_redelivering(relay)
    assert signal.SIGINT in pending
    assert raised, "the second Ctrl-C did not raise"


def _stop_redelivering(relay: SignalRelay) -> None:
    """What `dblock run` does once the wait ended: no more redeliveries (which would raise
    once the ``except`` block that caught the first is left)."""
    with suppress(Interrupted):
        relay.defer()


def test_after_defer_signals_are_queued_not_raised() -> None:
    with SignalRelay() as relay:
        relay.defer()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.3)
        assert relay._queued == [signal.SIGTERM]
