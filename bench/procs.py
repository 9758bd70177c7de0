"""Worker processes (forked, bounded in time, always reaped) and the low-priority spinner.

Every child asks the kernel to kill it when the parent dies (``PR_SET_PDEATHSIG``), the parent
kills whatever is still alive on exit, and every wait has a deadline.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import multiprocessing as mp
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

_CTX = mp.get_context("fork")
_LIVE: set[Any] = set()


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _reap(proc: Any, grace: float = 1.0) -> None:
    if proc.is_alive():
        proc.terminate()
        proc.join(grace)
    if proc.is_alive():
        proc.kill()
        proc.join(grace)
    _LIVE.discard(proc)


def kill_all() -> None:
    for proc in list(_LIVE):
        with contextlib.suppress(Exception):
            _reap(proc, 0.5)


atexit.register(kill_all)


def _child(send: Connection, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    try:
        result: Any = ("ok", fn(*args))
    except BaseException as exc:
        result = ("error", f"{type(exc).__name__}: {exc}", traceback.format_exc(limit=6))
    with contextlib.suppress(Exception):
        send.send(result)
    send.close()


class WorkerError(RuntimeError):
    pass


def run_parallel(
    fn: Callable[..., Any], arglist: list[tuple[Any, ...]], timeout: float
) -> list[Any]:
    """Run ``fn(*args)`` in one forked process per args; return the results in order.

    Raises WorkerError if a worker raised, or did not finish within ``timeout`` seconds (the
    stragglers are killed either way).
    """
    procs = []
    pipes = []
    try:
        for args in arglist:
            recv, send = _CTX.Pipe(duplex=False)
            proc = _CTX.Process(target=_child, args=(send, fn, args), daemon=True)
            proc.start()
            _LIVE.add(proc)
            send.close()
            procs.append(proc)
            pipes.append(recv)
        deadline = time.monotonic() + timeout
        results: list[Any] = []
        for i, recv in enumerate(pipes):
            left = deadline - time.monotonic()
            if left <= 0 or not recv.poll(left):
                raise WorkerError(f"worker {i} did not finish within {timeout:.0f} s (hung?)")
            try:
                msg = recv.recv()
            except EOFError:
                raise WorkerError(f"worker {i} died (exit code {procs[i].exitcode})") from None
            if msg[0] != "ok":
                raise WorkerError(f"worker {i}: {msg[1]}\n{msg[2]}")
            results.append(msg[1])
        return results
    finally:
        for proc in procs:
            proc.join(0.5)
            _reap(proc)
        for recv in pipes:
            recv.close()


def run_one(fn: Callable[..., Any], args: tuple[Any, ...], timeout: float) -> Any:
    return run_parallel(fn, [args], timeout)[0]


def start_background(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """Start ``fn(*args)`` in a forked process whose result is not wanted; returns the process."""
    proc = _CTX.Process(target=_background, args=(fn, args), daemon=True)
    proc.start()
    _LIVE.add(proc)
    return proc


def _background(fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(BaseException):
        fn(*args)


def stop(proc: Any, grace: float = 2.0) -> None:
    proc.join(grace)
    _reap(proc)


def _spin() -> None:
    os.nice(19)
    end = time.monotonic() + 24 * 3600  # bounded, like every loop here
    while time.monotonic() < end:
        for _ in range(100_000):
            pass


@contextlib.contextmanager
def spinner(enabled: bool = True) -> Iterator[None]:
    """Keep the otherwise idle core busy at nice 19, so it does not sleep between round trips.

    An idle core's wake-up adds to a round trip at random, on a VM especially; a spinner at the
    lowest priority keeps it awake and yields to every real process.
    """
    if not enabled:
        yield
        return
    proc = start_background(_spin, ())
    try:
        yield
    finally:
        _reap(proc, 0.5)


def install_signal_handlers() -> None:
    """SIGTERM and SIGHUP end the run like Ctrl-C: children are reaped on the way out."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError, OSError):
            signal.signal(sig, handler)
