"""SQLite backend (stdlib ``sqlite3``): the embedded default, safe across processes on one host.

Requires SQLite >= 3.35 (upsert with ``RETURNING``). Time comes from SQLite's own clock on the
host that holds the file: ``julianday('now')``, which is fixed for the duration of one
statement, converted to Unix seconds (millisecond resolution). WAL mode lets readers run beside
the single writer; a busy timeout makes writers queue instead of failing.

Fencing tokens are per key (``token + 1`` on every acquisition). ``purge`` records the highest
token it deletes in ``<table>_meta.hwm`` in the same transaction, and a new row starts above
it, so deleting rows never lets a token repeat.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

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
    SharedHolds,
    Subscription,
    Wakeups,
)
from ..._errors import BackendError, ConfigurationError
from ..._runtime import Runtime
from ..._timing import DeadlinePassed, bounded_wait
from ..._types import Kind, LockInfo
from ..._url import DatabaseURL, url_number
from .._pool import MAINTENANCE_DEADLINE, Failure, Sleeper
from .._schema import HOLDERS, MAIN, META, missing, refuse_foreign
from .._sql_holders import colon_style, value_key
from .._sql_ops import Busy, StatementOperations, many_params
from .statements import VALUE_KEY_FUNCTION, SqliteStatements

MIN_VERSION = (3, 35, 0)
#: the longest busy timeout a URL may ask for (``?timeout=``), seconds
MAX_BUSY_TIMEOUT = 3600.0
#: the files SQLite keeps beside a database (they take the database file's mode)
_COMPANIONS = ("", "-wal", "-shm", "-journal")


class _ChangeWatch(Subscription):
    """Wakes a waiter when another connection commits to the database file.

    ``PRAGMA data_version`` changes whenever another connection commits; reading it costs no
    I/O (it is in the WAL index in shared memory), so a waiter can check it every
    millisecond or two and try again only when something changed: hand-off in milliseconds
    without a query storm.
    """

    live = True
    targeted = False
    latched = False
    broadcast = True
    granted: int | None = None
    interval = 0.002

    def __init__(self, conn: sqlite3.Connection, done: threading.Semaphore, rt: Runtime) -> None:
        self._conn = conn
        self._done = done  # released on close: the backend's count of watches
        # reading the version is a read of shared memory (microseconds): done on the event
        # loop itself by the async client, which only sleeps through its runtime
        self._rt = rt
        self._version = self._read()

    def _read(self) -> int:
        return int(self._conn.execute("PRAGMA data_version").fetchone()[0])

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            try:
                version = self._read()
            except sqlite3.Error:
                self._rt.sleep(max(0.0, min(0.05, deadline - time.monotonic())))
                return False
            if version != self._version:
                self._version = version
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._rt.sleep(min(self.interval, left))

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._conn.close()
        self._done.release()


def _close_quietly(conn: sqlite3.Connection) -> None:
    with contextlib.suppress(sqlite3.Error):
        conn.close()


def _ts(value: float) -> datetime:
    return datetime.fromtimestamp(value, tz=timezone.utc)


class SqliteStore(
    StatementOperations[sqlite3.Connection],
    FairQueue,
    SharedHolds,
    OnceRecords,
    Wakeups,
    QueueView,
    FencedManyGrants,
    FencedGrants,
    SchemaScript,
    FairManyKeys,
    CommitGuards,
    LeaderValues,
):
    """Lock table in a SQLite file."""

    name = dialect = "sqlite"
    # the guard is a no-op write (no row locks in SQLite): a changed row per live hold
    guard_paramstyle = "named"
    guard_counts = "rowcount"

    @staticmethod
    def _row_info(row: Any) -> LockInfo:
        return _info(row)

    asyncio_io = "threads"  # the async client runs each operation on a worker thread
    probe_before_try = True  # local reads cost microseconds; writers queue for one file lock
    poll_cap = 0.1  # a local file: polling is cheap, and hand-off latency is bounded by this
    sql: SqliteStatements

    def __init__(self, url: DatabaseURL, schema: str | None, table: str) -> None:
        if sqlite3.sqlite_version_info < MIN_VERSION:
            raise ConfigurationError(
                f"dblock needs SQLite >= 3.35 (upsert with RETURNING); this Python has "
                f"{sqlite3.sqlite_version}"
            )
        super().__init__(url, f"{schema}.{table}" if schema else table)
        self.path = url.database
        if self.path == ":memory:":
            # every connection of the pool would open a database of its own: locks taken on
            # one would not exist for the others, nor for any other process
            raise ConfigurationError(
                f"{url.safe!r}: an in-memory SQLite database cannot hold dblock's locks (each "
                "pooled connection would see its own, empty one, and no other process any); "
                "use a file, e.g. sqlite:////tmp/locks.sqlite3, or the embedded default"
            )
        unknown = set(url.query) - {"timeout"}
        if unknown:
            raise ConfigurationError(
                f"unknown SQLite URL parameter(s) {sorted(unknown)} in {url.safe!r}; "
                "supported: timeout (busy timeout in seconds), max_connections"
            )
        self.busy_timeout = url_number(
            url.query.get("timeout"),
            "timeout",
            10.0,
            safe=url.safe,
            minimum=0.0,
            maximum=MAX_BUSY_TIMEOUT,
        )
        #: the embedded default: the directory and files are this user's alone
        self._private = url.private
        self._prepared = False
        # each waiter's change watch has a connection of its own: at most max_connections
        self._watches = threading.Semaphore(self.max_connections)
        self.sql = SqliteStatements(schema, table)
        #: set once the file is known to hold dblock's tables (see ensure_schema)
        self._recognised = False

    # -- connections ----------------------------------------------------------------------
    def _prepare(self) -> None:
        """Make the database's directory (and, for the embedded default, the file) exist."""
        path = Path(self.path).expanduser()
        if self._private:
            _private_file(path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
        self._prepared = True

    def _connect(self) -> sqlite3.Connection:
        return self._open_file()

    def _open_file(self) -> sqlite3.Connection:
        """A connection of dblock's own to the file (a waiter's change watch always has one,
        even where statement connections are borrowed: see stores/_sqla.py)."""
        if not self._prepared:
            self._prepare()
        # set-up waits the busy timeout (many processes may open the file at once), but no
        # longer than the caller's deadline allows
        setup, cut = bounded_wait(self.busy_timeout)
        conn = sqlite3.connect(
            str(Path(self.path).expanduser()),
            timeout=self._INNER_BUSY_MS / 1000,
            isolation_level=None,
            check_same_thread=False,
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(setup * 1000)}")
            # WAL: readers never block the writer (not before the file is known to be dblock's:
            # the switch is a change to the file). synchronous=FULL: a commit waits for the
            # disk, so a power cut cannot roll back an acquisition whose token a client saw
            # (releases relax it for their own commit: see release).
            if self._recognised:
                self._set_wal(conn, setup)
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute(f"PRAGMA busy_timeout = {self._INNER_BUSY_MS}")
        except sqlite3.OperationalError as exc:
            conn.close()
            if cut and "locked" in str(exc):
                raise DeadlinePassed(
                    f"opening {self.safe_url} found the database busy until the caller's deadline"
                ) from None
            raise
        except BaseException:
            conn.close()
            raise
        return conn

    def _set_wal(self, conn: sqlite3.Connection, wait: float) -> None:
        """Switch the file to WAL. While other processes open a new file at the same moment,
        SQLite can refuse the switch with "database is locked" without waiting for its busy
        timeout: it is retried here as any busy statement is (see below), for ``wait`` s."""
        deadline = time.monotonic() + wait
        attempt = 0
        while True:
            attempt += 1
            try:
                conn.execute("PRAGMA journal_mode = WAL")
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(self._transient_pause(attempt))
            else:
                return

    def _close_connection(self, conn: sqlite3.Connection) -> None:
        _close_quietly(conn)

    def _classify(self, exc: BaseException) -> Failure | None:
        if not isinstance(exc, sqlite3.Error):
            return None
        if isinstance(exc, sqlite3.ProgrammingError) and "closed" in str(exc):
            return Failure.DISCONNECT
        if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
            return Failure.TRANSIENT  # SQLITE_BUSY: another writer; retried for busy_timeout
        return Failure.FATAL

    # SQLite's own busy handler sleeps up to 100 ms between attempts, so a writer that has to
    # wait loses every race against one that writes in a loop. SQLite is told to wait only a
    # moment; dblock retries "database is locked" itself, in short jittered steps, until the
    # URL's busy timeout has passed.
    _INNER_BUSY_MS = 2

    @property
    def _transient_for(self) -> float:  # type: ignore[override]
        return self.busy_timeout

    def _transient_pause(self, attempt: int) -> float:
        return random.uniform(0.0002, 0.0015)

    def _abort(self, conn: sqlite3.Connection) -> None:
        conn.interrupt()

    def _reset(self, conn: sqlite3.Connection) -> None:
        if conn.in_transaction:
            conn.execute("ROLLBACK")

    # -- schema ---------------------------------------------------------------------------
    def ensure_schema(self, create: bool) -> None:
        path = Path(self.path).expanduser()
        if not create and not path.exists():
            # connecting would create the file (and _connect its directory)
            if self._private:
                if path.parent.exists():  # an unsafe directory is refused even to a reader
                    _check_private(path.parent, "directory")
                # a fresh install: nothing was ever held
                raise missing(self.table, self.safe_url, self.dialect)
            if path.parent.is_dir():
                raise missing(self.table, self.safe_url, self.dialect)
            raise BackendError(f"cannot open {self.safe_url}: {path.parent} is not a directory")
        required = dict(zip(self.sql.table_names.values(), (MAIN, META, HOLDERS), strict=True))

        def op(conn: sqlite3.Connection) -> None:
            found: dict[str, set[str]] = {}
            for name, column in conn.execute(self.sql.find_tables, self.sql.table_names):
                found.setdefault(name, set()).add(column)
            refuse_foreign(self.table, self.safe_url, found, required)
            if len(found) < len(self.sql.table_names) and not create:
                raise missing(self.table, self.safe_url, self.dialect)
            self._set_wal(conn, self.busy_timeout)
            self._recognised = True
            if len(found) < len(self.sql.table_names):
                conn.execute("BEGIN IMMEDIATE")
                try:
                    for statement in self.sql.ddl:
                        conn.execute(statement)
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise

        self.run("creating the lock table", op, deadline=MAINTENANCE_DEADLINE)

    # -- operations -----------------------------------------------------------------------
    # (acquire, renew, grant_fenced, release_owned, claim_once, once_state: stores/_sql_ops.py)
    # -- FencedGrants ---------------------------------------------------------------------
    def identity(self) -> str | None:
        return _file_identity(self.path)

    def fence(self, key: str) -> int:
        def op(conn: sqlite3.Connection) -> int:
            return int(conn.execute(self.sql.fence, {"key": key}).fetchone()[0])

        return self.run("reading the fence", op, key=key)

    def release(self, key: str, owner: str, token: int) -> bool:
        params = {"key": key, "owner": owner, "token": token}
        calls = 0

        def op(conn: sqlite3.Connection) -> bool:
            nonlocal calls
            calls += 1
            with self._not_durable(conn):
                ended = conn.execute(self.sql.release, params).rowcount == 1
            if ended:
                return True
            # After a retry the first attempt may have committed: released by us is success.
            return calls > 1 and self._released_by_us(conn, key, token)

        return self.run("release", op, key=key)

    @contextmanager
    def _not_durable(self, conn: sqlite3.Connection) -> Iterator[None]:
        """Commits inside that do not wait for the disk, for releases. A release issues no
        token: a power cut may undo it, and the lock is then held until its lease ends, as if
        its holder had died holding it; the WAL is written in order, so the commit of any
        later acquisition, which waits for the disk, makes the release durable first. After
        it, back to commits that wait for the disk; a connection that cannot is closed."""
        conn.execute("PRAGMA synchronous = NORMAL")
        try:
            yield
        finally:
            try:
                conn.execute("PRAGMA synchronous = FULL")
            except BaseException:
                conn.close()
                raise

    def _released_by_us(self, conn: sqlite3.Connection, key: str, token: int) -> bool:
        row = conn.execute(self.sql.owner_token, {"key": key}).fetchone()
        return row is not None and row[0] is None and row[1] == token

    # -- ManyKeys: each operation one statement over all the keys, each key's part of it what
    # the one-key statement does (the pool's retries and the all-or-none transaction are
    # stores/_sql_ops.py's); a statement per key would cost its driver round each
    def _take_all(
        self, conn: sqlite3.Connection, keys: Sequence[str], owner: str, ttl: float
    ) -> dict[str, int]:
        return self._take_keys(conn, self.sql.acquire_many(len(keys)), keys, owner, ttl)

    def _take_all_in_turn(
        self, conn: sqlite3.Connection, keys: list[str], owner: str, ttl: float
    ) -> dict[str, int]:
        params = many_params(keys, owner)
        if self._count(conn, self.sql.blocked_many(len(keys)), params):
            raise Busy
        taken = self._take_keys(conn, self.sql.take_many(len(keys)), keys, owner, ttl)
        self._exec(conn, self.sql.dequeue_many(len(keys)), params)
        return taken

    def _take_keys(
        self, conn: sqlite3.Connection, sql: str, keys: Sequence[str], owner: str, ttl: float
    ) -> dict[str, int]:
        """Each key's token from ``sql`` (acquire_many or take_many), inside the caller's
        transaction; Busy (it rolls back) unless every key was taken."""
        if not keys:
            return {}
        params = many_params(keys, owner, kind="lock", ttl=ttl)
        taken = {key: int(token) for key, token in conn.execute(sql, params)}
        if taken.keys() != set(keys):
            raise Busy
        return taken

    def renew_many(self, tokens: Mapping[str, int], owner: str, ttl: float) -> bool:
        keys = sorted(tokens)
        if not keys:
            return True
        sql = self.sql.renew_many(len(keys))
        params = _token_params(keys, tokens, owner, ttl=ttl)

        def op(conn: sqlite3.Connection) -> bool:
            return bool(conn.execute(sql, params).rowcount == len(keys))

        return self.run("renew", op, key=keys[0])

    def release_many(self, tokens: Mapping[str, int], owner: str) -> bool:
        keys = sorted(tokens)
        if not keys:
            return True
        sql = self.sql.release_many(len(keys))
        params = _token_params(keys, tokens, owner)
        calls = 0

        def op(conn: sqlite3.Connection) -> bool:
            nonlocal calls
            calls += 1
            with self._not_durable(conn), self._transaction(conn):
                ended = conn.execute(sql, params).rowcount
            # after a retry the first attempt may have committed: a key released by us (now
            # or then) is success
            return ended == len(keys) or (
                calls > 1 and all(self._released_by_us(conn, k, tokens[k]) for k in keys)
            )

        return self.run("release", op, key=keys[0])

    # -- CommitGuards: the statements run on the caller's connection (sqlite3's :name style)
    def guard_sql(self, n: int) -> str:
        return self.sql.guard(n)

    def guard_identity_sql(self) -> str:
        # PRAGMA database_list's row (seq, name, file) for the main database: the file the
        # caller's connection opened (an empty name for an in-memory or temporary one)
        return "SELECT seq, name, file FROM pragma_database_list WHERE name = 'main'"

    def guard_identity(self, row: Sequence[object]) -> str | None:
        file = row[2] if len(row) > 2 else None
        return _file_identity(file) if isinstance(file, str) and file else None

    def renew_after_guard(self, tokens: Mapping[str, int], owner: str, ttl: float) -> bool:
        keys = sorted(tokens)
        if not keys:
            return True
        sql = self.sql.renew_after_guard(len(keys))
        params = _token_params(keys, tokens, owner, ttl=ttl)

        # a retry after a lost reply sets the same rows again (owner and token unchanged):
        # the count is the same, so no check of what the first attempt did is needed
        def op(conn: sqlite3.Connection) -> bool:
            return bool(conn.execute(sql, params).rowcount == len(keys))

        return self.run("renew", op, key=keys[0])

    def _ended_by(self, conn: sqlite3.Connection, key: str, owner: str, token: int) -> bool:
        return self._released_by_us(conn, key, token)

    def acquire_fair(self, key: str, owner: str, ttl: float, queued: bool) -> int | None:
        params = {"key": key, "kind": "lock", "owner": owner, "ttl": ttl}

        def op(conn: sqlite3.Connection) -> int | None:
            if not queued:
                row = conn.execute(self.sql.acquire_as_newcomer, params).fetchone()
                return None if row is None else int(row[0])
            with self._transaction(conn):  # take and leave the queue: one commit
                row = conn.execute(self.sql.acquire_in_turn, params).fetchone()
                if row is not None:
                    self._exec(conn, self.sql.dequeue, params)
            return None if row is None else int(row[0])

        return self.run("acquire", op, key=key)

    def info(self, key: str) -> LockInfo | None:
        def op(conn: sqlite3.Connection) -> LockInfo | None:
            row = conn.execute(self.sql.info, {"key": key}).fetchone()
            if row is None:
                rows = self._holder_rows(conn, key=key)
                row = rows[0] if rows else None
            return None if row is None else _info(row)

        return self.run("info", op, key=key)

    def list_holds(self, prefix: str) -> list[LockInfo]:
        def op(conn: sqlite3.Connection) -> list[LockInfo]:
            if prefix:
                cur = conn.execute(self.sql.list_by_prefix, {"n": len(prefix), "prefix": prefix})
            else:
                cur = conn.execute(self.sql.list_all)
            rows = [*cur, *self._holder_rows(conn, prefix=prefix)]
            return sorted((_info(row) for row in rows), key=lambda i: (i.key, i.acquired_at))

        return self.run("list", op, deadline=MAINTENANCE_DEADLINE)

    def force_release(self, key: str) -> bool:
        def op(conn: sqlite3.Connection) -> bool:
            freed = conn.execute(self.sql.force_release, {"key": key}).rowcount
            return freed + self._force_holders(conn, key) > 0

        return self.run("force_release", op, key=key)

    def subscribe(self, key: str, owner: str, queue: str | None = None) -> Subscription:
        if not self._watches.acquire(blocking=False):
            return Sleeper(self.rt.event())  # max_connections waiters watch already: it polls
        conn = None
        try:
            conn = self.rt.offload(self._open_file, discard=_close_quietly)
            return _ChangeWatch(conn, self._watches, self.rt)
        except BaseException as exc:
            # a cancellation too: the watch was never handed out, so nobody else would
            # close its connection or give its place back
            if conn is not None:
                _close_quietly(conn)
            self._watches.release()
            if isinstance(exc, (sqlite3.Error, DeadlinePassed)):
                return Sleeper(self.rt.event())
            raise

    def subscribe_many(self, keys: Sequence[str], owner: str) -> Subscription | None:
        # a change watch wakes at any commit to the file: a release of any of the keys too
        return self.subscribe(keys[0], owner)

    # -- dialect hooks for the multi-holder operations ------------------------------------
    def _exec(
        self, conn: sqlite3.Connection, sql: str, params: dict[str, Any]
    ) -> tuple[int, list[Any]]:
        cur = conn.execute(colon_style(sql), params)
        rows = cur.fetchall()
        return cur.rowcount, rows

    @contextmanager
    def _transaction(self, conn: sqlite3.Connection) -> Iterator[None]:
        conn.execute("BEGIN IMMEDIATE")  # the database's write lock serialises everything
        try:
            yield
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def _next_token(self, conn: sqlite3.Connection, key: str) -> int:
        row = conn.execute(self.sql.next_token, {"key": key}).fetchone()
        return int(row[0])

    def purge(self, older_than: float, include_once: bool) -> int:
        params = {"older": older_than, "inc": int(include_once)}

        def op(conn: sqlite3.Connection) -> int:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(self.sql.remember_purged_tokens, params)
                count = conn.execute(self.sql.purge, params).rowcount
                count += self._purge_holders(conn, older_than)
                # registered for this statement only: the connection may be borrowed
                conn.create_function(VALUE_KEY_FUNCTION, 1, value_key, deterministic=True)
                try:
                    count += self._purge_values(conn, older_than)
                finally:
                    conn.create_function(VALUE_KEY_FUNCTION, 1, None)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            return int(count)

        return self.run("purge", op, deadline=MAINTENANCE_DEADLINE)


def _file_identity(path: str) -> str | None:
    """A database file's identity: the file, not its name (a symlink, "./" or a hard link
    reach the same one); None if it cannot be read."""
    try:
        st = os.stat(Path(path).expanduser())
    except OSError:
        return None
    return f"sqlite file {st.st_dev}:{st.st_ino}"


def _private_file(path: Path) -> None:
    """The embedded default's directory (0700) and files (0600): this user's alone.

    Anyone who can read the file reads every key, owner and note; anyone who can open it can
    block every client by holding SQLite's locks. A directory owned by another user, or that
    others may write to (they could swap the file), is refused; a file SQLite keeps there that
    is not ours is refused too. Ours with looser modes (a directory made by hand under the umask's
    0755, say) are tightened.
    """
    directory = path.parent
    # each missing directory 0700, the XDG state home too (os.makedirs would give the ones
    # above the last the umask's mode); no umask change: it is the whole process's
    missing = [d for d in (directory, *directory.parents) if not d.exists()]
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            d.mkdir(mode=0o700)
    _check_private(directory, "directory")
    for suffix in _COMPANIONS:
        companion = Path(f"{path}{suffix}")
        with contextlib.suppress(FileNotFoundError):
            _check_private(companion, "file")
    # created here (not by SQLite, which would use 0644): the -wal, -shm and -journal files
    # SQLite makes later take the database file's mode
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.close(fd)


def _check_private(path: Path, what: str) -> None:
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        target = os.stat(path)  # a link of ours to a place of ours is the user's choice
        if info.st_uid != os.geteuid() or target.st_uid != os.geteuid():
            raise ConfigurationError(
                f"the embedded dblock database's {what} {path} is a symbolic link not owned by "
                "you (or to a place not owned by you); remove it, or set DBLOCK_URL"
            )
        info = target
    if info.st_uid != os.geteuid():
        raise ConfigurationError(
            f"the embedded dblock database's {what} {path} is owned by uid {info.st_uid}, not "
            "by you: another user could read or block your locks; remove it, or set DBLOCK_URL"
        )
    if info.st_mode & 0o022:
        raise ConfigurationError(
            f"the embedded dblock database's {what} {path} is writable by other users "
            f"(mode {stat.S_IMODE(info.st_mode):o}); run chmod go-w on it, or set DBLOCK_URL"
        )
    private = 0o700 if what == "directory" else 0o600
    if stat.S_IMODE(info.st_mode) & ~private:
        os.chmod(path, stat.S_IMODE(info.st_mode) & private)


def _token_params(
    keys: list[str], tokens: Mapping[str, int], owner: str, **more: Any
) -> dict[str, Any]:
    """release_many's and renew_many's parameters: k0.., each key's token t0.., owner, more."""
    return many_params(keys, owner, **{f"t{i}": tokens[k] for i, k in enumerate(keys)}, **more)


def _info(row: Any) -> LockInfo:
    key, owner, token, acquired_at, expires_at, kind = row
    kind_value: Kind = kind
    return LockInfo(key, owner, int(token), _ts(acquired_at), _ts(expires_at), kind_value)
