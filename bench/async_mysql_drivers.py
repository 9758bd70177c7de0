"""aiomysql or asyncmy under ``dblock.connect_async``: uncontended acquire+release pairs/s.

    python -m bench.async_mysql_drivers [--mysql-url URL] [--seconds 3] [--rounds 3]

Two measures per driver, side by side in one run, rounds interleaved (the server's and the
machine's noise falls on each driver alike); the best round is reported, with CPU time:

- **raw**: dblock's own statements for one uncontended pair, sent by hand on one connection
  (the acquire ``UPDATE``, the ``INSERT ... ON DUPLICATE KEY UPDATE`` where it took nothing,
  the release): the driver alone, no dblock code.
- **connect_async**: ``await lock.acquire(); await lock.release()`` through the async client,
  whose store runs on the driver (aiomysql as shipped; asyncmy through the adapter subclass
  below, which maps no errors: good for this measure only).

PyMySQL and the blocking client are measured too, as the reference.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import pymysql

import dblock
from dblock._green import await_
from dblock.stores.mysql.green import GreenConnection, GreenCursor
from dblock.stores.mysql.statements import MysqlStatements

DEFAULT_URL = "mysql://root@127.0.0.1:3306/test"


class _AsyncmyCursor(GreenCursor):
    __slots__ = ()

    def __exit__(self, *exc: object) -> None:
        pass

    def fetchone(self) -> Any:
        return self._conn.call(self._cursor.fetchone())

    def fetchall(self) -> list[Any]:
        return list(self._conn.call(self._cursor.fetchall()))


class _AsyncmyGreen(GreenConnection):
    """The adapter over asyncmy's connection (bench only: its errors are not mapped)."""

    __slots__ = ()

    @classmethod
    def connect(cls, *, user_init: str | None, init_command: str | None, **kwargs: Any) -> Any:
        import asyncmy

        raw = await_(
            asyncmy.connect(**_asyncmy_options(kwargs), init_command=init_command, autocommit=True)
        )
        return cls(raw, None)

    def cursor(self) -> GreenCursor:
        return _AsyncmyCursor(self, self._conn.cursor())


def _asyncmy_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    names = ("host", "port", "user", "password", "database", "charset", "client_flag")
    return {k: kwargs[k] for k in names if k in kwargs}


def _plain(url: str) -> dict[str, Any]:
    parts = urlsplit(url)
    return {
        "host": parts.hostname or "127.0.0.1",
        "port": parts.port or 3306,
        "user": parts.username or "root",
        "password": parts.password or "",
        "database": parts.path.lstrip("/") or None,
        "charset": "utf8mb4",
        "autocommit": True,
    }


def _pair_params(owner: str) -> dict[str, Any]:
    # sname: the key's session lock, which a lease statement checks is free
    return {
        "key": "bench-raw",
        "kind": "lock",
        "owner": owner,
        "ttl_us": 30_000_000,
        "sname": "dblock-s:bench-raw",
    }


async def _async_raw(driver: str, url: str, sql: MysqlStatements, seconds: float) -> float:
    """Pairs/s of dblock's statements sent by hand through ``driver``'s asyncio connection."""
    options = _plain(url)
    if driver == "aiomysql":
        import aiomysql

        options["db"] = options.pop("database")
        conn = await aiomysql.connect(**options)
    else:
        import asyncmy

        conn = await asyncmy.connect(**options)
    params = _pair_params(uuid.uuid4().hex)
    try:
        cur = conn.cursor()
        if driver == "aiomysql":
            cur = await cur
        return await _timed_async(seconds, lambda: _async_pair(cur, sql, params))
    finally:
        conn.close()


async def _async_pair(cur: Any, sql: MysqlStatements, params: dict[str, Any]) -> None:
    for statement in sql.acquire:
        if await cur.execute(statement, params) in (1, 2):
            break
    await cur.execute(sql.release, {**params, "token": cur.lastrowid})


def _sync_raw(url: str, sql: MysqlStatements, seconds: float) -> float:
    conn = pymysql.connect(**_plain(url))
    params = _pair_params(uuid.uuid4().hex)
    try:
        with conn.cursor() as cur:
            start, pairs = time.perf_counter(), 0
            while time.perf_counter() - start < seconds:
                for statement in sql.acquire:
                    if cur.execute(statement, params) in (1, 2):
                        break
                cur.execute(sql.release, {**params, "token": cur.lastrowid})
                pairs += 1
            return pairs / (time.perf_counter() - start)
    finally:
        conn.close()


async def _timed_async(seconds: float, pair: Callable[[], Awaitable[None]]) -> float:
    start, pairs = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        await pair()
        pairs += 1
    return pairs / (time.perf_counter() - start)


async def _client_pairs(driver: str, url: str, table: str, seconds: float) -> float:
    client = await dblock.connect_async(url, table=table, create_schema=False)
    if driver == "asyncmy":
        client._sync._store._green = _AsyncmyGreen  # before its first connection
    try:
        lock = client.lock(f"bench-{driver}", ttl=30)

        async def pair() -> None:
            await lock.acquire()
            await lock.release()

        await pair()  # the pool's first connection
        return await _timed_async(seconds, pair)
    finally:
        await client.close()


def _sync_client_pairs(url: str, table: str, seconds: float) -> float:
    with dblock.connect(url, table=table, create_schema=False) as client:
        lock = client.lock("bench-sync", ttl=30)
        lock.acquire()
        lock.release()
        start, pairs = time.perf_counter(), 0
        while time.perf_counter() - start < seconds:
            lock.acquire()
            lock.release()
            pairs += 1
        return pairs / (time.perf_counter() - start)


def _measure(fn: Callable[[], float]) -> tuple[float, float]:
    """(pairs/s, CPU µs per pair) of one run of ``fn``."""
    cpu = time.process_time()
    wall = time.perf_counter()
    rate = fn()
    pairs = rate * (time.perf_counter() - wall)
    return rate, (time.process_time() - cpu) / max(pairs, 1) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.async_mysql_drivers")
    parser.add_argument("--mysql-url", default=DEFAULT_URL)
    parser.add_argument("--seconds", type=float, default=3.0, help="per measure and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    url, seconds = args.mysql_url, args.seconds
    table = "bench_drivers_" + uuid.uuid4().hex[:8]
    with dblock.connect(url, table=table):
        pass  # the table, for every measure
    sql = MysqlStatements(None, table)
    cases: dict[str, Callable[[], float]] = {
        "PyMySQL (blocking), raw": lambda: _sync_raw(url, sql, seconds),
        "aiomysql, raw": lambda: asyncio.run(_async_raw("aiomysql", url, sql, seconds)),
        "asyncmy, raw": lambda: asyncio.run(_async_raw("asyncmy", url, sql, seconds)),
        "dblock.connect (PyMySQL)": lambda: _sync_client_pairs(url, table, seconds),
        "connect_async, aiomysql": lambda: asyncio.run(
            _client_pairs("aiomysql", url, table, seconds)
        ),
        "connect_async, asyncmy": lambda: asyncio.run(
            _client_pairs("asyncmy", url, table, seconds)
        ),
    }
    best: dict[str, tuple[float, float]] = {}
    try:
        for round_no in range(args.rounds):
            for name, fn in cases.items():
                rate, cpu = _measure(fn)
                print(f"round {round_no + 1}: {name}: {rate:,.0f} pairs/s", flush=True)
                if name not in best or rate > best[name][0]:
                    best[name] = (rate, cpu)
    finally:
        conn = pymysql.connect(**_plain(url))
        with conn.cursor() as cur:
            for name in (table, f"{table}_meta", f"{table}_holders"):
                cur.execute(f"DROP TABLE IF EXISTS `{name}`")
        conn.close()
    print(f"\nBest of {args.rounds} rounds of {seconds:g} s, uncontended acquire+release pairs:\n")
    print("| driver, path | pairs/s | CPU µs/pair |\n|---|---:|---:|")
    for name, (rate, cpu) in best.items():
        print(f"| {name} | {rate:,.0f} | {cpu:,.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
