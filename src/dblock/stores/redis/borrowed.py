"""A redis.Redis the application holds, in place of a URL (docs/configuration.md, "A client
you already have"): one connection of its pool borrowed per operation and given back, never
closed by dblock; pub/sub connections dblock's own, with the pool's parameters."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import quote

from ..._errors import ConfigurationError
from ..._url import redact
from .._lending import bounded, opened
from . import ENTRY

if TYPE_CHECKING:
    from ..._contract import Store
    from ..._runtime import Runtime


def borrow(
    client: Any, schema: str | None, table: str, asked: int | None, runtime: Runtime | None
) -> Store:
    import redis

    from .store import RedisStore

    pool = client.connection_pool
    if type(pool) not in (redis.ConnectionPool, redis.BlockingConnectionPool) or not issubclass(
        pool.connection_class, redis.Connection
    ):
        raise TypeError(
            f"a redis.Redis on a {type(pool).__name__} of {pool.connection_class.__name__}s "
            "(Sentinel, a Unix socket) is not supported: pass a redis.Redis on a host and port "
            "(a ConnectionPool or BlockingConnectionPool), or a redis:// URL"
        )
    if getattr(client, "single_connection_client", False) or client.connection is not None:
        raise ConfigurationError(
            "a redis.Redis(single_connection_client=True) has one connection for its own "
            "commands: pass a redis.Redis on a pool"
        )
    kw = pool.connection_kwargs
    if str(kw.get("protocol", 2)) == "3":
        raise ConfigurationError(
            "dblock reads RESP2 replies and pub/sub messages: pass a redis.Redis with "
            "protocol=2 (the default), or a redis:// URL"
        )
    scheme = "rediss" if issubclass(pool.connection_class, redis.SSLConnection) else "redis"
    user = quote(kw.get("username") or "", safe="")
    secret = kw.get("password")
    netloc = f"{user}:{quote(secret, safe='')}@" if secret else (f"{user}@" if user else "")
    raw = f"{scheme}://{netloc}{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/"
    raw += str(kw.get("db", 0))
    url = bounded(ENTRY.parse(raw, ENTRY.name, redact(raw)), asked, pool.max_connections)
    store = opened(RedisLending, RedisStore, url, schema, table, runtime=runtime)
    store.lend_from(pool)
    return cast("Store", store)


class RedisLending:
    """Statement connections borrowed from a redis.Redis's pool, one per operation; pub/sub
    connections of dblock's own, with the pool's parameters (decoding, RESP2, no retries)."""

    _options: dict[str, Any]

    def lend_from(self, pool: Any) -> None:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self._lent = pool
        # the pool's own state (RESP3-only push handlers, client-side caches) stays with it
        own = {
            k: v
            for k, v in pool.connection_kwargs.items()
            if not k.startswith(("maint_notifications", "orig_", "cache"))
        }
        own.update(decode_responses=True, protocol=2)
        own["retry"] = Retry(NoBackoff(), 0)  # dblock's policy is the only one (store.py)
        own["client_name"] = self._options["client_name"]
        self._own_pool = redis.ConnectionPool(connection_class=pool.connection_class, **own)

    def _connect(self) -> Any:
        import redis

        # the user's pool lends one connection to this client; its close() gives it back
        return redis.Redis(connection_pool=self._lent, single_connection_client=True)

    def _checkin(self, conn: Any) -> None:
        # given back after each operation (dblock keeps none of the application's idle)
        with contextlib.suppress(Exception):
            conn.close()
        self._forget(1)  # type: ignore[attr-defined]

    def _close_connection(self, conn: Any) -> None:
        # a failed one is dropped: an aborted script's reply must never reach the
        # application's next command
        with contextlib.suppress(Exception):
            if conn.connection is not None:
                conn.connection.disconnect()
        with contextlib.suppress(Exception):
            conn.close()

    def _pubsub(self) -> Any:
        import redis

        return redis.Redis(connection_pool=self._own_pool).pubsub()  # type: ignore[no-untyped-call]

    def close(self) -> None:
        super().close()  # type: ignore[misc]
        with contextlib.suppress(Exception):
            self._own_pool.disconnect()
