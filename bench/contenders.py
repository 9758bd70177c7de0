"""One adapter per contender: dblock per backend, the raw floors of each driver, and the peers.

An adapter is made inside the worker process that uses it (never shared across a fork) and has
three methods: ``acquire()`` (blocking until the lock is had), ``release()`` and ``close()``.
Drivers and peers are imported only when their adapter is made, so a missing peer makes only
its own contender unavailable.
"""

from __future__ import annotations

import hashlib
import math
import random
import sqlite3
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


class LockAdapter(Protocol):
    def acquire(self) -> None: ...

    def release(self) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Targets:
    """Where the servers are, and the table names used by this run."""

    postgresql: str = "postgresql://postgres@127.0.0.1:5432/test"
    mysql: str = "mysql://root@127.0.0.1:3306/test"
    redis: str = "redis://127.0.0.1:6379/0"
    zookeeper: str = "zookeeper://127.0.0.1:2181/dblock_bench"
    etcd: str = "etcd://127.0.0.1:2379"
    sqlite_dir: str = "."
    table: str = "dblock_bench_locks"
    floor_table: str = "dblock_bench_floor"

    @property
    def sqlite_path(self) -> str:
        return str(Path(self.sqlite_dir) / "bench.sqlite3")

    @property
    def sqlite(self) -> str:
        return "sqlite:///" + self.sqlite_path

    def url(self, backend: str) -> str:
        return str(getattr(self, backend))


Factory = Callable[[Targets, str], LockAdapter]


@dataclass(frozen=True)
class Contender:
    """One line of the tables: a lock implementation on one backend."""

    backend: str  # postgresql | mysql | sqlite | redis | zookeeper | etcd | local
    name: str
    kind: str  # dblock | floor | peer | broken
    factory: Factory
    #: False for the SELECT 1 floors: not a lock, measured in scenario (a) only
    is_lock: bool = True
    note: str = ""

    @property
    def id(self) -> str:
        return f"{self.backend}/{self.name}"


def _backoff_sleeps(base: float = 0.001, cap: float = 0.1) -> Callable[[], float]:
    """Decorrelated jitter, as a hand-written poller would do it."""
    previous = base

    def nxt() -> float:
        nonlocal previous
        previous = min(cap, random.uniform(base, previous * 3))
        return previous

    return nxt


# -- dblock ---------------------------------------------------------------------------------
class DblockAdapter:
    def __init__(self, url: str, table: str, key: str, ttl: float | None = 60.0) -> None:
        import dblock

        self.client = dblock.connect(url, table=table)
        self.lock = self.client.lock(key, ttl=ttl)

    def acquire(self) -> None:
        if not self.lock.acquire():
            raise RuntimeError("dblock acquire returned False without a timeout")

    def release(self) -> None:
        self.lock.release()

    def close(self) -> None:
        self.client.close()


class DblockStatementsByHand:
    """dblock's own acquire and release statements, sent by hand on one of its pooled MySQL
    connections with one cursor: what dblock costs over them is its Python around them."""

    def __init__(self, t: Targets, key: str) -> None:
        import dblock

        self.client = dblock.connect(t.mysql, table=t.table)
        backend: Any = self.client._store
        self.conn = backend._checkout()
        self.cur = self.conn.cursor()
        self.acquire_sqls: tuple[str, ...] = backend.sql.acquire_as_newcomer
        self.release_sql: str = backend.sql.release
        owner = f"by-hand:{uuid.uuid4().hex}"
        self.params = {
            "key": key,
            "kind": "lock",
            "owner": owner,
            "ttl_us": 60_000_000,
            "sname": backend._sessions.name(key),
        }
        self.token = 0

    def acquire(self) -> None:
        for sql in self.acquire_sqls:
            if self.cur.execute(sql, self.params) in (1, 2):
                self.token = int(self.cur.lastrowid)
                return
        raise RuntimeError("the key is held: (a) measures an uncontended key")

    def release(self) -> None:
        self.cur.execute(self.release_sql, {**self.params, "token": self.token})

    def close(self) -> None:
        self.conn.close()
        self.client.close()


def _warmed_client(backend_name: str, t: Targets, key: str, ttl: float | None = None) -> Any:
    """A dblock client of ``t``'s table that took and released one hold of ``key`` first (a
    session hold unless ``ttl``): the key's row exists, so every later grant is one
    statement, and on Redis the server has dblock's functions."""
    import dblock

    client = dblock.connect(t.url(backend_name), table=t.table)
    lock = client.lock(key, ttl=ttl)
    lock.acquire()
    lock.release()
    return client


class DblockSessionByHand:
    """dblock's session grant and release statements (``ttl=None``), sent by hand on a session
    connection that dblock set up, waiting in the server's queue as dblock does: the server's
    share of a session hold (the token, the look for a live lease, the holder's name), without
    dblock's Python. The ceiling of any session lock that keeps those guarantees."""

    def __init__(self, backend_name: str, t: Targets, key: str) -> None:
        self.client = _warmed_client(backend_name, t, key)
        backend: Any = self.client._store
        self.sessions = backend._sessions
        self.sql = backend.sql
        self.conn = self.sessions._open()
        self.mysql = backend_name == "mysql"
        owner = f"by-hand:{uuid.uuid4().hex}"
        if self.mysql:
            name = self.sessions.name(key)
            self.params: dict[str, Any] = {"key": key, "owner": owner, "sname": name, "s": 3600}
        else:
            self.params = {"key": key, "owner": owner, "lt": "0"}

    def acquire(self) -> None:
        if self.mysql:
            from dblock.stores.mysql.session import _granted

            code = _granted(self.conn, self.sql.session_grant, self.params, 1)
        else:
            row = self.conn.execute(self.sql.session_lock_one, self.params).fetchone()
            code = None if row is None or row[1] else row[0]
        if code is None:
            raise RuntimeError("the session grant granted nothing (a lease holds the key?)")

    def release(self) -> None:
        if self.mysql:
            with self.conn.cursor() as cur:
                cur.execute(self.sql.session_release, self.params)
        else:
            self.conn.execute(self.sql.session_release, self.params).fetchone()

    def close(self) -> None:
        self.sessions._close(self.conn)
        self.client.close()


class DblockSessionStoreCalls:
    """A session hold as dblock's store makes it (``acquire_session``, ``release_session``:
    its connection bookkeeping, checks and error handling), without the ``Lock`` and the
    engine above it: between the statements by hand and dblock, what each layer costs."""

    def __init__(self, backend_name: str, t: Targets, key: str) -> None:
        self.client = _warmed_client(backend_name, t, key)
        self.store: Any = self.client._store
        self.key = key
        self.owner = f"store-calls:{uuid.uuid4().hex}"
        self.token: int | None = None

    def acquire(self) -> None:
        self.token = self.store.acquire_session(self.key, self.owner, math.inf)
        if self.token is None:
            raise RuntimeError("the store's session grant granted nothing")

    def release(self) -> None:
        assert self.token is not None
        if not self.store.release_session(self.key, self.owner, self.token):
            raise RuntimeError("the store's session release released nothing")

    def close(self) -> None:
        self.client.close()


def _session_floor(
    floor: type[DblockSessionByHand | DblockSessionStoreCalls], backend: str
) -> Factory:
    def make(t: Targets, key: str) -> LockAdapter:
        return floor(backend, t, key)

    return make


def _dblock_for(backend: str, ttl: float | None = 60.0) -> Factory:
    def make(t: Targets, key: str) -> LockAdapter:
        return DblockAdapter(t.url(backend), t.table, key, ttl)

    return make


# -- floors: SELECT 1 round trips -------------------------------------------------------------
class RoundTrips:
    """Not a lock: ``acquire`` and ``release`` are each zero or one ``SELECT 1`` round trip."""

    def __init__(self, run: Callable[[], object], close: Callable[[], object], trips: int) -> None:
        self._run = run
        self._close = close
        self._trips = trips

    def acquire(self) -> None:
        self._run()

    def release(self) -> None:
        if self._trips == 2:
            self._run()

    def close(self) -> None:
        self._close()


def _pg_connect(url: str) -> Any:
    import psycopg

    return psycopg.connect(url, autocommit=True)


def _my_connect(url: str) -> Any:
    from urllib.parse import urlsplit

    import pymysql

    p = urlsplit(url)
    return pymysql.connect(
        host=p.hostname or "127.0.0.1",
        port=p.port or 3306,
        user=p.username or "root",
        password=p.password or "",
        database=p.path.lstrip("/") or None,
        autocommit=True,
        charset="utf8mb4",
    )


def _sqlite_connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, timeout=30, check_same_thread=False)
    conn.execute("PRAGMA busy_timeout = 30000")
    conn.execute("PRAGMA journal_mode = WAL")
    return conn


def _redis_client(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url)


class Kazoo:
    """A started kazoo client of the URL's servers (its chroot as a path prefix)."""

    def __init__(self, url: str) -> None:
        from urllib.parse import urlsplit

        from kazoo.client import KazooClient

        parts = urlsplit(url)
        self.chroot = parts.path.rstrip("/")
        self.zk = KazooClient(hosts=parts.netloc, timeout=10)
        self.zk.start(timeout=10)

    def close(self) -> None:
        self.zk.stop()
        self.zk.close()


def etcd_client(url: str) -> Any:
    """An etcd client (the driver dblock uses) of the URL's first endpoint."""
    from bench._chaos_db import connect

    return connect(url, autocommit=True)


def _select1(backend: str, trips: int) -> Factory:
    def make(t: Targets, key: str) -> LockAdapter:
        if backend == "etcd":
            e = etcd_client(t.etcd)
            return RoundTrips(lambda: e.get(b"dblock-bench-floor"), e.close, trips)
        if backend == "zookeeper":
            k = Kazoo(t.zookeeper)
            return RoundTrips(lambda: k.zk.exists("/"), k.close, trips)
        if backend == "postgresql":
            conn = _pg_connect(t.postgresql)
            return RoundTrips(lambda: conn.execute("SELECT 1").fetchone(), conn.close, trips)
        if backend == "mysql":
            conn = _my_connect(t.mysql)
            cur = conn.cursor()

            def run() -> object:
                cur.execute("SELECT 1")
                return cur.fetchone()

            return RoundTrips(run, conn.close, trips)
        if backend == "sqlite":
            lite = _sqlite_connect(t.sqlite_path)
            return RoundTrips(lambda: lite.execute("SELECT 1").fetchone(), lite.close, trips)
        r = _redis_client(t.redis)
        return RoundTrips(r.ping, r.close, trips)

    return make


# -- floor: the hand-written durable lock table ----------------------------------------------
def floor_ddl(backend: str, table: str) -> list[str]:
    """The hand-written lock table: key, owner, fencing token, lease end on the server clock."""
    if backend == "postgresql":
        return [
            f'CREATE TABLE IF NOT EXISTS {table} (k text COLLATE "C" PRIMARY KEY, '
            "owner text, token bigint NOT NULL, expires_at timestamptz NOT NULL)"
        ]
    if backend == "mysql":
        return [
            f"CREATE TABLE IF NOT EXISTS {table} (k VARCHAR(255) NOT NULL PRIMARY KEY, "
            "owner VARCHAR(64), token BIGINT NOT NULL, expires_at DATETIME(6) NOT NULL) "
            "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
        ]
    return [
        f"CREATE TABLE IF NOT EXISTS {table} (k TEXT PRIMARY KEY, owner TEXT, "
        "token INTEGER NOT NULL, expires_at REAL NOT NULL) WITHOUT ROWID"
    ]


class FloorTable:
    """One upsert to acquire (insert, or take over an expired row, returning the new token),
    one conditional update to release; each its own autocommitted, durable statement."""

    def __init__(self, backend: str, t: Targets, key: str) -> None:
        self.key = key
        self.owner = ""
        self.sleeps = _backoff_sleeps()
        tb = t.floor_table
        if backend == "postgresql":
            self.conn = _pg_connect(t.postgresql)
            acquire_sql = (
                f"INSERT INTO {tb} AS l (k, owner, token, expires_at) "
                "VALUES (%s, %s, 1, now() + interval '60 seconds') "
                "ON CONFLICT (k) DO UPDATE SET owner = EXCLUDED.owner, token = l.token + 1, "
                "expires_at = EXCLUDED.expires_at WHERE l.expires_at <= now() RETURNING token"
            )
            release_sql = (
                f"UPDATE {tb} SET owner = NULL, expires_at = now() WHERE k = %s AND owner = %s"
            )
            conn = self.conn

            def try_once(owner: str) -> bool:
                return conn.execute(acquire_sql, (key, owner)).fetchone() is not None

            def free(owner: str) -> None:
                conn.execute(release_sql, (key, owner))

        elif backend == "mysql":
            self.conn = _my_connect(t.mysql)
            now = "UTC_TIMESTAMP(6)"
            take = f"expires_at <= {now}"
            # the column the condition tests is assigned last (left-to-right evaluation)
            acquire_sql = (
                f"INSERT INTO {tb} (k, owner, token, expires_at) "
                f"VALUES (%s, %s, 1, {now} + INTERVAL 60 SECOND) ON DUPLICATE KEY UPDATE "
                f"token = IF({take}, token + 1, token), "
                f"owner = IF({take}, VALUES(owner), owner), "
                f"expires_at = IF({take}, VALUES(expires_at), expires_at)"
            )
            release_sql = (
                f"UPDATE {tb} SET owner = NULL, expires_at = {now} WHERE k = %s AND owner = %s"
            )
            cur = self.conn.cursor()

            def try_once(owner: str) -> bool:
                return bool(cur.execute(acquire_sql, (key, owner)) in (1, 2))

            def free(owner: str) -> None:
                cur.execute(release_sql, (key, owner))

        else:
            self.conn = _sqlite_connect(t.sqlite_path)
            now = "((julianday('now') - 2440587.5) * 86400.0)"
            acquire_sql = (
                f"INSERT INTO {tb} AS l (k, owner, token, expires_at) "
                f"VALUES (?, ?, 1, {now} + 60) ON CONFLICT (k) DO UPDATE SET "
                "owner = excluded.owner, token = l.token + 1, expires_at = excluded.expires_at "
                f"WHERE l.expires_at <= {now} RETURNING token"
            )
            release_sql = (
                f"UPDATE {tb} SET owner = NULL, expires_at = {now} WHERE k = ? AND owner = ?"
            )
            lite = self.conn

            def try_once(owner: str) -> bool:
                return lite.execute(acquire_sql, (key, owner)).fetchone() is not None

            def free(owner: str) -> None:
                lite.execute(release_sql, (key, owner))

        self._try = try_once
        self._free = free

    def acquire(self) -> None:
        owner = uuid.uuid4().hex
        sleeps = _backoff_sleeps()
        while not self._try(owner):
            time.sleep(sleeps())
        self.owner = owner

    def release(self) -> None:
        self._free(self.owner)

    def close(self) -> None:
        self.conn.close()


def _floor_table(backend: str) -> Factory:
    return lambda t, key: FloorTable(backend, t, key)


# -- raw server lock queues -------------------------------------------------------------------
def advisory_key(key: str) -> int:
    return int.from_bytes(
        hashlib.sha1(key.encode(), usedforsecurity=False).digest()[:8], "big", signed=True
    )


class PgAdvisory:
    def __init__(self, t: Targets, key: str) -> None:
        self.conn = _pg_connect(t.postgresql)
        self.k = advisory_key(key)

    def acquire(self) -> None:
        self.conn.execute("SELECT pg_advisory_lock(%s)", (self.k,)).fetchone()

    def release(self) -> None:
        self.conn.execute("SELECT pg_advisory_unlock(%s)", (self.k,)).fetchone()

    def close(self) -> None:
        self.conn.close()


class MyGetLock:
    def __init__(self, t: Targets, key: str) -> None:
        self.conn = _my_connect(t.mysql)
        self.cur = self.conn.cursor()
        self.name = key[:64]

    def acquire(self) -> None:
        while True:
            self.cur.execute("SELECT GET_LOCK(%s, 3600)", (self.name,))
            if self.cur.fetchone()[0] == 1:
                return

    def release(self) -> None:
        self.cur.execute("SELECT RELEASE_LOCK(%s)", (self.name,))
        self.cur.fetchone()

    def close(self) -> None:
        self.conn.close()


# -- peers ------------------------------------------------------------------------------------
class ToozAdapter:
    def __init__(self, url: str, key: str, wait: float | None = None) -> None:
        from tooz import coordination

        self.coord = coordination.get_coordinator(url, uuid.uuid4().hex.encode())
        self.coord.start(start_heart=False)
        self.lock = self.coord.get_lock(key.encode())
        self.wait = wait

    def acquire(self) -> None:
        if self.wait is None:
            ok = self.lock.acquire(blocking=True)
        else:
            ok = self.lock.acquire(blocking=True, timeout=self.wait)
        if not ok:
            raise RuntimeError("tooz acquire returned False")

    def release(self) -> None:
        self.lock.release()

    def close(self) -> None:
        self.coord.stop()


def _tooz(backend: str, wait: float | None = None) -> Factory:
    def make(t: Targets, key: str) -> LockAdapter:
        url = t.url(backend)
        if backend == "zookeeper":  # tooz's kazoo driver: kazoo://host:port
            from urllib.parse import urlsplit

            url = "kazoo://" + urlsplit(url).netloc.split(",")[0]
        if backend == "redis":
            url = url.rsplit("/", 1)[0] if url.count("/") > 2 else url
        if backend == "etcd":  # tooz's etcd3gw driver, through etcd's HTTP gateway
            from urllib.parse import urlsplit

            url = "etcd3+http://" + urlsplit(url).netloc.split(",")[0]
        return ToozAdapter(url, key, wait)

    return make


class PalsAdapter:
    def __init__(self, t: Targets, key: str) -> None:
        import pals

        self.locker = pals.Locker("dblock-bench", db_url=t.postgresql)
        self.key = key
        self.lock: Any = None

    def acquire(self) -> None:
        # a pals Lock closes its connection on release: one Lock object per acquisition
        self.lock = self.locker.lock(self.key, acquire_timeout=600_000)
        if not self.lock.acquire():
            raise RuntimeError("pals acquire returned False")

    def release(self) -> None:
        self.lock.release()

    def close(self) -> None:
        self.locker.engine.dispose()


class RedisPyAdapter:
    def __init__(self, t: Targets, key: str) -> None:
        self.r = _redis_client(t.redis)
        self.lock = self.r.lock("bench:" + key, timeout=60, sleep=0.1)

    def acquire(self) -> None:
        if not self.lock.acquire(blocking=True):
            raise RuntimeError("redis-py Lock.acquire returned False")

    def release(self) -> None:
        self.lock.release()

    def close(self) -> None:
        self.r.close()


class RedisLockAdapter:
    """python-redis-lock: waiters block on BLPOP of a signal list (pushed wake-ups)."""

    def __init__(self, t: Targets, key: str) -> None:
        import redis_lock

        self.r = _redis_client(t.redis)
        self.lock = redis_lock.Lock(self.r, "bench:" + key, expire=60)

    def acquire(self) -> None:
        if not self.lock.acquire(blocking=True):
            raise RuntimeError("python-redis-lock acquire returned False")

    def release(self) -> None:
        self.lock.release()

    def close(self) -> None:
        self.r.close()


class SherlockAdapter:
    def __init__(self, t: Targets, key: str) -> None:
        import sherlock

        self.r = _redis_client(t.redis)
        self.lock = sherlock.RedisLock(
            "bench:" + key, client=self.r, expire=60, timeout=600, retry_interval=0.1
        )

    def acquire(self) -> None:
        if not self.lock.acquire(blocking=True):
            raise RuntimeError("sherlock acquire returned False")

    def release(self) -> None:
        self.lock.release()

    def close(self) -> None:
        self.r.close()


class RedisTicketFloor:
    """The fastest fair lock Redis allows, as a floor: a ticket lock with no lease, token or
    crash safety. Acquire draws a ticket (one script) and, unless it is already being served,
    blocks on its own list; release serves the next ticket and pushes to its list (one script).
    Every hand-off goes to the next process in line, as with dblock's queue."""

    _TAKE = (
        "local t = redis.call('INCR', KEYS[1])\n"
        "local s = tonumber(redis.call('GET', KEYS[2]) or '1')\n"
        "if t <= s then return 0 end\n"
        "return t"
    )
    _SERVE = (
        "local s = redis.call('INCR', KEYS[2])\n"
        "if s <= tonumber(redis.call('GET', KEYS[1]) or '0') then\n"
        "  redis.call('RPUSH', ARGV[1] .. s, '1')\n"
        "end\n"
        "return s"
    )

    @staticmethod
    def names(key: str) -> tuple[tuple[str, str], str]:
        """``key``'s (issued, serving) counters and the prefix of its turns' lists."""
        base = f"bench:ticket:{{{key}}}:"
        return (base + "issued", base + "serving"), base + "turn:"

    def __init__(self, t: Targets, key: str) -> None:
        self.r = _redis_client(t.redis)
        self.keys, self.turn = self.names(key)
        # every process of a run sets them up the same way; the first one's stay (the run's
        # key is its own: nothing is left from an earlier run)
        self.r.set(self.keys[0], 0, nx=True, ex=3600)
        self.r.set(self.keys[1], 1, nx=True, ex=3600)
        self.take = self.r.register_script(self._TAKE)
        self.serve = self.r.register_script(self._SERVE)

    def acquire(self) -> None:
        ticket = int(self.take(keys=self.keys))
        if ticket:
            self.r.blpop([self.turn + str(ticket)])

    def release(self) -> None:
        self.serve(keys=self.keys, args=[self.turn])

    def close(self) -> None:
        self.r.close()


#: the lease of the Redis floors that keep dblock's guarantees (dblock's own contender's ttl)
_LEASE = 60.0


class DblockScriptsByHand:
    """dblock's Redis functions sent by hand, as its blocking client sends them (one
    ``FCALL`` per acquire or release, its own packing, no redis-py layers), each process
    waiting on a pub/sub connection of its own for the hand-over that the release sends it:
    the server's share of a dblock hold on Redis (lease on the server's clock, fencing token,
    FIFO queue with leases, hand-over), without dblock's Python. The ceiling of dblock on
    Redis with those guarantees."""

    def __init__(self, t: Targets, key: str) -> None:
        import redis

        from dblock._engine import QUEUE_TTL
        from dblock.stores._listener import parse
        from dblock.stores.redis.scripts import FUNCTIONS
        from dblock.stores.redis.store import _roundtrip

        self.client = _warmed_client("redis", t, key, ttl=_LEASE)  # the library is loaded
        store: Any = self.client._store
        self.keys = store._keys(key)
        self.key, self.channel = key, store.channel
        self.owner = f"scripts-by-hand:{uuid.uuid4().hex}"
        self.own = f"{store.prefix}by-hand:{uuid.uuid4().hex}"
        self.conn = redis.Redis.from_url(t.redis, single_connection_client=True)
        self.roundtrip, self.parse = _roundtrip, parse
        self.lease_us, self.queue_us = round(_LEASE * 1e6), round(QUEUE_TTL * 1e6)
        self.take = FUNCTIONS["acquire_or_enqueue"]
        self.free = FUNCTIONS["release"]
        listening = redis.Redis.from_url(t.redis, decode_responses=True)  # parse reads text
        self.pubsub = listening.pubsub(ignore_subscribe_messages=True)
        self.pubsub.subscribe(self.own)
        while self.pubsub.get_message(timeout=1.0) is None and not self.pubsub.subscribed:
            pass
        self.token = 0

    def _try(self) -> int | None:
        reply = self.roundtrip(
            self.conn,
            (
                "FCALL",
                self.take,
                4,
                *self.keys,
                self.key,
                self.channel,
                self.owner,
                self.lease_us,
                self.queue_us,
                self.own,
            ),
        )
        return None if reply is None else int(reply)

    def acquire(self) -> None:
        token = self._try()
        while token is None:
            message = self.pubsub.get_message(timeout=1.0)
            heard = None if message is None else self.parse(message["data"])
            if heard is not None and heard[2] != self.key:
                continue  # about another key
            if heard is not None and heard[3] is not None and heard[1] == self.owner:
                token = heard[3]  # handed over
            elif heard is None or not heard[1] or heard[1] == self.owner:
                token = self._try()  # rung, or a long silence (or a message it cannot read)
        self.token = token

    def release(self) -> None:
        reply = self.roundtrip(
            self.conn,
            ("FCALL", self.free, 4, *self.keys, self.key, self.channel, self.owner, self.token, 0),
        )
        if not int(reply or 0):
            raise RuntimeError("dblock's release function released nothing")

    def close(self) -> None:
        self.pubsub.close()
        self.conn.close()
        self.client.close()


class DblockRedisStoreCalls:
    """A Redis hold as dblock's store makes it, in the engine's order (a plain try while the
    client has no listener; else ``subscribe`` and ``acquire_or_enqueue``, the subscription's
    wait for its hand-over; ``release``: the pool, the watchdog, the waiter's own connection),
    without the ``Lock`` and the engine above it: between dblock's functions by hand and
    dblock, what each layer costs."""

    def __init__(self, t: Targets, key: str) -> None:
        from dblock._engine import QUEUE_TTL

        self.client = _warmed_client("redis", t, key, ttl=_LEASE)
        self.store: Any = self.client._store
        self.key, self.queue_ttl = key, QUEUE_TTL
        self.token = 0
        self.owner = ""

    def acquire(self) -> None:
        store, key = self.store, self.key
        self.owner = owner = f"store-calls:{uuid.uuid4().hex}"  # one per hold, as dblock's
        if not store.joining():  # as the engine: no listener yet, so a plain try first
            token = store.acquire_fair(key, owner, _LEASE, False)
            if token is not None:
                self.token = token
                return
        sub = store.subscribe(key, owner, "lock")
        try:
            token = store.acquire_or_enqueue(key, owner, _LEASE, self.queue_ttl)
            while token is None:
                sub.wait(1.0)
                if sub.granted is not None:  # handed over
                    token = sub.granted
                else:  # rung, or a long silence: look again (a queued owner stays queued)
                    token = store.acquire_or_enqueue(key, owner, _LEASE, self.queue_ttl)
        finally:
            sub.close()
        self.token = token

    def release(self) -> None:
        if not self.store.release(self.key, self.owner, self.token):
            raise RuntimeError("the store's release released nothing")

    def close(self) -> None:
        self.client.close()


class KazooLockAdapter:
    """kazoo's own Lock recipe: an ephemeral sequential node, each waiter watching its
    predecessor (what Curator's InterProcessMutex does)."""

    def __init__(self, t: Targets, key: str) -> None:
        self.k = Kazoo(t.zookeeper)
        self.lock = self.k.zk.Lock(f"{self.k.chroot}/kazoo_bench/{key}", uuid.uuid4().hex)

    def acquire(self) -> None:
        if not self.lock.acquire(blocking=True):
            raise RuntimeError("kazoo Lock.acquire returned False")

    def release(self) -> None:
        self.lock.release()

    def close(self) -> None:
        self.k.close()


class NoLock:
    """Deliberately broken: a "lock" that does not lock (to prove the exclusion check works)."""

    def __init__(self, t: Targets, key: str) -> None:
        pass

    def acquire(self) -> None:
        pass

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass


# -- the registry -----------------------------------------------------------------------------
BACKENDS = ("postgresql", "mysql", "sqlite", "redis", "zookeeper", "etcd")
#: the round trip each backend's floors are made of
TRIP = {"redis": "PING", "zookeeper": "exists", "etcd": "get"}


def all_contenders() -> list[Contender]:
    c: list[Contender] = []
    for b in BACKENDS:
        c.append(Contender(b, "dblock", "dblock", _dblock_for(b)))
    # issue 28: ttl=None, the server's own lock (PostgreSQL advisory lock, MariaDB GET_LOCK)
    # and a fencing token
    c.append(
        Contender(
            "postgresql",
            "dblock session",
            "dblock",
            _dblock_for("postgresql", None),
            note="ttl=None: pg_advisory_lock",
        )
    )
    c.append(
        Contender(
            "mysql",
            "dblock session",
            "dblock",
            _dblock_for("mysql", None),
            note="ttl=None: GET_LOCK (MariaDB)",
        )
    )
    for b in BACKENDS:
        trip = TRIP.get(b, "SELECT 1")
        c.append(Contender(b, f"floor: {trip} x1", "floor", _select1(b, 1), is_lock=False))
        c.append(Contender(b, f"floor: {trip} x2", "floor", _select1(b, 2), is_lock=False))
    for b in ("postgresql", "mysql", "sqlite"):
        c.append(
            Contender(
                b,
                "floor: lock table",
                "floor",
                _floor_table(b),
                note="hand-written upsert + conditional update, polling 1-100 ms with jitter",
            )
        )
    c.append(
        Contender("postgresql", "pg_advisory_lock", "floor", PgAdvisory, note="raw, psycopg 3")
    )
    c.append(Contender("mysql", "GET_LOCK", "floor", MyGetLock, note="raw, PyMySQL"))
    for b in ("postgresql", "mysql"):
        c.append(
            Contender(
                b,
                "floor: session SQL by hand",
                "floor",
                _session_floor(DblockSessionByHand, b),
                note="dblock's session grant and release statements without its Python",
            )
        )
        c.append(
            Contender(
                b,
                "floor: session store calls",
                "floor",
                _session_floor(DblockSessionStoreCalls, b),
                note="dblock's store calls for a session hold, without its Lock and engine",
            )
        )
    c.append(
        Contender(
            "mysql",
            "floor: dblock's SQL by hand",
            "floor",
            DblockStatementsByHand,
            is_lock=False,
            note="dblock's two statements without its Python",
        )
    )
    c.append(Contender("postgresql", "tooz", "peer", _tooz("postgresql"), note="psycopg2"))
    c.append(
        Contender(
            "postgresql",
            "pals",
            "peer",
            PalsAdapter,
            note="SQLAlchemy 2.1 (its default driver: psycopg 3)",
        )
    )
    c.append(
        Contender("mysql", "tooz", "peer", _tooz("mysql"), note="default: GET_LOCK(n, 0) + retry")
    )
    c.append(
        Contender(
            "mysql", "tooz timeout=600", "peer", _tooz("mysql", 600.0), note="server-side wait"
        )
    )
    c.append(Contender("redis", "tooz", "peer", _tooz("redis"), note="redis-py Lock inside"))
    c.append(Contender("redis", "sherlock", "peer", SherlockAdapter, note="polls every 0.1 s"))
    c.append(Contender("redis", "python-redis-lock", "peer", RedisLockAdapter, note="BLPOP"))
    c.append(Contender("redis", "redis-py Lock", "peer", RedisPyAdapter, note="polls every 0.1 s"))
    c.append(
        Contender(
            "redis",
            "floor: FIFO ticket lock",
            "floor",
            RedisTicketFloor,
            note="no lease, token or crash safety: the ceiling of a fair Redis lock",
        )
    )
    c.append(
        Contender(
            "redis",
            "floor: dblock's scripts by hand",
            "floor",
            DblockScriptsByHand,
            note="dblock's functions and hand-overs without its Python",
        )
    )
    c.append(
        Contender(
            "redis",
            "floor: dblock's store calls",
            "floor",
            DblockRedisStoreCalls,
            note="dblock's store for a hold, without its Lock and engine",
        )
    )
    c.append(Contender("zookeeper", "kazoo Lock", "peer", KazooLockAdapter, note="kazoo recipe"))
    c.append(Contender("zookeeper", "tooz", "peer", _tooz("zookeeper"), note="kazoo Lock inside"))
    c.append(Contender("etcd", "tooz", "peer", _tooz("etcd"), note="etcd3gw (HTTP gateway)"))
    c.append(Contender("local", "broken (no lock)", "broken", NoLock))
    return c


def select(
    backends: list[str] | None, names: list[str] | None, *, include_broken: bool = False
) -> list[Contender]:
    """Contenders on ``backends`` whose name contains one of ``names`` (case-insensitive)."""
    chosen = []
    for c in all_contenders():
        if c.kind == "broken":
            if include_broken or (names and any(n.lower() in c.name for n in names)):
                chosen.append(c)
            continue
        if backends and c.backend not in backends:
            continue
        if names and not any(_matches(n, c) for n in names):
            continue
        chosen.append(c)
    return chosen


def _matches(pattern: str, c: Contender) -> bool:
    p = pattern.lower()
    if p in ("floor", "floors"):
        return c.kind == "floor"
    if p == "peers":
        return c.kind == "peer"
    return p == c.name.lower() or p == c.id.lower() or (p in c.name.lower() and p != "lock")
