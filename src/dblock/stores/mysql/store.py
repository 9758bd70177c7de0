"""MySQL 8 and MariaDB backend (PyMySQL).

The SQL is written for both; where they differ it says so. Time is ``UTC_TIMESTAMP(6)``
(fixed for the duration of a statement, and free of the session time zone and its DST
jumps); columns are ``DATETIME(6)`` holding UTC.

Acquire is one ``UPDATE`` (one round trip) in the common case: the key has a row, whose lease
has expired, and no waiters queued for it lately. Only where that changed nothing is a second
statement sent, an ``INSERT ... ON DUPLICATE KEY UPDATE`` that covers the rest (a key without a
row; for a newcomer, a key whose waiters may all have gone). Neither server can return the row
from these (MySQL 8 has no ``RETURNING``), so the new token travels back in the OK packet's
insert id via ``LAST_INSERT_ID(expr)``, and the affected-rows count tells whether the row was
taken (PyMySQL does not set ``CLIENT_FOUND_ROWS``).

Waiters sleep at the key's doorbell (``doorbell.py``). A holder that waited keeps the bell,
and its release hands the lock to the waiter the bell wakes, in one transaction sent as one
packet (``_build_hand_over``): one durable commit per hand-over.

Fencing tokens are per key; ``purge`` records the highest token it deletes in
``<table>_meta.hwm`` in the same transaction. A new row's token is ``hwm + 1``, read with a
shared lock (a subquery of an INSERT under REPEATABLE READ locks the rows it reads), so it
cannot read a stale ``hwm`` while a purge is deleting that key. On MariaDB every token is also
at least the next value of the table's sequence, which session holds (``ttl=None``:
``GET_LOCK``, see ``session.py``) take theirs from without writing a row; MySQL 8 has no
sequences, and its store withholds session holds (``ttl=None`` is then the kept-alive lease).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, ClassVar, Final

import pymysql
from pymysql.constants import CLIENT, CR

from ..._bounded import remember
from ..._contract import (
    CommitGuards,
    FairManyKeys,
    FairQueue,
    FencedGrants,
    FencedManyGrants,
    LeaderValues,
    OnceRecords,
    QueueView,
    SchemaScript,
    SessionHolds,
    SharedHolds,
    Subscription,
    Wakeups,
    provides,
)
from ..._errors import ConfigurationError, DBLockError
from ..._runtime import THREADS, Runtime
from ..._types import Kind, LockInfo
from ..._url import MAX_URL_TIMEOUT, DatabaseURL, url_number
from .._pool import ABANDONED_CONNECT_TIMEOUT, MAINTENANCE_DEADLINE, ROW_LOCK_WAIT, Failure, Sleeper
from .._schema import HOLDERS, MAIN, META, missing, refuse_foreign
from .._sessions import DelegatedSessionHolds
from .._sql_ops import ManyKeyOperations, many_params
from .doorbell import BELL_IDLE, Bells, KeysLook
from .session import MysqlSessions
from .statements import HANDED as _HANDED
from .statements import MANY_TAKEN_PARTLY, NOPAD_MARIADB, NOPAD_MYSQL, MysqlStatements

log = logging.getLogger("dblock")
# server gone away, lost connection, killed (MariaDB 1927), shutdown, idle disconnect
# (MySQL 4031), commands out of sync after an interrupted read
_DISCONNECT = {2006, 2013, 2055, 1927, 1053, 4031, 2014, 0}
_TRANSIENT = {1213}  # deadlock
_ROW_LOCKED = 1205  # lock wait timeout (innodb_lock_wait_timeout: ROW_LOCK_WAIT)
#: what the server refuses for good at connect: error code -> what to change
_REFUSALS = {
    1044: "check the user's privileges on the database in the URL",  # access denied to db
    1045: "check the user and password in the URL",  # access denied
    1698: "check the user and password in the URL",  # access denied (no such login)
    1049: "check the database name in the URL",  # unknown database
    1251: "check the user's authentication plugin",  # client does not support it
}
_UNKNOWN_THREAD = 1094  # KILL of a session that has already ended
_SESSION_ALIVE = "SELECT 1 FROM information_schema.PROCESSLIST WHERE ID = %s"
#: how long a KILLed session may take to end before dblock goes on without it, seconds
#: (within ABANDONED_WAIT, with the connection that kills it)
_KILL_WAIT = 3.0
#: keys this client remembers having found busy (forgotten all at once beyond this many)
_BUSY_KEYS = 1024
#: a queue mark seen this much longer than a new entry needs is left alone (clock drift,
#: and the time between the look and the entry)
_MARK_MARGIN = 1.0
_INT_PARAMS = {"connect_timeout", "read_timeout", "write_timeout"}
#: seconds to connect, unless the URL says (``?connect_timeout=``)
CONNECT_TIMEOUT = 5
#: a read or write of a statement, unless the URL says (``?read_timeout=``, ``?write_timeout=``)
IO_TIMEOUT = 10
_STR_PARAMS = {"unix_socket", "ssl_ca", "ssl_cert", "ssl_key", "init_command"}

#: the columns that make a table dblock's: the token sequence (MariaDB: a sequence is a table
#: of these columns), the sessions table (who holds each key's session lock)
MYSQL_SEQUENCE: Final = frozenset({"next_not_cached_value", "cache_size"})
SESSIONS: Final = frozenset({"lock_key", "lock_name", "conn", "owner", "token", "acquired_at"})


def check_parameter_names(url: DatabaseURL) -> None:
    """ConfigurationError for a URL parameter PyMySQL does not take, without connecting."""
    connection_kwargs(url, 1)


def connection_kwargs(url: DatabaseURL, connect_timeout: int) -> dict[str, Any]:
    """PyMySQL's arguments for ``url``: where and as whom to connect, utf8mb4, autocommit, and
    the URL's parameters but ``init_command`` (timeouts in whole seconds, ``connect_timeout``
    if the URL gives none). ConfigurationError for a parameter dblock does not accept."""
    unknown = set(url.query) - _INT_PARAMS - _STR_PARAMS
    if unknown:
        raise ConfigurationError(
            f"unknown MySQL URL parameter(s) {sorted(unknown)} in {url.safe!r}; supported: "
            f"{', '.join(sorted(_INT_PARAMS | _STR_PARAMS))}"
        )
    kwargs: dict[str, Any] = {
        "host": url.host or "localhost",
        "port": url.port or 3306,
        "user": url.user or "root",
        "password": url.password or "",
        "database": url.database or None,
        "charset": "utf8mb4",
        "autocommit": True,
        "connect_timeout": connect_timeout,
    }
    for name in _INT_PARAMS & set(url.query):  # whole seconds, as PyMySQL takes them
        kwargs[name] = int(
            url_number(
                url.query[name],
                name,
                0,
                safe=url.safe,
                minimum=1,
                maximum=MAX_URL_TIMEOUT,
                integer=True,
            )
        )
    kwargs.update({k: v for k, v in url.query.items() if k in _STR_PARAMS - {"init_command"}})
    return kwargs


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=timezone.utc)


class _InitCommandFailed(pymysql.err.ProgrammingError):  # type: ignore[misc]
    """The server refused the statement given as the URL's ``init_command``."""


@contextmanager
def user_init_errors(close: Callable[[], None]) -> Iterator[None]:
    """Around the URL's ``init_command`` on a new connection: on an error, ``close()`` it;
    a lost connection is raised as it is (retried like any), the server's refusal as
    _InitCommandFailed (the user's to fix)."""
    try:
        yield
    except pymysql.err.MySQLError as exc:
        close()
        lost = isinstance(exc, pymysql.err.InterfaceError) or (
            isinstance(exc, pymysql.err.OperationalError)
            and exc.args[:1] != ()
            and exc.args[0] in _DISCONNECT
        )
        if lost:
            raise
        raise _InitCommandFailed(*exc.args) from exc


class _Connection(pymysql.connections.Connection):  # type: ignore[misc]
    """A PyMySQL connection that shares the default TLS context of the process.

    PyMySQL 2 offers TLS on every connection ("preferred") and builds a new default context
    for each, loading the system's CA certificates, which costs far more than the rest of
    connecting. That context (no TLS options given) is built once and shared:
    an SSLContext may serve many connections and threads. Contexts for explicit TLS options
    are built as PyMySQL builds them.
    """

    _preferred: ClassVar[Any] = None

    def __init__(self, *, user_init: str | None = None, **kwargs: Any) -> None:
        self._user_init = user_init
        super().__init__(**kwargs)

    def connect(self, sock: Any = None) -> None:
        """Connect within ``connect_timeout``: PyMySQL reads the server's greeting and the
        handshake with the read timeout, which a server that accepts and never answers would
        make the bound; the statements' read and write timeouts apply once connected."""
        reads: float | None = getattr(self, "_read_timeout")  # noqa: B009 - PyMySQL's, untyped
        writes: float | None = getattr(self, "_write_timeout")  # noqa: B009
        self._read_timeout = self._write_timeout = self.connect_timeout
        try:
            self._connect_with_init(sock)
        finally:
            self._read_timeout, self._write_timeout = reads, writes
            if self._sock is not None:
                self._sock.settimeout(reads)
                self._current_timeout = reads

    def _connect_with_init(self, sock: Any) -> None:
        """Connect; run the URL's ``init_command``, if any, before dblock's own (its
        ``init_command`` here), so that a user's statement can add settings but never change
        the ones dblock relies on: REPEATABLE READ (see MysqlStore.__init__), autocommit."""
        if self._user_init is None:
            super().connect(sock)
            return
        own: str | None = getattr(self, "init_command", None)  # PyMySQL's attribute
        setattr(self, "init_command", None)  # noqa: B010 - PyMySQL's untyped attribute
        try:
            super().connect(sock)  # network, TLS, authentication, character set, autocommit
        finally:
            setattr(self, "init_command", own)  # noqa: B010
        with user_init_errors(self._force_close), self.cursor() as cur:
            cur.execute(self._user_init)  # may hold several statements (MULTI_STATEMENTS)
        with self.cursor() as cur:
            if own:
                cur.execute(own)
            cur.execute("SET autocommit = 1")

    def _create_ssl_ctx(self, sslp: Any) -> Any:
        if sslp != {}:
            return super()._create_ssl_ctx(sslp)
        if _Connection._preferred is None:  # a race builds two; one is kept: harmless
            _Connection._preferred = _unverified_context()
        return _Connection._preferred


def _unverified_context() -> ssl.SSLContext:
    """PyMySQL's context without ``ssl_*`` options (TLS if the server offers it, neither the
    certificate nor the host name checked), less the system's CA certificates that PyMySQL
    loads into it and an unverified handshake never reads: 20 ms of each process's start."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


class MysqlStore(
    ManyKeyOperations[Any],
    DelegatedSessionHolds,
    FairQueue,
    SharedHolds,
    OnceRecords,
    Wakeups,
    SessionHolds,
    QueueView,
    FencedManyGrants,
    FencedGrants,
    SchemaScript,
    FairManyKeys,
    CommitGuards,
    LeaderValues,
):
    """Lock table in MySQL 8 or MariaDB 10.5+. Session holds only on MariaDB, once
    ensure_schema has found (or made) the table's token sequence: withheld until then."""

    name = dialect = "mysql"

    @staticmethod
    def _row_info(row: Any) -> LockInfo:
        return _info(row)

    sql: MysqlStatements
    _sessions: MysqlSessions

    #: the async client's connection class (None: PyMySQL's blocking connections)
    _green: Any = None

    def __init__(self, url: DatabaseURL, schema: str | None, table: str) -> None:
        super().__init__(url, f"{schema}.{table}" if schema else table)
        kwargs = connection_kwargs(url, connect_timeout=CONNECT_TIMEOUT)
        # the hand-over release is one transaction sent as one packet (see _hand_over)
        kwargs["client_flag"] = CLIENT.MULTI_RESULTS | CLIENT.MULTI_STATEMENTS
        # INSERT ... SELECT takes shared locks on what it reads only under REPEATABLE READ; a
        # row lock is waited for at most ROW_LOCK_WAIT (whole seconds here), see _pool
        #: the URL's init_command: run before dblock's own (see _Connection.connect)
        self._user_init = url.query.get("init_command") or None
        kwargs["init_command"] = "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ"
        if "innodb_lock_wait_timeout" not in (self._user_init or "").lower():  # else theirs
            kwargs["init_command"] += (
                f"; SET SESSION innodb_lock_wait_timeout = {max(1, round(ROW_LOCK_WAIT))}"
            )
        # a statement's reads and writes are bounded (the watchdog aborts it at its deadline;
        # this bounds one it cannot reach); connecting is bounded by connect_timeout alone
        kwargs.setdefault("read_timeout", max(kwargs["connect_timeout"], IO_TIMEOUT))
        kwargs.setdefault("write_timeout", max(kwargs["connect_timeout"], IO_TIMEOUT))
        self._kwargs = kwargs
        self.sql = MysqlStatements(schema, table)
        self._schema = schema
        self._table_name = table
        self.withheld = frozenset({SessionHolds})
        #: keys whose last try by this client found them busy -> until when (monotonic) their
        #: queue mark was last seen to hold (0: not seen)
        self._busy: dict[str, float] = {}
        # doorbells: a session of their own, which the server closes when left idle (a frozen
        # holder's bell is freed after BELL_IDLE s); they run no statement on the tables
        bell_kwargs = {**kwargs, "init_command": f"SET SESSION wait_timeout = {BELL_IDLE}"}
        # user locks are the server's, not a database's: their names say which table
        scope = self.table if schema else f"{url.database or ''}.{table}"
        self._sessions = MysqlSessions(self, scope)
        self._bells = Bells(
            scope,
            lambda: self._new_connection(bell_kwargs),
            close=self._close_connection,
            watchdog=self._watchdog,
            abort=self._abort,
            max_poll=self.poll_cap,
            read_timeout=kwargs["read_timeout"],
            granted=self.sql.granted,
            idle_kept=self.max_connections,
        )

    # -- connections ----------------------------------------------------------------------
    def use_runtime(self, runtime: Runtime) -> None:
        """The async client's runtime: connections are aiomysql's, awaited on the loop (see
        green.py); its driver missing is said now, not at the first statement."""
        if runtime is not THREADS:
            try:
                from .green import GreenConnection
            except ImportError as exc:
                raise ConfigurationError(
                    f"the async client on MySQL needs its asyncio driver ({exc.name}): "
                    "pip install 'dblock[mysql-async]'"
                ) from exc
            self._green = GreenConnection
        super().use_runtime(runtime)

    def _new_connection(self, kwargs: dict[str, Any]) -> Any:
        """A new connection: PyMySQL's, or under the async client aiomysql's seen as one."""
        if self._green is not None:
            return self._green.connect(
                user_init=self._user_init, init_errors=user_init_errors, **kwargs
            )
        return _Connection(user_init=self._user_init, **kwargs)

    def _session_connection(self, init_command: str) -> Any:
        """A connection for a session hold or waiter: ``init_command`` instead of the pool's,
        and reads without a timeout (a GET_LOCK waits as long as its caller allows; the
        sockets' keepalives and the watchdog bound a dead peer). Writes have none either:
        a statement is a few hundred bytes, and a read and a write timeout that differ cost
        PyMySQL two more system calls per statement, switching the socket between them."""
        conn = self._new_connection({**self._kwargs, "init_command": init_command})
        setattr(conn, "_read_timeout", None)  # noqa: B010 - PyMySQL's, and GreenConnection's
        if self._green is None:
            conn._write_timeout = None
        return conn

    def _socket_of(self, conn: Any) -> Any:
        """The socket of a connection (None if it has none)."""
        if self._green is not None:
            transport = conn._transport()
            return None if transport is None else transport.get_extra_info("socket")
        return getattr(conn, "_sock", None)

    def _connect(self) -> Any:
        try:
            return self._new_connection(self._kwargs)
        except _InitCommandFailed as exc:
            raise ConfigurationError(
                f"the init_command of {self.safe_url} failed: {exc.args[-1] if exc.args else exc}"
            ) from exc

    def _close_connection(self, conn: Any) -> None:
        with contextlib.suppress(Exception):  # a dead connection may fail to close in many ways
            conn.close()

    def _refused(self, exc: BaseException) -> str | None:
        if not isinstance(exc, pymysql.err.Error) or not exc.args:
            return None
        return _REFUSALS.get(exc.args[0]) if isinstance(exc.args[0], int) else None

    def _classify(self, exc: BaseException) -> Failure | None:
        if not isinstance(exc, pymysql.err.Error):
            return None
        code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else 0
        if isinstance(exc, pymysql.err.InterfaceError) or (
            isinstance(exc, pymysql.err.OperationalError) and code in _DISCONNECT
        ):
            return Failure.DISCONNECT
        if code in _TRANSIENT:
            return Failure.TRANSIENT
        if code == _ROW_LOCKED:
            return Failure.ROW_LOCKED
        return Failure.FATAL

    def _read_timed_out(self, exc: BaseException) -> bool:
        # PyMySQL's socket timeout, and GreenConnection's timer, both end the read this way
        return (
            isinstance(exc, pymysql.err.OperationalError)
            and bool(exc.args)
            and exc.args[0] == CR.CR_SERVER_LOST
            and "(timed out)" in str(exc)
        )

    def _interrupted(self, conn: Any) -> None:
        """A statement interrupted (a cancellation, Ctrl-C) may still run in the server, which
        notices a closed client only when it next reads from it: one waiting for a row lock
        would get it and commit a grant nobody knows of. So its session is killed from
        another connection, and gone, before the acquire looks for a grant to undo."""
        session = _server_session(conn)
        if session is None:
            return
        try:
            self.run("ending an interrupted statement", lambda c: self._kill(c, session))
        except DBLockError as exc:
            log.warning("could not end the interrupted statement of session %s: %s", session, exc)

    def _kill(self, conn: Any, session: int, sleep: Callable[[float], None] | None = None) -> None:
        """KILL ``session`` and wait (briefly) until the server has ended it."""
        sleep = self.rt.sleep if sleep is None else sleep
        with conn.cursor() as cur:
            try:
                cur.execute("KILL %s", (session,))
            except pymysql.err.MySQLError as exc:
                if not exc.args or exc.args[0] != _UNKNOWN_THREAD:
                    raise
                return  # already gone
            # a killed statement ends at its next check, within ms; on a loaded server one took
            # over a second, and the row lock it then got let it commit a grant (CI)
            give_up = time.monotonic() + _KILL_WAIT
            while True:
                cur.execute(_SESSION_ALIVE, (session,))
                if cur.fetchone() is None:
                    return
                if time.monotonic() > give_up:
                    log.warning("session %s was killed but has not ended yet", session)
                    return
                sleep(0.01)

    def _end_abandoned(self, conn: Any) -> Callable[[], None] | None:
        session = _server_session(conn)
        if session is None:
            return None
        kwargs = {
            **self._kwargs,
            "connect_timeout": ABANDONED_CONNECT_TIMEOUT,
            "read_timeout": ABANDONED_CONNECT_TIMEOUT,
            "write_timeout": ABANDONED_CONNECT_TIMEOUT,
            "init_command": None,
        }

        def end() -> None:
            side = pymysql.connect(**kwargs)
            try:
                self._kill(side, session, sleep=time.sleep)
            finally:
                side.close()

        return end

    def _abort(self, conn: Any) -> None:
        if self._green is not None:
            conn.abort()
            return
        sock = getattr(conn, "_sock", None)  # PyMySQL keeps its socket here
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _reset(self, conn: Any) -> None:
        conn.rollback()

    # -- schema ---------------------------------------------------------------------------
    def ddl(self) -> list[str]:
        return list(self.sql.ddl)

    def script(self) -> str:
        """A statement with ``;`` inside (a trigger body) is wrapped in ``DELIMITER``, which
        the mariadb/mysql client understands."""
        parts = []
        for raw in self.sql.ddl:
            statement = raw.strip().rstrip(";").rstrip()
            if ";" in statement:
                parts.append(f"DELIMITER //\n{statement} //\nDELIMITER ;\n")
            else:
                parts.append(f"{statement};\n")
        return "\n".join(parts)

    def ensure_schema(self, create: bool) -> None:
        """Check (and with ``create``, make) the tables; on MariaDB also what session holds
        need (the sessions table and the token sequence), made for a table that lacks them
        only with ``create``: without them session holds stay withheld."""
        sql = self.sql
        names = (*sql.table_names, *sql.session_names)
        required = dict(zip(names, (MAIN, META, HOLDERS, SESSIONS, MYSQL_SEQUENCE), strict=True))

        def look(cur: Any) -> tuple[bool, bool, bool]:
            """(MySQL 8, every table there, what session holds need there)"""
            cur.execute(sql.find_tables, (self._schema, *names))
            rows = cur.fetchall()
            if not rows:
                cur.execute(sql.is_mysql8)
            mysql8 = bool(rows[0][2] if rows else cur.fetchone()[0])
            found: dict[str, set[str]] = {}
            ours = {name.lower(): name for name in names}  # lower_case_table_names
            for name, column, _ in rows:
                found.setdefault(ours[name.lower()], set()).update([column] if column else [])
            refuse_foreign(self.table, self.safe_url, found, required)
            tables = all(name in found for name in sql.table_names)
            sessions = not mysql8 and all(name in found for name in sql.session_names)
            return mysql8, tables, sessions

        def op(conn: Any) -> bool | None:
            """True: session holds can be had; False: not in this table; None: MySQL 8."""
            with conn.cursor() as cur:
                mysql8, tables, sessions = look(cur)
                if tables and (sessions or not create):
                    return None if mysql8 else sessions
                if not tables and not create:
                    raise missing(self.table, self.safe_url, self.dialect)
                if mysql8 and tables:
                    return None
                cur.execute(sql.take_ddl_lock, (sql.ddl_lock_name,))
                try:
                    # another process may have made it all while this one waited for the
                    # lock: made again, the sequence (CREATE SEQUENCE IF NOT EXISTS waits for
                    # every statement using it, and holds up every later one) would stall the
                    # grants of all who use the table
                    mysql8, tables, sessions = look(cur)
                    if tables and (sessions or mysql8):
                        return None if mysql8 else sessions
                    for statement in sql.ddl:
                        if statement is not sql.create_sequence_ddl:
                            cur.execute(_for_server(statement, mysql8))
                    if mysql8:
                        return None
                    # above every token the table has: a table made before its sequence
                    cur.execute(sql.sequence_start)
                    cur.execute(sql.create_sequence(int(cur.fetchone()[0])))
                finally:
                    cur.execute(sql.let_go_ddl_lock, (sql.ddl_lock_name,))
                return True

        sessions = self.run("creating the lock table", op, deadline=MAINTENANCE_DEADLINE)
        if sessions:
            self.sql = MysqlStatements(self._schema, self._table_name, sequence=True)
            self.withheld = frozenset()
            return
        why = (
            "MySQL has no sequences"
            if sessions is None
            else "the table has no token sequence (connect with create_schema=True once, or "
            "apply `dblock schema --dialect mysql`)"
        )
        log.info(
            "dblock: no session holds on %s (table %s): %s; ttl=None is a lease kept alive",
            self.safe_url,
            self.table,
            why,
        )

    # -- operations -----------------------------------------------------------------------
    def acquire(self, key: str, owner: str, ttl: float, kind: str) -> int | None:
        return self._take(self.sql.acquire, key, owner, ttl, kind)

    def acquire_fair(self, key: str, owner: str, ttl: float, queued: bool) -> int | None:
        if not queued:
            return self._take_as_newcomer(key, owner, ttl)
        bell = self._bells.ringing(key, owner)
        if bell is not None:
            # Next in line (the server hands the bell to its waiters in order): take the lock
            # at once if the bell was just rung by a release, else only once it is free (or
            # handed to us: a hand-over that committed after the bell's look).
            rung, bell.rung = bell.rung, False
            bell.won = False  # a hand-over the acquire could not use (its lease ran out) is gone
            if not rung:
                # the bell's order decides among waiters ahead of us, but not for a lock_many
                # waiter ahead: it is at no bell, and takes the lock when it finds it free
                free, _, _, mine, behind_many = self._look(key, owner)
                if not (mine or (free and not behind_many)):
                    return None
            # the queue entry goes in the same commit: left to the release, a holder that froze
            # would keep the head of the queue, and its waiters, until the entry's lease ends
            token = self._take(self.sql.acquire, key, owner, ttl, "lock", dequeue=True)
            bell.won = token is not None
            return token
        # InnoDB: for a queued waiter a queue check inside the acquire statement is a locking
        # read under REPEATABLE READ, whose next-key locks on the queue rows stall the other
        # waiters' queue writes at every hand-off. So it is a plain (non-locking) read first,
        # then the ordinary acquire; a newcomer slipping in between is rare and harmless.
        free, ahead, left, mine, _ = self._look(key, owner)
        if mine:
            # handed to us by a release whose news did not reach us (our bell failed, or we
            # were not at it): take it again, with a lease that starts now
            return self._take(self.sql.acquire, key, owner, ttl, "lock", dequeue=True)
        if not free or ahead:
            # a waiter asleep at a bell that nobody may ring (its holder froze or died with
            # it) wakes when this lease ends, not a whole RING_WAIT later
            self._bells.lease_left(key, owner, left)
            return None
        return self._take(self.sql.acquire, key, owner, ttl, "lock", dequeue=queued)

    def _take_as_newcomer(self, key: str, owner: str, ttl: float) -> int | None:
        """One UPDATE where the key is quiet (see _build_statements). Where this client last
        found it busy, a plain read first: the tries, and a waiter's queue mark, lock the key's
        row, which every hand-over holds locked until its commit is on disk, so on a busy key
        they would queue for it behind the hand-over, and ahead of the woken waiter's read."""
        if key in self._busy:
            row = self.run(
                "probe", lambda conn: self._exec(conn, self.sql.busy_look, {"key": key}), key=key
            )[1]
            held, mark_us = row[0] if row else (0, None)
            mark = max(0, int(mark_us or 0)) / 1_000_000
            if held:
                self._note_busy(key, time.monotonic() + mark)
                return None
        token = self._take(self.sql.acquire_as_newcomer, key, owner, ttl, "lock")
        if token is None:
            self._note_busy(key, 0.0)
        else:
            self._busy.pop(key, None)
        return token

    def _note_busy(self, key: str, mark_ends: float) -> None:
        """Remember ``key`` as busy, its queue mark seen to hold until ``mark_ends``."""
        remember(self._busy, key, mark_ends, _BUSY_KEYS)

    def _look(self, key: str, owner: str) -> tuple[bool, int, float, bool, bool]:
        """Read-only: like probe(), the seconds left of the holder's lease (0 if free), whether
        ``owner`` holds it (a release handed it over), and whether a lock_many waiter is
        ahead of ``owner`` in the queue."""
        params = {"key": key, "owner": owner}
        row = self.run("probe", lambda conn: self._exec(conn, self.sql.look, params), key=key)
        free, ahead, left_us, mine, many = row[1][0]
        left = max(0, int(left_us or 0)) / 1_000_000
        return bool(free), int(ahead), left, bool(mine), bool(many)

    def enqueue(
        self, key: str, owner: str, kind: str, ttl: float, lease: float | None = None
    ) -> None:
        """Mark the key's queue busy (first, so the mark outlives the entry), then make or
        refresh ``owner``'s queue entry."""
        bell = self._bells.connection_id(key, owner) if lease is not None else None
        params = {
            "key": key,
            "owner": owner,
            "kind": kind,
            "ttl": ttl,
            "lease": lease,
            "bell": bell,
        }

        # the mark is left alone where this client's look (see _take_as_newcomer) just saw it
        # outlive the new entry; what the look saw serves this entry only (a mark misjudged
        # would let a newcomer pass this waiter: fairness, never exclusion)
        seen = self._busy.get(key)
        marked = seen is not None and seen - time.monotonic() > ttl + 1 + _MARK_MARGIN
        if seen:
            self._busy[key] = 0.0

        def op(conn: Any) -> None:
            if not marked:
                self._exec(conn, self.sql.mark_queued, params)
            self._exec(conn, self.sql.enqueue, params)

        self.run("queueing", op, key=key)

    def requeue(self, key: str, owner: str, kind: str, ttl: float) -> bool:
        """Refresh ``owner``'s queue entry; False if it is gone (handed the lock, or expired)."""
        bell = self._bells.connection_id(key, owner)
        params = {"key": key, "owner": owner, "ttl": ttl, "bell": bell}

        def op(conn: Any) -> bool:
            self._exec(conn, self.sql.mark_queued, params)
            return self._exec(conn, self.sql.requeue, params)[0] == 1

        return self.run("queueing", op, key=key)

    def dequeue(self, key: str, owner: str) -> None:
        """Leave the queue; a lock handed to ``owner`` meanwhile is handed on."""
        params = {"key": key, "owner": owner}

        def op(conn: Any) -> int | None:
            if self._exec(conn, self.sql.dequeue, params)[0]:
                return None
            rows = self._exec(conn, self.sql.handed_to, params)[1]
            return int(rows[0][0]) if rows else None

        token = self.run("leaving the queue", op, key=key)
        if token is not None:
            self._release_lease({**params, "token": token}, hand_over=True)

    def _take(
        self,
        sqls: tuple[str, str],
        key: str,
        owner: str,
        ttl: float,
        kind: str,
        *,
        dequeue: bool = False,
    ) -> int | None:
        def op(conn: Any) -> int | None:
            if not dequeue:
                return self._take_on(conn, sqls, key, owner, ttl, kind=kind)
            with self._transaction(conn):  # take and leave the queue: one commit
                token = self._take_on(conn, sqls, key, owner, ttl, kind=kind)
                if token is not None:
                    self._exec(conn, self.sql.dequeue, {"key": key, "owner": owner})
            return token

        return self.run("acquire", op, key=key)

    def release(self, key: str, owner: str, token: int) -> bool:
        """End the hold. A holder that keeps the key's bell (it waited, so others may wait
        behind it) hands the lock to the waiter the bell wakes, on the bell's connection,
        which lets go of the bell inside that transaction (see _build_hand_over)."""
        params: dict[str, Any] = {"key": key, "owner": owner, "token": token}
        try:
            handed = self._bells.release_holding(
                key, owner, lambda conn: self._hand_over_on(conn, params)
            )
        except Exception:
            # the hand-over failed, which closed its connection (rolling back what it had not
            # committed, and freeing the bell): the plain release, which first checks whether
            # the hand-over committed
            log.debug("dblock: the hand-over on the bell's connection failed", exc_info=True)
            return self._release_lease(params, after_failure=True)
        if handed is None:  # no bell
            return self._release_lease(params)
        return bool(handed)

    def _release_lease(
        self, params: dict[str, Any], *, after_failure: bool = False, hand_over: bool = False
    ) -> bool:
        calls = 0
        token = params["token"]

        def op(conn: Any) -> bool:
            nonlocal calls
            calls += 1
            if calls == 1 and hand_over:
                released = self._hand_over_on(conn, params)
            else:
                released = self._exec(conn, self.sql.release, params)[0]
            if released:
                return True
            # After a failure the first attempt may have committed: released by us is success.
            if calls == 1 and not after_failure:
                return False
            rows = self._exec(conn, self.sql.owner_token, params)[1]
            if not rows:
                return False
            holder, last, note = rows[0]
            return bool((holder is None and last == token) or note == str(token))

        return self.run("release", op, key=params["key"])

    def _hand_over_on(self, conn: Any, params: dict[str, Any]) -> int:
        """Run the hand-over release (key owner token) on ``conn``; 1 if the hold was ended.
        A failure partway leaves the gate held by ``conn``: it is let go of (a connection
        that cannot is closed by the caller, which frees it)."""
        bell = self._bells.name(params["key"])
        try:
            params = {**params, "bell": bell, "slack_us": self._bells.slack_us}
            return _batch(conn, self.sql.release_and_hand_over, params)[_HANDED]
        except Exception:
            with contextlib.suppress(Exception):
                _batch(conn, self.sql.let_go_gate, {"bell": bell})
            raise

    # -- ManyKeys: one statement over every key ------------------------------------------
    # One transaction as in stores/_sql_ops.py, in one round trip whatever the number of keys
    # when every key has a row and no waiters lately (take_many_at_once: its start, one
    # UPDATE over every key, as a single key's newcomer's UPDATE would take each, the read of
    # their tokens and the commit, in one packet). A key the UPDATE did not take stops the
    # packet before the commit; then the transaction goes on with the second statement for
    # each such key (which looks at its queue), and commits, or rolls back where a key is
    # busy. A release is one UPDATE. (MariaDB parses every statement anew, and PyMySQL's
    # client time per round trip is more than the server's per row.)
    def acquire_many(self, keys: Sequence[str], owner: str, ttl: float) -> dict[str, int] | None:
        keys = sorted(keys)
        n = len(keys)
        params: dict[str, Any] = {"owner": owner, "kind": "lock", "ttl_us": round(ttl * 1e6)}
        for i, key in enumerate(keys):
            params[f"key_{i}"], params[f"sname_{i}"] = key, self._sessions.name(key)
        insert = (self.sql.acquire_many_newcomer,)

        def op(conn: Any) -> dict[str, int] | None:
            try:
                try:
                    rows = _batch_rows(conn, self.sql.take_many_at_once(n), params)[3]
                    return {str(k): int(token) for k, token in rows}  # committed
                except pymysql.err.MySQLError as exc:
                    if not exc.args or exc.args[0] != MANY_TAKEN_PARTLY:
                        raise
                rows = _batch_rows(conn, self.sql.many_tokens(n), params)[0]
                taken = {str(k): int(token) for k, token in rows}
                for key in keys:
                    if key not in taken:  # no row, or waiters lately: look at the queue
                        token = self._take_on(conn, insert, key, owner, ttl)
                        if token is None:
                            break
                        taken[key] = token
            except BaseException:
                with contextlib.suppress(Exception):  # a broken connection is discarded anyway
                    conn.rollback()
                raise
            if len(taken) < n:
                conn.rollback()
                return None
            conn.commit()
            return taken

        return self.run("acquire", op, key=keys[0])

    def release_many(self, tokens: Mapping[str, int], owner: str) -> bool:
        keys = sorted(tokens)
        sql = self.sql.release_many(len(keys))
        params: dict[str, Any] = {"owner": owner}
        for i, key in enumerate(keys):
            params[f"key_{i}"], params[f"token_{i}"] = key, tokens[key]
        calls = 0

        def op(conn: Any) -> bool:
            nonlocal calls
            calls += 1
            if self._exec(conn, sql, params)[0] == len(keys):
                return True
            # after a retry the first attempt may have committed: released by us is success
            return calls > 1 and all(self._ended_by(conn, k, owner, tokens[k]) for k in keys)

        try:
            return self.run("release", op, key=keys[0])
        finally:
            self._released_many(tokens, owner)

    # -- ManyKeys' other steps (one transaction: stores/_sql_ops.py) ---------------------
    def _take_free(self, conn: Any, key: str, owner: str, ttl: float) -> int | None:
        return self._take_on(conn, self.sql.acquire, key, owner, ttl)

    def _take_on(
        self,
        conn: Any,
        sqls: tuple[str, ...],
        key: str,
        owner: str,
        ttl: float,
        *,
        kind: str = "lock",
    ) -> int | None:
        """The statements ``sqls`` of an acquire of ``key``, tried in turn on ``conn``: the
        token, or None."""
        params = {
            "key": key,
            "kind": kind,
            "owner": owner,
            "ttl_us": round(ttl * 1_000_000),
            "sname": self._sessions.name(key),
        }
        with conn.cursor() as cur:
            for sql in sqls:
                if cur.execute(sql, params) in (1, 2):
                    return int(cur.lastrowid)
        return None

    def _end_hold(self, conn: Any, key: str, owner: str, token: int) -> bool:
        # what release does for a hold that keeps no bell (one taken without waiting, as
        # acquire_many takes them): the first waiter has the bell already and polls the table
        params = {"key": key, "owner": owner, "token": token}
        return self._exec(conn, self.sql.release, params)[0] == 1

    def _ended_by(self, conn: Any, key: str, owner: str, token: int) -> bool:
        rows = self._exec(conn, self.sql.owner_token, {"key": key})[1]
        if not rows:
            return False
        holder, last, note = rows[0]
        return bool((holder is None and last == token) or note == str(token))

    def _extend_hold(self, conn: Any, key: str, owner: str, token: int, ttl: float) -> bool:
        with conn.cursor() as cur:
            return bool(cur.execute(self.sql.renew, (round(ttl * 1e6), key, owner, token)) == 1)

    def _released_many(self, tokens: Mapping[str, int], owner: str) -> None:
        """A hold that kept its key's bell (re-taken by acquire_many after a wait) was freed,
        not handed over: let go of the bell, which wakes the next waiter to look."""
        for key in tokens:
            bell = self._bells.name(key)

            def let_go(conn: Any, bell: str = bell) -> None:
                _batch(conn, self.sql.let_go_bell, {"bell": bell})

            with contextlib.suppress(Exception):  # a failed let-go closed the bell's connection
                self._bells.release_holding(key, owner, let_go)

    def subscribe(self, key: str, owner: str, queue: str | None = None) -> Subscription:
        """A doorbell for a plain lock's waiter (see doorbell.py); others poll."""
        bell = self._bells.doorbell(key, owner, self.rt.event()) if queue == "lock" else None
        return Sleeper(self.rt.event()) if bell is None else bell

    def subscribe_many(self, keys: Sequence[str], owner: str) -> Subscription:
        """A lock_many waiter has no bell: it looks at its keys (see KeysLook)."""
        sql = self.sql.look_many(len(keys))
        params = many_params(sorted(keys), owner)

        def look() -> tuple[int, int]:
            rows = self.run("probe", lambda conn: self._exec(conn, sql, params), key=keys[0])[1]
            return int(rows[0][0]), int(rows[0][1])

        return KeysLook(look, self.rt.event(), self.poll_cap)

    def close(self) -> None:
        self._bells.close()
        self._sessions.close()
        super().close()

    # -- CommitGuards (lock.guard) --------------------------------------------------------
    def guard_sql(self, n: int) -> str:
        return self.sql.guard(n)

    def guard_identity_sql(self) -> str:
        return self.sql.identity

    def guard_identity(self, row: Sequence[object]) -> str | None:
        # MariaDB has no @@server_uuid: the server's host name, port and data directory tell
        # one server from another (whatever address reached it); the database is the lock
        # table's: the one it is qualified with, else the connection's
        host, port, datadir, database = row
        return f"mysql {host} {port} {datadir} {self._schema or database}"

    def renew_after_guard(self, tokens: Mapping[str, int], owner: str, ttl: float) -> bool:
        keys = sorted(tokens)
        sql = self.sql.renew_after_guard(len(keys))
        params: dict[str, Any] = {"owner": owner, "ttl_us": round(ttl * 1e6)}
        for i, key in enumerate(keys):
            params[f"key_{i}"], params[f"token_{i}"] = key, tokens[key]

        def op(conn: Any) -> bool:
            return self._exec(conn, sql, params)[0] == len(keys)

        return self.run("renew", op, key=keys[0])

    # -- FencedGrants ---------------------------------------------------------------------
    def identity(self) -> str | None:
        def op(conn: Any) -> str | None:
            with conn.cursor() as cur:
                cur.execute(self.sql.identity)
                row = cur.fetchone()
            return None if row is None else self.guard_identity(row)

        try:
            return self.run("reading the server's identity", op)
        except DBLockError:
            return None

    def fence(self, key: str) -> int:
        def op(conn: Any) -> int:
            with conn.cursor() as cur:
                cur.execute(self.sql.fence, {"key": key})
                row = cur.fetchone()
            return int(row[0]) if row is not None else 0

        return self.run("reading the fence", op, key=key)

    def grant_fenced(self, key: str, owner: str, ttl: float, token: int, kind: str) -> bool:
        params = {
            "key": key,
            "kind": kind,
            "owner": owner,
            "ttl_us": round(ttl * 1_000_000),
            "token": token,
        }

        def op(conn: Any) -> bool:
            with conn.cursor() as cur:
                if self.sql.sequence:
                    # every token stays at or below the sequence, so that a session token drawn
                    # from it exceeds the key's (on disk with the grant's commit)
                    cur.execute(self.sql.push_sequence(token))
                if cur.execute(self.sql.grant_fenced_update, params) == 1:
                    return True
                return bool(cur.execute(self.sql.grant_fenced_insert, params) == 1)

        return self.run("acquire", op, key=key)

    def release_owned(self, key: str, owner: str) -> bool:
        def op(conn: Any) -> bool:
            with conn.cursor() as cur:
                return bool(cur.execute(self.sql.release_owned, {"key": key, "owner": owner}) == 1)

        return self.run("release", op, key=key)

    def claim_once(self, key: str, owner: str, ttl: float, note: str | None) -> int | None:
        params = (key, owner, round(ttl * 1_000_000), note)

        def op(conn: Any) -> int | None:
            with conn.cursor() as cur:
                affected = cur.execute(self.sql.claim_once, params)
                return int(cur.lastrowid) if affected in (1, 2) else None

        return self.run("once", op, key=key)

    def once_state(self, key: str) -> tuple[str, str | None, bool] | None:
        def op(conn: Any) -> tuple[str, str | None, bool] | None:
            with conn.cursor() as cur:
                cur.execute(self.sql.once_state, (key,))
                row = cur.fetchone()
                return None if row is None else (row[0], row[1], bool(row[2]))

        return self.run("state", op, key=key)

    def renew(self, key: str, owner: str, token: int, ttl: float) -> bool:
        params = (round(ttl * 1_000_000), key, owner, token)

        def op(conn: Any) -> bool:
            with conn.cursor() as cur:
                return bool(cur.execute(self.sql.renew, params) == 1)

        return self.run("renew", op, key=key)

    def info(self, key: str) -> LockInfo | None:
        def op(conn: Any) -> LockInfo | None:
            with conn.cursor() as cur:
                cur.execute(self.sql.info, (key,))
                row = cur.fetchone()
            if row is None:
                rows = self._holder_rows(conn, key=key)
                row = rows[0] if rows else None
            if row is None and provides(self, SessionHolds):
                rows = self._sessions.infos(conn, key)
                row = rows[0] if rows else None
            return None if row is None else _info(row)

        return self.run("info", op, key=key)

    def list_holds(self, prefix: str) -> list[LockInfo]:
        def op(conn: Any) -> list[LockInfo]:
            with conn.cursor() as cur:
                if prefix:
                    cur.execute(self.sql.list_by_prefix, (len(prefix), prefix))
                else:
                    cur.execute(self.sql.list_all)
                rows = [*cur.fetchall(), *self._holder_rows(conn, prefix=prefix)]
            if provides(self, SessionHolds):
                rows += self._sessions.infos(conn, prefix=prefix)
            return sorted((_info(row) for row in rows), key=lambda i: (i.key, i.acquired_at))

        return self.run("list", op, deadline=MAINTENANCE_DEADLINE)

    def force_release(self, key: str) -> bool:
        def op(conn: Any) -> bool:
            with conn.cursor() as cur:
                freed = cur.execute(self.sql.force_release, (key,)) == 1
            if provides(self, SessionHolds):
                # a session hold ends with its connection, as PostgreSQL's with its backend
                holder = self._sessions.holder(conn, key)
                if holder is not None:
                    self._kill(conn, holder)
                    freed = True
            return self._force_holders(conn, key) > 0 or freed

        return self.run("force_release", op, key=key)

    def _proclaimed(self, conn: Any, params: dict[str, Any]) -> bool:
        # no RETURNING: a row made counts 1, a row replaced has the token as its insert id
        # (see MysqlStatements._proclaim), which is 0 where nothing was (no token is 0)
        with conn.cursor() as cur:
            made = cur.execute(self.sql.proclaim, params) == 1
            replaced = int(cur.lastrowid or 0)
        return made or (replaced != 0 and replaced == int(params["token"]))

    # -- dialect hooks for the multi-holder operations ------------------------------------
    def _exec(self, conn: Any, sql: str, params: dict[str, Any]) -> tuple[int, list[Any]]:
        with conn.cursor() as cur:
            count = cur.execute(sql, _us(params))
            return int(count), list(cur.fetchall()) if cur.description else []

    @contextmanager
    def _transaction(self, conn: Any) -> Iterator[None]:
        conn.begin()
        try:
            yield
        except BaseException:
            conn.rollback()
            raise
        conn.commit()

    def _next_token(self, conn: Any, key: str) -> int:
        with conn.cursor() as cur:
            cur.execute(self.sql.next_token, (key,))
            return int(cur.lastrowid)

    def purge(self, older_than: float, include_once: bool) -> int:
        gone = (round(older_than * 1_000_000), int(include_once))

        def op(conn: Any) -> int:
            with conn.cursor() as cur:
                cur.execute(self.sql.purge_isolation)
                conn.begin()
                try:
                    cur.execute(self.sql.highest_purged_token, gone)
                    highest = int(cur.fetchone()[0])
                    cur.execute(self.sql.remember_purged_tokens, (highest,))
                    count = int(cur.execute(self.sql.purge, (*gone, highest)))
                    count += self._purge_holders(conn, older_than)
                    count += self._purge_values(conn, older_than)
                    conn.commit()
                    if provides(self, SessionHolds):  # rows of session holders that died
                        cur.execute(self.sql.session_purge)
                except BaseException:
                    conn.rollback()
                    raise
                return count

        return self.run("purge", op, deadline=MAINTENANCE_DEADLINE)


def _server_session(conn: Any) -> int | None:
    """The server's id of ``conn``'s session (None: it never connected, nothing runs there)."""
    try:
        return int(conn.thread_id())
    except Exception:  # noqa: BLE001 - any failure here means no session
        return None


def _for_server(ddl: str, mysql8: bool) -> str:
    """``ddl`` with the key collation of the server (MariaDB's as written, or MySQL 8's)."""
    return ddl.replace(NOPAD_MARIADB, NOPAD_MYSQL) if mysql8 else ddl


def _batch(conn: Any, sql: str, params: dict[str, Any]) -> list[int]:
    """Run the statements ``sql`` (one packet); the rows each affected."""
    with conn.cursor() as cur:
        counts = [cur.execute(sql, params)]
        while cur.nextset():
            counts.append(cur.rowcount)
        return counts


def _batch_rows(conn: Any, sql: str, params: dict[str, Any]) -> list[list[Any]]:
    """Run the statements ``sql`` (one packet); each one's rows (none for a write)."""
    with conn.cursor() as cur:
        cur.execute(sql, params)
        results = [list(cur.fetchall())]
        while cur.nextset():
            results.append(list(cur.fetchall()))
        return results


def _us(params: dict[str, Any]) -> dict[str, Any]:
    """Add ``<name>_us`` microsecond integers for the duration parameters MySQL SQL uses."""
    durations = ("ttl", "older", "least")
    extra = {f"{k}_us": round(v * 1_000_000) for k, v in params.items() if k in durations}
    return {**params, **extra}


def _info(row: Any) -> LockInfo:
    """A hold's row, (key, owner, token, acquired_at, expires_at, kind); a session hold has
    no expiry (None)."""
    key, owner, token, acquired_at, expires_at, kind = row
    kind_value: Kind = kind
    ends = None if expires_at is None else _utc(expires_at)
    return LockInfo(key, owner, int(token), _utc(acquired_at), ends, kind_value)
