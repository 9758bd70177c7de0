"""Scenario ``guard``: what ``lock.guard(conn)`` (issue 50) adds to the application's own
transaction, beside a token-fenced write, on each SQL store.

One process per store and repeat; the lock is acquired once and held throughout (uncontended).
Each side is a transaction on the application's own DB-API connection (psycopg 3, PyMySQL,
sqlite3) that writes one business row of a table beside the lock table and commits:

- ``plain``: ``UPDATE`` the row, ``COMMIT`` (what the application does without a guard);
- ``guard``: ``lock.guard(conn)`` first, then the same ``UPDATE`` and ``COMMIT``;
- ``fenced``: the token-column ``UPDATE`` of :mod:`dblock.fencing` instead (the row records the
  hold's token), then ``COMMIT``: the other way to keep a stale holder's write out.

The sides run interleaved in 0.1 s slices (the order rotated every slice) so that the
machine's drifts fall on each alike; ratios and added times are taken within a repeat and the
median quoted. After the timed slices, one more transaction per side is run with the traffic
counted: PostgreSQL by libpq's protocol trace (round trips: ``ReadyForQuery`` replies;
statements: ``Query`` + ``Execute`` messages), MariaDB/MySQL by PyMySQL's commands sent (round
trips) and the server's session ``Questions`` counter (statements), SQLite by the statements
its trace callback sees (in-process: no round trips). The guard's share is the guarded
transaction's count minus the plain one's (a transaction's ``BEGIN`` is the application's, not
the guard's): it must be 1.
"""

from __future__ import annotations

import contextlib
import functools
import sqlite3
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from bench import procs, servers, workload
from bench.contenders import Targets, _my_connect, _pg_connect

BACKENDS = ("postgresql", "mysql", "sqlite")
SIDES = ("plain", "guard", "fenced")
ROW = {"plain": 1, "guard": 2, "fenced": 3}  # each side writes a business row of its own
SLICE = 0.1
TTL = 120.0  # the lease outlasts the measurement: no renewal is due while it runs


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- the application's connection -------------------------------------------------------------
def _app_connection(t: Targets, backend: str) -> Any:
    """The application's own connection, transactions not autocommitted (the guard runs
    inside one)."""
    if backend == "postgresql":
        conn = _pg_connect(t.postgresql)
        conn.autocommit = False
        return conn
    if backend == "mysql":
        conn = _my_connect(t.mysql)
        conn.autocommit(False)
        return conn
    # the default isolation level: sqlite3 begins a transaction before the first write
    return sqlite3.connect(t.sqlite_path, timeout=30)


def _create_app_table(conn: Any, backend: str, name: str) -> None:
    q = "`" if backend == "mysql" else '"'
    mark = "?" if backend == "sqlite" else "%s"
    cur = conn.cursor()
    cur.execute(
        f"CREATE TABLE {q}{name}{q} (id INTEGER PRIMARY KEY, n BIGINT NOT NULL, fence_token BIGINT)"
    )
    for row in ROW.values():
        cur.execute(f"INSERT INTO {q}{name}{q} (id, n) VALUES ({mark}, {mark})", (row, 0))
    conn.commit()


def _transactions(conn: Any, backend: str, table: str, lock: Any) -> dict[str, Callable[[], None]]:
    """Each side's transaction, as a call: write the side's row (a new value each time),
    commit."""
    import dblock.fencing

    q = "`" if backend == "mysql" else '"'
    mark = "?" if backend == "sqlite" else "%s"
    update = f"UPDATE {q}{table}{q} SET n = {mark} WHERE id = {mark}"
    fenced = dblock.fencing.fenced_update(backend, table, ["n"], ["id"])
    cur = conn.cursor()
    seq = iter(range(1, 1 << 62))

    def plain() -> None:
        cur.execute(update, (next(seq), ROW["plain"]))
        conn.commit()

    def guarded() -> None:
        lock.guard(conn)
        cur.execute(update, (next(seq), ROW["guard"]))
        conn.commit()

    def fenced_write() -> None:
        if not fenced.execute(cur, [next(seq)], [ROW["fenced"]], lock.token):
            raise RuntimeError("the fenced UPDATE was rejected under a live hold")
        conn.commit()

    return {"plain": plain, "guard": guarded, "fenced": fenced_write}


# -- counting what a transaction sends ----------------------------------------------------------
@contextlib.contextmanager
def _count_pg(conn: Any) -> Iterator[dict[str, int | None]]:
    """libpq's protocol trace of ``conn`` while the block runs: round trips (the server's
    ``ReadyForQuery``, one per exchange) and statements (simple ``Query``, extended
    ``Execute``)."""
    import psycopg

    out: dict[str, int | None] = {}
    with tempfile.TemporaryFile() as f:
        conn.pgconn.trace(f.fileno())
        conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            yield out
        finally:
            conn.pgconn.untrace()  # flushes the trace
        f.seek(0)
        lines = [line.split("\t") for line in f.read().decode(errors="replace").splitlines()]
    messages = [(x[0], x[2].split(" ", 1)[0].strip()) for x in lines if len(x) > 2]
    out["round_trips"] = sum(1 for d, m in messages if d == "B" and m == "ReadyForQuery")
    out["statements"] = sum(1 for d, m in messages if d == "F" and m in ("Query", "Execute"))


@contextlib.contextmanager
def _count_mysql(conn: Any) -> Iterator[dict[str, int | None]]:
    """PyMySQL's commands sent on ``conn`` (each awaits its reply: a round trip), and the
    statements the server counted for the session (``Questions``, less the counter's own
    reads)."""
    out: dict[str, int | None] = {}

    def questions() -> int:
        with conn.cursor() as cur:
            cur.execute("SHOW SESSION STATUS LIKE 'Questions'")
            return int(cur.fetchone()[1])

    q0 = questions()
    q1 = questions()
    own = q1 - q0  # what one read of the counter adds to it
    sent = 0
    original = conn._execute_command

    def counting(command: int, sql: Any) -> Any:
        nonlocal sent
        sent += 1
        return original(command, sql)

    conn._execute_command = counting
    try:
        yield out
    finally:
        del conn._execute_command  # the class's method again
    out["round_trips"] = sent
    out["statements"] = questions() - q1 - own


@contextlib.contextmanager
def _count_sqlite(conn: Any) -> Iterator[dict[str, int | None]]:
    """The statements SQLite runs for ``conn`` (its trace callback; the module's implicit
    ``BEGIN`` included). In-process: no round trips."""
    seen: list[str] = []
    out: dict[str, int | None] = {"round_trips": None}
    conn.set_trace_callback(seen.append)
    try:
        yield out
    finally:
        conn.set_trace_callback(None)
    out["statements"] = len(seen)


COUNTERS = {"postgresql": _count_pg, "mysql": _count_mysql, "sqlite": _count_sqlite}


# -- measurement ------------------------------------------------------------------------------
def _uncontended(
    t: Targets, backend: str, table: str, duration: float, max_ops: int
) -> dict[str, Any]:
    """In a fresh process: each side's transactions/s and client CPU µs per transaction,
    interleaved, and what one transaction of each sends."""
    import dblock

    # one per process, dropped at its end (or with the lock table: servers.drop_dblock_tables)
    app_table = f"{table}_app_{uuid.uuid4().hex[:8]}"
    counts: dict[str, dict[str, int | None]] = {}
    with dblock.connect(t.url(backend), table=table) as client:
        lock = client.lock(f"bench-guard-{uuid.uuid4().hex[:8]}", ttl=TTL)
        lock.acquire()
        conn = _app_connection(t, backend)
        try:
            _create_app_table(conn, backend, app_table)
            txns = _transactions(conn, backend, app_table, lock)
            for txn in txns.values():
                for _ in range(20):  # warm-up: statements prepared, pages cached
                    txn()
            slices = {s: functools.partial(workload.timed_calls, txns[s]) for s in SIDES}
            out = workload.interleave(slices, duration, max_ops, SLICE)
            for side in SIDES:
                with COUNTERS[backend](conn) as counted:
                    txns[side]()
                counts[side] = counted
        finally:
            with contextlib.suppress(Exception):
                conn.rollback()
                q = "`" if backend == "mysql" else '"'
                conn.cursor().execute(f"DROP TABLE IF EXISTS {q}{app_table}{q}")
                conn.commit()
            conn.close()
            lock.release()
    return {
        side: {
            "tx_per_s": v["ops"] / v["wall"],
            "cpu_us_per_tx": v["cpu"] / v["ops"] * 1e6,
            **counts[side],
        }
        for side, v in out.items()
    }


def ratios(v: dict[str, Any]) -> dict[str, float]:
    """Within one repeat: the time each protected side adds to a plain transaction (µs) and
    its time as a multiple of the plain one's."""
    us = {side: 1e6 / v[side]["tx_per_s"] for side in SIDES}
    return {
        "guard_added_us": us["guard"] - us["plain"],
        "guard_ratio": us["guard"] / us["plain"],
        "fenced_added_us": us["fenced"] - us["plain"],
        "fenced_ratio": us["fenced"] / us["plain"],
    }


def _added(v: dict[str, Any], what: str) -> int | None:
    """What the guard adds to a transaction's ``what`` (round trips, statements)."""
    plain, guarded = v["plain"].get(what), v["guard"].get(what)
    return None if plain is None or guarded is None else guarded - plain


def scenario_guard(backends: list[str], t: Targets, b: Any) -> dict[str, Any]:
    def measure(backend: str, table: str, res: dict[str, Any]) -> None:
        def logged(r: int, v: dict[str, Any]) -> None:
            log(
                f"[guard] round {r + 1}/{b.repeats} {backend}: "
                + ", ".join(f"{s} {v[s]['tx_per_s']:,.0f}" for s in SIDES)
                + " transactions/s"
            )

        workload.repeat_interleaved(
            res,
            lambda: procs.run_one(
                _uncontended,
                (t, backend, table, b.duration, b.max_ops),
                timeout=b.duration * len(SIDES) + 120,
            ),
            b.repeats,
            SIDES,
            ("tx_per_s", "cpu_us_per_tx"),
            ratios,
            logged,
        )
        for side in SIDES:
            last = res["repeats"][-1][side]
            res[side]["round_trips"] = last["round_trips"]
            res[side]["statements"] = last["statements"]
        # the same in every repeat, or the count is not the guard's alone
        for what in ("round_trips", "statements"):
            seen = {_added(x, what) for x in res["repeats"]}
            res[f"guard_{what}"] = seen.pop() if len(seen) == 1 else sorted(seen, key=str)

    return servers.each_store([x for x in backends if x in BACKENDS], t, "guard", "guard", measure)


# -- report -----------------------------------------------------------------------------------
def _trips(v: dict[str, Any], what: str) -> str:
    return " / ".join("–" if v[s][what] is None else str(v[s][what]) for s in SIDES)


def markdown(res: dict[str, Any], repeats: int) -> list[str]:
    lines = [
        "### (guard) what lock.guard(conn) adds to the application's transaction, uncontended",
        "",
        "One process per store and repeat, the lock held throughout; each side is a "
        "transaction on the application's own connection (psycopg 3, PyMySQL, sqlite3) that "
        "writes one row and commits: plain, with lock.guard(conn) first, or with the "
        "dblock.fencing token-column UPDATE instead. Interleaved in 0.1 s slices; "
        f"transactions/s (medians of {repeats} repeats); added time and ratios taken within a "
        "repeat, the median quoted (the repeats' in brackets). Round trips and statements "
        "per transaction (plain / guard / fenced) are counted on one more transaction of each: "
        "PostgreSQL by libpq's protocol trace, MariaDB by PyMySQL's commands and the server's "
        "session Questions, SQLite by its trace callback (in-process: no round trips). The "
        "guard's share is guard minus plain.",
        "",
        "| backend | plain tx/s | guard tx/s | fenced tx/s | guard adds µs/tx (repeats) "
        "| guard ÷ plain time | fenced adds µs/tx | fenced ÷ plain time "
        "| round trips/tx | statements/tx | the guard's round trips | the guard's statements "
        "| client CPU µs/tx |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for backend, v in res.items():
        if "error" in v:
            lines.append(f"| {backend} | error: {v['error'][:100]} |")
            continue
        rates = " | ".join(f"{v[s]['tx_per_s']:,.0f}" for s in SIDES)
        added = ", ".join(f"{x:,.0f}" for x in v["guard_added_us_repeats"])
        cpu = " / ".join(f"{v[s]['cpu_us_per_tx']:,.0f}" for s in SIDES)
        trips = v["guard_round_trips"]
        lines.append(
            f"| {backend} | {rates} | {v['guard_added_us']:,.0f} ({added}) "
            f"| {v['guard_ratio']:.2f}× | {v['fenced_added_us']:,.0f} "
            f"| {v['fenced_ratio']:.2f}× | {_trips(v, 'round_trips')} "
            f"| {_trips(v, 'statements')} | {'–' if trips is None else trips} "
            f"| {v['guard_statements']} | {cpu} |"
        )
    lines.append("")
    return lines


def targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 50: the guard is one statement, one round trip (SQLite: one statement)."""
    out = []
    for backend, v in res.items():
        if "error" in v:
            continue
        trips, stmts = v["guard_round_trips"], v["guard_statements"]
        ok = stmts == 1 and trips in (1, None)
        measured = f"{stmts} statement(s)" + ("" if trips is None else f", {trips} round trip(s)")
        out.append(
            {
                "target": f"(guard) {backend}: the guard adds one statement"
                + ("" if backend == "sqlite" else ", one round trip"),
                "measured": measured,
                "met": ok,
            }
        )
    return out
