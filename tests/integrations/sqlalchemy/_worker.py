"""A process contending through its own SQLAlchemy engine:
``python -m tests.integrations.sqlalchemy._worker ENGINE_URL TABLE ROUNDS COUNTER LOG sync|async``.

Each round increments the COUNTER file (a non-atomic read-modify-write) under the lock and
appends its fencing token to LOG; prints the engine pool's checkout count (or "async")."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import sqlalchemy as sa

import dblock
from tests.integrations.sqlalchemy._engines import Checkouts


def _critical(counter: Path, log: Path, token: int) -> None:
    value = int(counter.read_text() or 0)
    time.sleep(0.002)  # widen the race window
    counter.write_text(str(value + 1))
    with log.open("a") as out:
        out.write(f"{token}\n")


def run_sync(url: str, table: str, rounds: int, counter: Path, log: Path) -> None:
    engine = sa.create_engine(url)
    checkouts = Checkouts(engine)
    with dblock.connect(engine, table=table) as client:
        for _ in range(rounds):
            with client.lock("counter", ttl=30, timeout=60) as lock:
                _critical(counter, log, lock.token)
    engine.dispose()
    print(checkouts.count)


async def run_async(url: str, table: str, rounds: int, counter: Path, log: Path) -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(url)
    async with await dblock.connect_async(engine, table=table) as client:
        for _ in range(rounds):
            async with client.lock("counter", ttl=30, timeout=60) as lock:
                _critical(counter, log, lock.token)
    await engine.dispose()
    print("async")


if __name__ == "__main__":
    url, table, rounds, counter, log, mode = sys.argv[1:]
    if mode == "async":
        asyncio.run(run_async(url, table, int(rounds), Path(counter), Path(log)))
    else:
        run_sync(url, table, int(rounds), Path(counter), Path(log))
