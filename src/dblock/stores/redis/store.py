"""Redis backend (redis-py): the store contract as one Lua function per operation.

Every operation is one ``FCALL`` of a function of dblock's library (loaded by the first call
that finds it missing), or where the server has no functions or the user may not use them,
one ``EVALSHA`` of the same code as a script (redis-py's ``register_script``: loaded once per
server, called by its SHA1); atomic on the server, with time read by ``TIME`` inside it:
leases are measured by Redis, never by the client's clock. The scripts and the
keys they keep are in :mod:`dblock.stores.redis.scripts`; a table's keys share the prefix
``dblock:{<table>}:``, so two tables (two applications) on one Redis do not collide, and
``list``/``purge`` walk that prefix with ``SCAN`` (never ``KEYS``).

Fencing tokens are the larger of the table's last token + 1 and the server's clock in
microseconds, so they keep increasing across a restart of a Redis that keeps nothing on disk
(see scripts.py for what breaks it). What such a restart does lose is every hold: its
holders learn of it at their next renewal (``on_lost``).

Releases hand the lock to the head of the key's wait queue and PUBLISH it on the channel its
queue entry names: a waiting thread's own pub/sub connection (:mod:`.waiter`), or its
client's listener (one pub/sub connection per client, :mod:`._listener`), which wakes it; other
releases PUBLISH on the table's channel. A waiter whose connection was lost is woken to look
again, and polls until one is back.

Connections: a pool of ``max_connections`` (one statement each at a time), the retry policy
and deadlines of :class:`~dblock.stores._pool.PooledStore`. The async client runs each
operation on a worker thread with redis-py's blocking connections (``asyncio_io =
"threads"``; why not ``redis.asyncio``: docs/stores/redis.md), and the listener on a thread of
its own, as the blocking client does.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import secrets
import socket
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.commands.core import Script
from redis.exceptions import NoPermissionError, NoScriptError
from redis.retry import Retry

from ... import _forksafe
from ..._contract import (
    FairManyKeys,
    FairQueue,
    FencedGrants,
    FencedManyGrants,
    LeaderPush,
    LeaderValues,
    Leading,
    LossPush,
    OnceRecords,
    QueueJoin,
    SharedHolds,
    Subscription,
    Wakeups,
)
from ..._errors import ConfigurationError, DBLockError
from ..._runtime import THREADS, Runtime
from ..._types import Kind, LockInfo
from ..._url import MAX_URL_TIMEOUT, DatabaseURL, url_number
from .._listener import Listener, PushedWakeups
from .._pool import MAINTENANCE_DEADLINE, Failure, PooledStore
from .._schema import MissingTable
from .scripts import FUNCTIONS, LIBRARY, SCRIPTS
from .waiter import ListenedMany, OwnChannel, OwnChannels, OwnSubscription

#: how each redis.Redis made here names its library to the server: redis-py 7+ otherwise
#: looks its own version up in the installed packages' metadata for every client it makes
#: (3.5 ms here, twice in a cold `dblock run`); before 7 it did so once, when imported
_DRIVER: dict[str, Any]
try:
    from redis.driver_info import DriverInfo
except ImportError:  # pragma: no cover - redis-py 5 and 6
    _DRIVER = {}
else:
    _DRIVER = {"driver_info": DriverInfo(lib_version=redis.__version__)}

_pack_command: Callable[[tuple[Any, ...]], bytes] | None
try:  # redis[hiredis]: packs a command in C
    from hiredis import pack_command as _pack_command
except ImportError:  # pragma: no cover - redis-py without hiredis
    _pack_command = None

log = logging.getLogger("dblock")

#: keys per list/purge script call (one SCAN page)
SCAN_COUNT = 500
#: the URL's query parameters -> redis-py's names
_PARAMS = {
    "client_name": "client_name",
    "connect_timeout": "socket_connect_timeout",
    "ssl_ca_certs": "ssl_ca_certs",
    "ssl_certfile": "ssl_certfile",
    "ssl_keyfile": "ssl_keyfile",
    "ssl_cert_reqs": "ssl_cert_reqs",
}
_TLS_ONLY = {"ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs"}
_GLOB = re.compile(r"([\\*?\[\]])")


@functools.cache
def _scripts() -> dict[str, Script]:
    """The scripts, registered once per process (the registrar only hashes them: each is
    loaded into a server by its first ``EVALSHA`` there that fails with NOSCRIPT)."""
    registrar = redis.Redis(decode_responses=True, **_DRIVER)
    return {name: registrar.register_script(src) for name, src in SCRIPTS.items()}


Keys = list[str]  # a name for the class whose method `list` shadows the builtin


def _roundtrip(conn: Any, command: tuple[Any, ...]) -> Any:
    """Send ``command`` on ``conn``'s own connection and read its reply: what redis-py's
    ``execute_command`` does, less its per-command layers (retries: dblock has its own;
    response callbacks: a script or function has none), which cost about as much client time
    as the round trip."""
    connection = conn.connection
    encoder = connection.encoder
    if _pack_command is not None and (encoder.encoding, encoder.encoding_errors) == _UTF8:
        # the bytes redis-py would send for these str and int arguments, less its Python
        # pass over every argument (some 7 µs of client time for a 5-key script)
        connection.send_packed_command([_pack_command(command)])
    else:
        connection.send_command(*command)
    return connection.read_response()


def _text(conn: Any, reply: Any) -> Any:
    # an application's redis.Redis (dblock.connect(client)) may leave replies undecoded
    return reply if conn.connection.encoder.decode_responses else _decoded(reply)


def _eval(conn: Any, script: Script, keys: Keys, *args: Any) -> Any:
    """``EVALSHA`` of ``script`` on ``conn``'s own connection; a server that does not have
    the script yet gets it from ``Script``."""
    try:
        reply = _roundtrip(conn, ("EVALSHA", script.sha, len(keys), *keys, *args))
    except NoScriptError:
        reply = script(keys, args, conn)
    return _text(conn, reply)


_UTF8 = ("utf-8", "strict")


def _decoded(reply: Any) -> Any:
    """``reply`` with its bytes as str (the scripts' replies are UTF-8 text)."""
    if isinstance(reply, bytes):
        return reply.decode()
    if isinstance(reply, list):
        return [_decoded(r) for r in reply]
    return reply


def _us(seconds: float) -> int:
    return round(seconds * 1_000_000)


def _when(us: str) -> datetime:
    return datetime.fromtimestamp(int(us) / 1_000_000, tz=timezone.utc)


def _info(key: str, row: list[str]) -> LockInfo:
    owner, token, acquired, expires, kind = row
    kind_value: Kind = kind  # type: ignore[assignment]
    return LockInfo(key, owner, int(token), _when(acquired), _when(expires), kind_value)


def _read_timeout(conn: Any, seconds: float) -> None:
    """Set a connected redis-py connection's read timeout (its socket's, and the parser's
    that a read with a timeout of its own restores)."""
    conn.socket_timeout = seconds
    conn.update_current_socket_timeout(seconds)
    buffer = getattr(getattr(conn, "_parser", None), "_buffer", None)
    if buffer is not None and hasattr(buffer, "socket_timeout"):
        buffer.socket_timeout = seconds


class RedisStore(
    PushedWakeups,
    PooledStore[Any],
    FairQueue,
    SharedHolds,
    OnceRecords,
    Wakeups,
    QueueJoin,
    LossPush,
    FencedManyGrants,
    FencedGrants,
    FairManyKeys,
    LeaderValues,
    LeaderPush,
):
    """Locks in Redis, under the key prefix of one table."""

    name = dialect = "redis"
    #: the async client runs each operation on a worker thread (a cancellation waits for the
    #: script in flight, whose outcome the engine then settles: docs/stores/redis.md)
    asyncio_io = "threads"

    def __init__(self, url: DatabaseURL, schema: str | None, table: str) -> None:
        super().__init__(url, f"{schema}.{table}" if schema else table)
        tls = url.raw.split("://", 1)[0].lower() == "rediss"
        self._options = self._parse(url, tls)
        #: every key of the table starts with it (a hash tag: one cluster slot per table)
        self.prefix = f"dblock:{{{self.table}}}:"
        self.channel = self.prefix + "released"
        self._meta = self.prefix + "meta"
        #: the blocking client's waiting threads' own pub/sub connections (waiter.py)
        self._own: OwnChannels | None = None
        #: owner -> the channel its queue entry names, while it waits on its own connection
        self._waiting_on: dict[str, str] = {}
        #: operations are the functions of one library (scripts.LIBRARY, Redis 7), until the
        #: server says it has none or refuses them: then scripts (EVALSHA)
        self._functions = True

    @staticmethod
    def _parse(url: DatabaseURL, tls: bool) -> dict[str, Any]:
        """redis-py's connection options from the URL; ConfigurationError naming a bad part."""
        database = url.database or "0"
        if not database.isdigit() or not database.isascii():
            raise ConfigurationError(
                f"invalid Redis URL {url.safe!r}: the path must be a database number "
                f"(redis://host:port/0), not {database!r}"
            )
        if not url.host:
            raise ConfigurationError(f"invalid Redis URL {url.safe!r}: it names no host")
        unknown = set(url.query) - set(_PARAMS)
        if not tls:
            unknown |= set(url.query) & _TLS_ONLY
        if unknown:
            raise ConfigurationError(
                f"unknown Redis URL parameter(s) {sorted(unknown)} in {url.safe!r}; supported: "
                "client_name, connect_timeout, max_connections, and for rediss:// ssl_ca_certs, "
                "ssl_certfile, ssl_keyfile, ssl_cert_reqs (required, optional, none)"
            )
        reqs = url.query.get("ssl_cert_reqs", "required")
        if reqs not in ("required", "optional", "none"):
            raise ConfigurationError(
                f"URL parameter ssl_cert_reqs={reqs!r} in {url.safe!r} must be required, "
                "optional or none"
            )
        options: dict[str, Any] = {
            "host": url.host,
            "port": url.port or 6379,
            "db": int(database),
            "username": url.user,
            "password": url.password,
            "socket_connect_timeout": url_number(
                url.query.get("connect_timeout"),
                "connect_timeout",
                5,
                safe=url.safe,
                minimum=0.001,
                maximum=MAX_URL_TIMEOUT,
            ),
            # the watchdog aborts a statement at its deadline; this bounds one it cannot reach
            "socket_timeout": MAINTENANCE_DEADLINE,
            "decode_responses": True,
            # dblock's own retry policy (stores/_pool.py) is the only one: redis-py's would re-send
            # a script whose reply was lost without the operation knowing it
            "retry": Retry(NoBackoff(), 0),
            # this client's connections, as an operator sees them (CLIENT LIST); by default
            # a name of this client's own
            "client_name": url.query.get("client_name") or f"dblock-{secrets.token_hex(4)}",
            **_DRIVER,
        }
        if tls:
            options["ssl"] = True
            options["ssl_cert_reqs"] = reqs
            for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
                if name in url.query:
                    options[name] = url.query[name]
        return options

    # -- connections ----------------------------------------------------------------------
    def _connect(self) -> Any:
        # the handshake's answers (HELLO, CLIENT SETNAME, SELECT) and the ping are read with
        # the connect timeout: a server that accepts and never answers is unreachable within
        # it, not after the statements' bound
        connecting = {**self._options, "socket_timeout": self._options["socket_connect_timeout"]}
        client = redis.Redis(single_connection_client=True, **connecting)
        try:
            client.ping()
            _read_timeout(client.connection, self._options["socket_timeout"])
        except BaseException:
            client.close()
            raise
        return client

    def _pubsub(self) -> Any:
        """A pub/sub connection of its own, for the listener or a waiting thread."""
        return redis.Redis(**self._options).pubsub()  # type: ignore[no-untyped-call]

    # -- waiters that hear their own messages (waiter.py) ---------------------------------
    def _own_connection(self) -> tuple[OwnChannels, OwnChannel] | None:
        """This waiting thread's own pub/sub connection (and the client's ``OwnChannels``);
        None where the waiter hears the listener's messages instead."""
        listener = self._listening()  # holders' loss notices, and the async client's waiters
        if self.offloads:  # the async client's waiters hear the listener's messages
            return None
        with self._listener_lock:
            if self._own is None:
                self._own = OwnChannels(
                    self.rt, self._pubsub, self.channel, listener.channel + ":w"
                )
            channels = self._own
        own = channels.mine()
        return None if own is None else (channels, own)

    def subscribe(self, key: str, owner: str, queue: str | None = None) -> Subscription:
        mine = self._own_connection()
        if mine is None:
            return self._with_listener(lambda listener: listener.subscribe(key, owner))
        channels, own = mine
        self._waiting_on[owner] = own.name

        def done() -> None:
            self._waiting_on.pop(owner, None)

        return OwnSubscription(channels, own, [key], owner, done)

    def subscribe_many(self, keys: Sequence[str], owner: str) -> Subscription | None:
        # its entries name no channel (they are never handed a lock): a release rings it on
        # the table's channel, which its own connection and the listener both hear
        if not keys:
            return None
        mine = self._own_connection()
        if mine is None:
            return self._with_listener(lambda listener: ListenedMany.of(listener, keys, owner))
        return OwnSubscription(*mine, keys, owner)

    def _channel_of(self, owner: str) -> str:
        """The channel ``owner``'s queue entry names: its own connection's, or the listener's."""
        return self._waiting_on.get(owner) or self._own_channel("") or ""

    def close(self) -> None:
        with self._listener_lock:
            channels, self._own = self._own, None
        if channels is not None:
            channels.close()
        super().close()

    def _close_connection(self, conn: Any) -> None:
        with contextlib.suppress(redis.RedisError, OSError):
            conn.close()

    def _refused(self, exc: BaseException) -> str | None:
        if isinstance(exc, redis.AuthenticationError) or (
            isinstance(exc, redis.ResponseError) and str(exc).startswith(("WRONGPASS", "NOAUTH"))
        ):
            return "check the user and password in the URL"
        if isinstance(exc, redis.ResponseError) and "DB index" in str(exc):
            return "check the db number in the URL: the server has fewer databases"
        return None

    def _classify(self, exc: BaseException) -> Failure | None:
        if isinstance(exc, (redis.ConnectionError, redis.TimeoutError, OSError)):
            return Failure.DISCONNECT  # a restart, a CLIENT KILL, a network fault
        if isinstance(exc, redis.ResponseError) and str(exc).startswith(("LOADING", "BUSY")):
            return Failure.TRANSIENT
        if isinstance(exc, redis.RedisError):
            return Failure.FATAL
        return None

    def _abort(self, conn: Any) -> None:
        sock = getattr(getattr(conn, "connection", None), "_sock", None)
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    # -- running scripts --------------------------------------------------------------------
    def _keys(self, key: str) -> list[str]:
        return [self._record(key), f"{self.prefix}h:{key}", self._meta, f"{self.prefix}q:{key}"]

    def _record(self, key: str) -> str:
        """The name of ``key``'s record; as a channel, where its grants and proclaims are
        told to its observers (scripts.py)."""
        return f"{self.prefix}r:{key}"

    def _op(self, conn: Any, name: str, keys: Keys, *args: Any) -> Any:
        """Run operation ``name`` on ``conn``: its function, the library loaded first where
        the server lacks it (a restart, a flush); its script where the server has no functions
        or this user may not call or load them."""
        if self._functions:
            command = ("FCALL", FUNCTIONS[name], len(keys), *keys, *args)
            try:
                return _text(conn, _roundtrip(conn, command))
            except redis.ResponseError as exc:
                if not self._without_function(conn, exc):
                    raise
            if self._functions:  # loaded
                return _text(conn, _roundtrip(conn, command))
        return _eval(conn, _scripts()[name], keys, *args)

    def _without_function(self, conn: Any, exc: redis.ResponseError) -> bool:
        """After an ``FCALL`` failed with ``exc``: True if the function did not run for want
        of it on the server; the library is then loaded, or ``_functions`` is False (scripts
        from now on). False for any other error: the function's own, which ran."""
        text = str(exc).lower()
        if text.startswith("function not found"):
            try:
                conn.execute_command("FUNCTION", "LOAD", "REPLACE", LIBRARY)
            except redis.ResponseError as refused:
                log.info("dblock: cannot load its functions into Redis (%s); scripts run", refused)
                self._functions = False
            return True
        if "fcall" in text and ("unknown command" in text or isinstance(exc, NoPermissionError)):
            # a server before 7.0 (or one without functions), or a user who may not call them
            self._functions = False
            return True
        return False

    def _call(self, what: str, script: str, key: str, *args: Any) -> Any:
        """Run one operation on ``key`` (with the retry policy); its reply."""
        keys = self._keys(key)
        channel = self.channel
        return self.run(
            what, lambda conn: self._op(conn, script, keys, key, channel, *args), key=key
        )

    def _retried(self, what: str, script: str, key: str, *args: Any) -> bool:
        """Run an operation that ends a hold: a retry after a lost reply says so (it then
        counts the hold ended by the first attempt as ended by us)."""
        keys = self._keys(key)
        calls = 0

        def op(conn: Any) -> bool:
            nonlocal calls
            calls += 1
            return bool(self._op(conn, script, keys, key, self.channel, *args, int(calls > 1)))

        return self.run(what, op, key=key)

    @staticmethod
    def _token(reply: Any) -> int | None:
        return None if reply is None else int(reply)

    # -- schema (a marker: Redis has no tables) ------------------------------------------------
    def ensure_schema(self, create: bool) -> None:
        def op(conn: Any) -> None:
            if create:
                conn.hsetnx(self._meta, "schema", "1")
            elif not conn.exists(self._meta):
                raise MissingTable(
                    f"the lock table {self.table} does not exist in {self.safe_url}; it is "
                    "created by connect(create_schema=True) and by the dblock commands that "
                    "take locks (run, once); Redis has no `dblock schema` to apply"
                )

        self.run("creating the lock table", op)

    # -- Store ------------------------------------------------------------------------------
    def acquire(self, key: str, owner: str, ttl: float, kind: str) -> int | None:
        return self._token(self._call("acquire", "acquire", key, owner, _us(ttl), kind))

    def renew(self, key: str, owner: str, token: int, ttl: float) -> bool:
        return bool(self._call("renew", "renew", key, owner, token, _us(ttl)))

    def release(self, key: str, owner: str, token: int) -> bool:
        return self._retried("release", "release", key, owner, token)

    def info(self, key: str) -> LockInfo | None:
        row = self._call("info", "info", key)
        return None if row is None else _info(key, row)

    def list_holds(self, prefix: str) -> list[LockInfo]:
        start = len(self.prefix) + 2

        def batch(conn: Any, keys: Keys) -> Any:
            flat = self._op(conn, "list", [*keys, *(f"{self.prefix}h:{k[start:]}" for k in keys)])
            rows = [flat[i : i + 6] for i in range(0, len(flat), 6)]
            return [_info(keys[int(r[0]) - 1][start:], r[1:]) for r in rows]

        found = self._scan("list", "r:", prefix, batch)
        return sorted(found, key=lambda i: (i.key, i.acquired_at))

    def force_release(self, key: str) -> bool:
        return bool(self._call("force_release", "force_release", key))

    def purge(self, older_than: float, include_once: bool) -> int:
        start = len(self.prefix) + 2
        older = _us(older_than)

        def records(conn: Any, keys: Keys) -> Any:
            holders = [f"{self.prefix}h:{k[start:]}" for k in keys]
            return [
                int(self._op(conn, "purge_records", [*keys, *holders], older, int(include_once)))
            ]

        def holders(conn: Any, keys: Keys) -> Any:
            queues = [f"{self.prefix}q:{k[start:]}" for k in keys]
            return [int(self._op(conn, "purge_holders", [*keys, *queues], older))]

        def queues(conn: Any, keys: Keys) -> Any:
            holders = [f"{self.prefix}h:{k[start:]}" for k in keys]
            return [int(self._op(conn, "purge_queues", [*keys, *holders]))]

        found = self._scan("purge", "r:", "", records) + self._scan("purge", "h:", "", holders)
        self._scan("purge", "q:", "", queues)  # members whose entries went with their hash
        return int(sum(found))

    def _scan(self, what: str, kind: str, prefix: str, batch: Callable[[Any, Keys], Any]) -> Any:
        """``batch`` over every page of this table's keys of ``kind`` whose lock key starts
        with ``prefix`` (SCAN: the server is never blocked by a walk of the whole keyspace)."""
        match = _GLOB.sub(r"\\\1", f"{self.prefix}{kind}{prefix}") + "*"

        def op(conn: Any) -> Any:
            found: Any = []
            seen: set[str] = set()
            cursor = 0
            while True:
                cursor, keys = conn.scan(cursor, match=match, count=SCAN_COUNT)
                keys = _decoded(keys)  # bytes from an application's client (see _text)
                fresh = [k for k in keys if k not in seen]  # SCAN may return a key twice
                seen.update(fresh)
                if fresh:
                    found.extend(batch(conn, fresh))
                if int(cursor) == 0:
                    return found

        return self.run(what, op, deadline=MAINTENANCE_DEADLINE)

    # -- FairQueue --------------------------------------------------------------------------
    def acquire_fair(self, key: str, owner: str, ttl: float, queued: bool) -> int | None:
        reply = self._call("acquire", "acquire_fair", key, owner, _us(ttl), int(queued))
        return self._token(reply)

    def probe(self, key: str, owner: str) -> tuple[bool, int]:
        free, ahead = self._call("probe", "probe", key, owner)
        return bool(free), int(ahead)

    def enqueue(
        self, key: str, owner: str, kind: str, ttl: float, lease: float | None = None
    ) -> None:
        lease_us = "-" if lease is None else _us(lease)
        self._call(
            "queueing", "enqueue", key, owner, kind, _us(ttl), lease_us, self._channel_of(owner)
        )

    def requeue(self, key: str, owner: str, kind: str, ttl: float) -> bool:
        return bool(self._call("queueing", "requeue", key, owner, _us(ttl)))

    def dequeue(self, key: str, owner: str) -> None:
        self._call("leaving the queue", "dequeue", key, owner)

    # -- QueueJoin --------------------------------------------------------------------------
    def acquire_or_enqueue(self, key: str, owner: str, ttl: float, queue_ttl: float) -> int | None:
        reply = self._call(
            "acquire",
            "acquire_or_enqueue",
            key,
            owner,
            _us(ttl),
            _us(queue_ttl),
            self._channel_of(owner),
        )
        return self._token(reply)

    # -- SharedHolds ------------------------------------------------------------------------
    def acquire_shared(
        self, key: str, owner: str, ttl: float, kind: str, permits: int | None
    ) -> int | None:
        count = "-" if permits is None else permits
        reply = self._call("acquire", "acquire_shared", key, owner, _us(ttl), kind, count)
        return self._token(reply)

    def release_shared(self, key: str, owner: str, token: int) -> bool:
        return self._retried("release", "release_shared", key, owner, token)

    def renew_shared(self, key: str, owner: str, token: int, ttl: float) -> bool:
        return bool(self._call("renew", "renew_shared", key, owner, token, _us(ttl)))

    def acquire_write(self, key: str, owner: str, ttl: float) -> int | None:
        return self._token(self._call("acquire", "acquire_write", key, owner, _us(ttl)))

    # -- FencedGrants -----------------------------------------------------------------------
    def identity(self) -> str | None:
        # the server process's run_id (whatever address or client name reached it) and the
        # database number
        def op(conn: Any) -> str:
            return f"redis {conn.info('server')['run_id']} {self._options['db']}"

        try:
            return self.run("reading the server's identity", op)
        except (DBLockError, KeyError):
            return None

    def fence(self, key: str) -> int:
        return int(self._call("reading the fence", "fence", key))

    def grant_fenced(self, key: str, owner: str, ttl: float, token: int, kind: str) -> bool:
        return bool(self._call("acquire", "grant_fenced", key, owner, _us(ttl), kind, token))

    def release_owned(self, key: str, owner: str) -> bool:
        return bool(self._call("release", "release_owned", key, owner))

    # -- FencedManyGrants: one *_many script each (the KEYS and ARGV of ManyKeys' below) ----
    def fence_many(self, keys: Sequence[str]) -> dict[str, int]:
        if not keys:
            return {}
        reply = self._many("reading the fence", "fence_many", keys, "", 0)
        return {key: int(fence) for key, fence in zip(keys, reply, strict=True)}

    def grant_fenced_many(self, tokens: Mapping[str, int], owner: str, ttl: float) -> bool:
        if not tokens:
            return True
        keys = list(tokens)
        reply = self._many("acquire", "grant_fenced_many", keys, owner, _us(ttl), *tokens.values())
        return bool(reply)

    def release_owned_many(self, keys: Sequence[str], owner: str) -> bool:
        if not keys:
            return False
        return bool(self._many("release", "release_owned_many", keys, owner, 0))

    # -- ManyKeys -------------------------------------------------------------------------
    #: a script blocks every other client of the server while it runs: 64 keys keep that
    #: pause under a millisecond (0.45 ms per script measured: docs/stores/redis.md)
    max_keys = 64

    def _many(
        self, what: str, script: str, keys: Sequence[str], owner: str, arg: Any, *tokens: int
    ) -> Any:
        """Run a ``*_many`` operation over ``keys`` with the retry policy (one call); its
        reply. ``arg`` None: the script is told whether this run is a retry (a release)."""
        if len(keys) > self.max_keys:
            raise ValueError(
                f"{len(keys)} keys in one step: the Redis store takes at most {self.max_keys}"
            )
        p = self.prefix
        names = [n for k in keys for n in (f"{p}r:{k}", f"{p}h:{k}", f"{p}q:{k}")]
        names.append(self._meta)
        calls = 0

        def op(conn: Any) -> Any:
            nonlocal calls
            calls += 1
            fourth = int(calls > 1) if arg is None else arg
            return self._op(conn, script, names, "", self.channel, owner, fourth, *keys, *tokens)

        return self.run(what, op, key=keys[0])

    def acquire_many(self, keys: Sequence[str], owner: str, ttl: float) -> dict[str, int] | None:
        return self._take_many("acquire_many", keys, owner, ttl)

    def _take_many(
        self, script: str, keys: Sequence[str], owner: str, ttl: float
    ) -> dict[str, int] | None:
        if not keys:
            return {}
        reply = self._many("acquire", script, keys, owner, _us(ttl))
        if reply is None:
            return None
        return dict(zip(keys, reply, strict=True))

    def renew_many(self, tokens: Mapping[str, int], owner: str, ttl: float) -> bool:
        if not tokens:
            return True
        reply = self._many("renew", "renew_many", list(tokens), owner, _us(ttl), *tokens.values())
        return bool(reply)

    def release_many(self, tokens: Mapping[str, int], owner: str) -> bool:
        if not tokens:
            return True
        reply = self._many("release", "release_many", list(tokens), owner, None, *tokens.values())
        return bool(reply)

    # -- FairManyKeys (the order of the entries: scripts.py, `arrival`) ------------------------
    def enqueue_many(self, keys: Sequence[str], owner: str, ttl: float) -> None:
        if keys:
            self._many("queueing", "enqueue_many", keys, owner, _us(ttl))

    def requeue_many(self, keys: Sequence[str], owner: str, ttl: float) -> bool:
        return not keys or bool(self._many("queueing", "requeue_many", keys, owner, _us(ttl)))

    def dequeue_many(self, keys: Sequence[str], owner: str) -> None:
        if keys:
            self._many("leaving the queue", "dequeue_many", keys, owner, "")

    def acquire_many_in_turn(
        self, keys: Sequence[str], owner: str, ttl: float
    ) -> dict[str, int] | None:
        return self._take_many("acquire_many_in_turn", keys, owner, ttl)

    # -- OnceRecords ------------------------------------------------------------------------
    def claim_once(self, key: str, owner: str, ttl: float, note: str | None) -> int | None:
        reply = self._call(
            "once", "claim_once", key, owner, _us(ttl), int(note is not None), note or ""
        )
        return self._token(reply)

    def once_state(self, key: str) -> tuple[str, str | None, bool] | None:
        row = self._call("state", "once_state", key)
        if row is None:
            return None
        kind, has_state, state, live = row
        return kind, state if int(has_state) else None, bool(int(live))

    def finish_once(self, key: str, owner: str, token: int, state: str) -> bool:
        return self._retried("recording the once outcome", "finish_once", key, owner, token, state)

    def finish_scheduled(self, key: str, owner: str, token: int, at_least: float) -> bool:
        return self._retried("release", "finish_scheduled", key, owner, token, _us(at_least))

    # -- LeaderValues: the value is a field of the key's record (scripts.py) ---------------
    def proclaim(self, key: str, owner: str, token: int, value: str | None) -> bool:
        flagged = "-" if value is None else "=" + value
        return bool(self._call("proclaiming", "proclaim", key, owner, token, flagged))

    def leader(self, key: str) -> Leading | None:
        row = self._call("reading the leader", "leader", key)
        if row is None:
            return None
        info = _info(key, row[:5])
        tag, _, flagged = row[5].partition(" ")
        if tag != row[1] or not flagged:  # none, or an earlier hold's
            return Leading(info, False, None)
        return Leading(info, True, None if flagged == "-" else flagged[1:])

    # -- Wakeups, LossPush, LeaderPush (subscribe, watch, watch_leader, joining, close:
    # PushedWakeups) -----------------------------------------------------------------------
    def _new_listener(self) -> Listener:
        return RedisListener(self)


class RedisListener(Listener):
    """The client's pub/sub connection: the table's channel and its own, and the channels
    of the keys it has observers of (their records' names: scripts.py), subscribed while
    it has them."""

    def __init__(self, backend: RedisStore) -> None:
        self._backend = backend
        #: pub/sub connections made, for tests: a reconnect makes another
        self.connections = 0
        #: the connection listening now (None between connections; set and cleared under
        #: ``_subscribing``, never while closed: ``_interrupt`` writes to it)
        self._pubsub: Any = None
        #: an observed key's channel -> the event its subscription's confirmation sets
        self._confirming: dict[str, Any] = {}
        #: orders a key's subscribe and unsubscribe (an observer that comes as the last one
        #: leaves must not be unsubscribed), and the connection's setting and clearing
        self._subscribing = _forksafe.lock()
        super().__init__(backend.rt, f"{backend.prefix}c:{secrets.token_hex(8)}")

    def _observed(self, key: str) -> None:
        """Subscribe to the key's channel, and wait (briefly) for the server to confirm it:
        a grant after that is heard. Made on the listener's thread when it (re)connects."""
        channel = self._backend._record(key)
        confirmed = self.rt.event()
        with self._lock:
            self._confirming[channel] = confirmed
        with self._subscribing:
            pubsub = self._pubsub
            if pubsub is not None:
                with contextlib.suppress(Exception):  # lost: the reconnect subscribes it
                    pubsub.subscribe(channel)
        confirmed.wait(2.0)
        with self._lock:
            self._confirming.pop(channel, None)

    def _unobserved(self, key: str) -> None:
        with self._subscribing:
            pubsub = self._pubsub
            if pubsub is not None and key not in self._leaders:
                with contextlib.suppress(Exception):
                    pubsub.unsubscribe(self._backend._record(key))

    def _observed_channels(self) -> list[str]:
        """The channels of the keys observed now."""
        with self._lock:
            return [self._backend._record(key) for key in self._leaders]

    def _runs_on(self) -> Runtime:
        return THREADS  # redis-py blocks: a thread of its own, for the async client too

    def _handle(self, message: dict[str, Any], unconfirmed: set[str]) -> bool:
        """One message of the pub/sub connection; True once its table's and own channel's
        subscriptions (``unconfirmed`` until then) are confirmed: it is listening."""
        channel = message["channel"]
        if message["type"] == "subscribe":
            with self._lock:
                confirming = self._confirming.get(channel)
            if confirming is not None:
                confirming.set()
            if channel not in unconfirmed:
                return False
            unconfirmed.discard(channel)
            if unconfirmed:
                return False
            self._ready.set()
            self._wake(None)  # anything released while we were away
            return True
        if message["type"] != "message":
            return False
        if channel in (self._backend.channel, self.channel):
            self._heard(message["data"])
        else:  # an observed key's grant or proclaim: on its record's name
            self._tell_observers(channel[len(self._backend.prefix) + 2 :])
        return False

    def _run(self) -> None:
        pause = 0.1
        while not self._stopped.is_set():
            pubsub = None
            try:
                pubsub = self._backend._pubsub()
                self.connections += 1
                unconfirmed = {self._backend.channel, self.channel}
                pubsub.subscribe(*unconfirmed, *self._observed_channels())
                with self._subscribing:
                    self._pubsub = pubsub
                while not self._stopped.is_set():
                    message = pubsub.get_message(timeout=0.5)
                    if message is not None and self._handle(message, unconfirmed):
                        pause = 0.1
                    if self._idle_out():
                        break
            except Exception as exc:  # noqa: BLE001 - any failure: reconnect, never stop
                self._ready.clear()
                if not self._stopped.is_set():
                    log.debug("dblock listener reconnecting after: %s", exc)
                    self._wake(None)  # waiters look again, and poll until we are back
                    self._stopped.wait(pause)
                    pause = min(pause * 2, 5.0)
            finally:
                with self._subscribing:
                    self._pubsub = None
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        pubsub.close()

    def _interrupt(self) -> None:
        # its reply ends the wait for a message; _run, stopped, ends (a PING on a connection
        # another thread reads is redis-py's own use: a subscription's commands are sent so)
        with self._subscribing:
            if self._pubsub is not None:
                with contextlib.suppress(Exception):
                    self._pubsub.ping()
