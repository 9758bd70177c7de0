"""connect_async on Redis: refused, with a message that says what to use instead, until the
store's asyncio path (redis.asyncio behind _redis_green.py) passes the async client's
cancellation tests (tests/contract/test_async_cancellation.py)."""

from __future__ import annotations

import asyncio

import pytest

import dblock

pytest.importorskip("greenlet")


def test_connect_async_refuses_redis_and_names_the_blocking_client(url: str, table: str) -> None:
    async def main() -> None:
        await dblock.connect_async(url, table=table)

    with pytest.raises(dblock.ConfigurationError, match=r"dblock\.connect"):
        asyncio.run(main())
