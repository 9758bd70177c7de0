"""SQLite's async path: a worker thread per operation (dblock's) against aiosqlite.

    python -m bench.async_sqlite                  # 5 repeats of 2 s per measurement
    python -m bench.async_sqlite --duration 1 --repeats 3 --tasks 50

dblock's async client runs SQLite's stdlib ``sqlite3`` on a worker thread, one hop of
``asyncio.to_thread`` per store operation (``blocking_driver = True``). aiosqlite runs
``sqlite3`` on a thread of each connection's own, fed by a queue. Measured side by side in one
run, each measurement in a fresh process, the order rotating round by round:

* ``sync``: the blocking client (threads for the contended run), the reference;
* ``async: worker thread``: ``connect_async`` as shipped;
* ``async: aiosqlite, per statement``: the store's connections are aiosqlite ones, each
  ``execute`` and ``fetchone`` awaited (what a store written against aiosqlite's API does);
* ``async: aiosqlite, per operation``: the same connections, each store operation sent whole
  to the connection's thread (one hop, as the worker thread does; aiosqlite's private
  ``_execute``: the best aiosqlite could do, not something to ship).

Two measurements: uncontended acquire+release pairs/s (one task, one key), and ``--tasks``
(50) tasks (threads for ``sync``) on one client taking turns on one key: sections/s and p99
wait. The adapters live here: they are not worth shipping (see docs/async.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sqlite3
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

from bench import procs
from dblock.bench import median, percentile

VARIANTS = (
    "sync",
    "async: worker thread",
    "async: aiosqlite, per statement",
    "async: aiosqlite, per operation",
)


# -- the aiosqlite adapter -----------------------------------------------------------------
class _GreenCursor:
    """An aiosqlite cursor seen as a sqlite3 one by the store's code (in a greenlet)."""

    def __init__(self, cursor: Any) -> None:
        self._cursor = cursor

    @property
    def rowcount(self) -> int:
        return int(self._cursor.rowcount)

    def fetchone(self) -> Any:
        from dblock._green import await_

        return await_(self._cursor.fetchone())

    def fetchall(self) -> list[Any]:
        from dblock._green import await_

        return list(await_(self._cursor.fetchall()))

    def __iter__(self) -> Iterator[Any]:
        return iter(self.fetchall())


class _GreenConnection:
    """An aiosqlite connection seen as a blocking sqlite3 one: each call awaits its thread."""

    def __init__(self, aio: Any) -> None:
        self.aio = aio

    def execute(self, sql: str, params: Any = ()) -> _GreenCursor:
        from dblock._green import await_

        return _GreenCursor(await_(self.aio.execute(sql, params)))

    @property
    def in_transaction(self) -> bool:
        return bool(self.aio.in_transaction)

    def interrupt(self) -> None:  # the statement watchdog's thread
        with contextlib.suppress(Exception):
            self.aio._conn.interrupt()

    def close(self) -> None:
        from dblock._green import await_, bridged

        if bridged():
            with contextlib.suppress(Exception):
                await_(self.aio.close())
        else:
            self.aio.stop()


def aiosqlite_store(url: str, table: str, runtime: Any, whole_operations: bool) -> Any:
    """dblock's SQLite store over aiosqlite connections (see the module doc)."""
    import aiosqlite

    from dblock._green import await_, bridged
    from dblock._validate import check_table
    from dblock.stores.sqlite.store import SqliteStore
    from dblock.tools import parse_url

    class AioSqliteStore(SqliteStore):
        blocking_driver = False  # its connections await on the loop themselves

        def _connect(self) -> Any:
            if not bridged():  # a waiter's change watch: a plain connection, read on the loop
                return super()._connect()
            # dblock's own connection set-up (pragmas, WAL), run on aiosqlite's thread
            aio = aiosqlite.Connection(partial(SqliteStore._connect, self), 64)
            return _GreenConnection(await_(aio))

        def run(self, what: str, fn: Callable[[Any], Any], **kwargs: Any) -> Any:
            if not whole_operations:
                return super().run(what, fn, **kwargs)

            def whole(conn: _GreenConnection) -> Any:
                return await_(conn.aio._execute(fn, conn.aio._conn))

            return super().run(what, whole, **kwargs)

    schema, name = check_table(table)
    store = AioSqliteStore(parse_url(url), schema, name)
    store.rt = runtime
    store.ensure_schema(create=True)
    return store


async def _async_client(url: str, table: str, variant: str) -> Any:
    import dblock
    from dblock._async_client import AsyncClient
    from dblock._client import Client
    from dblock._green import spawn
    from dblock._loop_runtime import LoopRuntime

    if variant == "async: worker thread":
        return await dblock.connect_async(url, table=table)
    runtime = LoopRuntime(asyncio.get_running_loop())
    whole = variant.endswith("per operation")
    store = await spawn(aiosqlite_store, url, table, runtime, whole)
    return AsyncClient(Client(store, runtime), runtime)


# -- the measurements (each in a fresh process) ----------------------------------------------
def uncontended(url: str, table: str, variant: str, duration: float) -> float:
    """acquire+release pairs/s on one key."""
    key = f"bench-aio-{uuid.uuid4().hex[:12]}"
    if variant == "sync":
        import dblock

        with dblock.connect(url, table=table) as client:
            lock = client.lock(key, ttl=60)
            for _ in range(20):  # warm-up
                lock.acquire()
                lock.release()
            n, start = 0, time.perf_counter()
            while time.perf_counter() - start < duration:
                lock.acquire()
                lock.release()
                n += 1
            return n / (time.perf_counter() - start)

    async def main() -> float:
        async with await _async_client(url, table, variant) as client:
            lock = client.lock(key, ttl=60)
            for _ in range(20):
                await lock.acquire()
                await lock.release()
            n, start = 0, time.perf_counter()
            while time.perf_counter() - start < duration:
                await lock.acquire()
                await lock.release()
                n += 1
            return n / (time.perf_counter() - start)

    return asyncio.run(main())


def contended(url: str, table: str, variant: str, duration: float, tasks: int) -> dict[str, Any]:
    """``tasks`` tasks (threads for sync) of one client take turns on one key."""
    key = f"bench-aio-{uuid.uuid4().hex[:12]}"
    waits: list[float] = []
    spans: list[tuple[float, float]] = []  # (acquired, released) of each section
    if variant == "sync":
        import dblock

        with dblock.connect(url, table=table) as client:
            start_line = threading.Barrier(tasks)

            def work() -> None:
                lock = client.lock(key, ttl=60)
                start_line.wait(60)
                end = time.monotonic() + duration
                while time.monotonic() < end:
                    t_req = time.monotonic()
                    lock.acquire()
                    t_acq = time.monotonic()
                    lock.release()
                    waits.append(t_acq - t_req)
                    spans.append((t_acq, time.monotonic()))

            threads = [threading.Thread(target=work, daemon=True) for _ in range(tasks)]
            for th in threads:
                th.start()
            for th in threads:
                th.join(duration + 60)
    else:

        async def main() -> None:
            async with await _async_client(url, table, variant) as client:
                go = asyncio.Event()
                end = 0.0

                async def work() -> None:
                    lock = client.lock(key, ttl=60)
                    await go.wait()
                    while time.monotonic() < end:
                        t_req = time.monotonic()
                        await lock.acquire()
                        t_acq = time.monotonic()
                        await lock.release()
                        waits.append(t_acq - t_req)
                        spans.append((t_acq, time.monotonic()))

                workers = [asyncio.create_task(work()) for _ in range(tasks)]
                await asyncio.sleep(0)
                end = time.monotonic() + duration
                go.set()
                await asyncio.gather(*workers)

        asyncio.run(main())
    window = max(s[1] for s in spans) - min(s[0] for s in spans)
    return {"throughput": len(spans) / window, "wait_p99_ms": percentile(waits, 99) * 1000}


# -- the run ---------------------------------------------------------------------------------
def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(duration: float, repeats: int, tasks: int, directory: str) -> dict[str, dict[str, Any]]:
    url, table = f"sqlite:///{directory}/bench.sqlite3", "dblock_bench_aio"
    out: dict[str, dict[str, Any]] = {v: {"pairs": [], "sections": [], "p99": []} for v in VARIANTS}
    for r in range(repeats):
        k = r % len(VARIANTS)
        order = list(VARIANTS[k:] + VARIANTS[:k])
        for variant in order if r % 2 == 0 else order[::-1]:
            pairs = procs.run_one(uncontended, (url, table, variant, duration), duration + 60)
            res = procs.run_one(contended, (url, table, variant, duration, tasks), duration + 90)
            out[variant]["pairs"].append(pairs)
            out[variant]["sections"].append(res["throughput"])
            out[variant]["p99"].append(res["wait_p99_ms"])
            log(
                f"round {r + 1}/{repeats} {variant}: {pairs:,.0f} pairs/s; {tasks} on one key "
                f"{res['throughput']:,.0f}/s, p99 wait {res['wait_p99_ms']:.1f} ms"
            )
    return out


def markdown(out: dict[str, dict[str, Any]], tasks: int) -> str:
    ref = median(out["async: worker thread"]["pairs"])
    ref_c = median(out["async: worker thread"]["sections"])
    lines = [
        f"| variant | pairs/s (range) | vs worker thread | {tasks} on one key: sections/s "
        "(range) | vs worker thread | p99 wait ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for variant, v in out.items():
        p, s = median(v["pairs"]), median(v["sections"])
        lines.append(
            f"| {variant} | {p:,.0f} ({min(v['pairs']):,.0f}–{max(v['pairs']):,.0f}) "
            f"| {p / ref:.2f}× | {s:,.0f} ({min(v['sections']):,.0f}–{max(v['sections']):,.0f}) "
            f"| {s / ref_c:.2f}× | {median(v['p99']):.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.async_sqlite", description=__doc__)
    p.add_argument("--duration", type=float, default=2.0, help="seconds per measurement")
    p.add_argument("--repeats", type=int, default=5, help="rounds (medians are quoted)")
    p.add_argument("--tasks", type=int, default=50, help="tasks on one key (contended run)")
    p.add_argument("--no-spinner", action="store_true", help="do not keep the other core busy")
    args = p.parse_args(argv)
    procs.install_signal_handlers()
    with tempfile.TemporaryDirectory(prefix="dblock-aio-") as directory:
        Path(directory).chmod(0o700)
        with procs.spinner(not args.no_spinner):
            out = run(args.duration, max(1, args.repeats), args.tasks, directory)
    print(
        f"SQLite {sqlite3.sqlite_version}, Python {sys.version.split()[0]}; medians of "
        f"{args.repeats} rounds of {args.duration:g} s; command: python -m bench.async_sqlite "
        + " ".join(sys.argv[1:] if argv is None else argv)
    )
    print()
    print(markdown(out, args.tasks))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
