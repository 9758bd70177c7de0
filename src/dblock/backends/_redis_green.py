"""redis-py's asyncio client, seen by the Redis store's code as a blocking one.

The async client runs the store's code in a greenlet (:mod:`dblock._green`); each call here
awaits the ``redis.asyncio`` coroutine on the event loop. Only what the store uses is offered:
what redis-py's ``Script`` calls (``evalsha``, ``script_load``), ``scan``, ``hsetnx``,
``exists``, ``client_id``, ``close``; and a pub/sub connection for the listener.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from .._green import await_


def _options(options: dict[str, Any]) -> dict[str, Any]:
    # redis.asyncio takes its own Retry; dblock's retry policy stays the only one
    return {**options, "retry": Retry(NoBackoff(), 0)}


class GreenPubSub:
    __slots__ = ("_client", "_pubsub")

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self._client = client
        self._pubsub = client.pubsub()

    def subscribe(self, *channels: str) -> None:
        await_(self._pubsub.subscribe(*channels))

    def get_message(self, timeout: float) -> dict[str, Any] | None:
        message: dict[str, Any] | None = await_(self._pubsub.get_message(timeout=timeout))
        return message

    def close(self) -> None:
        try:
            await_(self._pubsub.aclose())  # type: ignore[no-untyped-call]
        finally:
            await_(self._client.aclose())


class GreenRedis:
    __slots__ = ("_client",)

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self._client = client

    @classmethod
    def connect(cls, options: dict[str, Any]) -> GreenRedis:
        client = redis.asyncio.Redis(single_connection_client=True, **_options(options))
        try:
            await_(client.initialize())
            await_(client.ping())
        except BaseException:
            await_(client.aclose())
            raise
        return cls(client)

    @staticmethod
    def pubsub(options: dict[str, Any]) -> GreenPubSub:
        return GreenPubSub(redis.asyncio.Redis(**_options(options)))

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        return await_(self._client.evalsha(sha, numkeys, *keys_and_args))

    def script_load(self, script: str) -> str:
        return str(await_(self._client.script_load(script)))

    def scan(self, cursor: int, match: str, count: int) -> tuple[int, list[str]]:
        cursor, keys = await_(self._client.scan(cursor, match=match, count=count))
        return cursor, [str(k) for k in keys]

    def hsetnx(self, name: str, key: str, value: str) -> int:
        return int(await_(self._client.hsetnx(name, key, value)))

    def exists(self, name: str) -> int:
        return int(await_(self._client.exists(name)))

    def client_id(self) -> int:
        return int(await_(self._client.client_id()))

    def close(self) -> None:
        await_(self._client.aclose())
