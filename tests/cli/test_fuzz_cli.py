"""Fuzzing the command line (hypothesis): commands, options, keys with control characters,
ttl/timeout strings, URLs with secrets in them, bad and foreign tables (issue 29).

Every invocation ends within a bounded time with a documented exit status (0, 1, 2, 69, 70,
75, or CMD's), shows no traceback unless --debug is given, and never prints a secret that was
in its input. Where the outcome is known (a bad argument, table, key or URL: 2; a server that
cannot be reached: 69) the status must be exactly that. It runs ``dblock.cli.main`` in
process, on SQLite and on the test servers, with ``true``/``false`` as CMD; a few real
subprocesses check the same from outside.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from dblock.cli import main
from dblock.cli.supervisor import shortest_ttl
from tests._servers import MYSQL_URL, POSTGRESQL_URL, drop_tables, raw_connect, reachable

DOCUMENTED = {0, 1, 2, 69, 70, 75, 126, 127}
#: generous bound on one invocation: a hang, not a performance figure
BUDGET = 60.0
FUZZ = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
SERVERS = {"postgresql": POSTGRESQL_URL, "mysql": MYSQL_URL}
VALID_TABLES = ["fz_locks", "fz_other"]
APP_TABLE = "fz_app_orders"  # an application's table: dblock must refuse it
BAD_TABLES = ["", "1abc", "a.b.c", "x;drop table y", "a" * 64, "t\x00", "t\x1b[2J", "t-x"]
NUMBERS = [
    "nan", "NaN", "inf", "-inf", "-5", "0", "1e300", "1e-300", "1e309", "abc", "", " 5 ",
    "5", "0.5", "3e7", "31536001", "-0", "0x10", "1_000",
]  # fmt: skip
HOSTILE_KEYS = [
    "",
    "k" * 256,
    "a\x00b",
    "\x1b[2J\x1b]0;pwned\x07",
    "\u202eevil",
    "\x9b31m",
    "line\u2028sep",
    "\udcff",  # a byte of the command line that is not UTF-8, as Python decodes argv
    "-dash",  # click takes it for an option: exit 2
    " ",
]
PREFIXES = ["", "k", "\x1b[2J", "a\x00b", "\udcff", "k" * 256, "\u202e"]
SECRET = st.from_regex(r"Zq9[a-zA-Z0-9]{10}", fullmatch=True)


@dataclass
class Case:
    """One generated invocation and what is known about its outcome."""

    argv: list[str] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)
    expect: set[int] | None = None  # None: any documented status
    extra_codes: set[int] = field(default_factory=set)
    debug: bool = False


def _number(draw: st.DrawFn, clean: bool) -> tuple[str, bool, bool]:
    """(text, valid as a ttl, valid as a wait); a valid one for both if ``clean``."""
    numbers = st.one_of(st.sampled_from(NUMBERS), st.floats().map(repr))
    text = draw(st.sampled_from(["5", "30", "0.5", "3e7", "1e-300"]) if clean else numbers)
    try:
        value = float(text)
    except ValueError:
        return text, False, False
    finite = math.isfinite(value)
    return text, finite and 0 < value <= 31_536_000, finite and value >= 0


def _key_valid(key: str) -> bool:
    """A key as the library allows it, that click also takes for an argument (not an option)."""
    if not key or len(key) > 255 or "\x00" in key or key.startswith("-"):
        return False
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@st.composite
def cases(  # noqa: PLR0912 - one grammar
    draw: st.DrawFn, db_file: str, servers: tuple[str, ...]
) -> Case:
    case = Case()
    bad = False  # a mistake in what was given: exit 2
    secret = draw(SECRET)
    # half the cases make no mistake, so that the commands' own paths run often too
    clean = draw(st.booleans())

    def pick(options: list[str], bad_ones: tuple[str, ...] = ()) -> str:
        return draw(st.sampled_from([o for o in options if not clean or o not in bad_ones]))

    # -- where --------------------------------------------------------------------------
    kind = pick(
        ["sqlite", "sqlite", "sqlite-param", "unreachable", "bad-url", *servers],
        ("sqlite-param", "bad-url"),
    )
    connects_to: str | None = None  # "unreachable", "refused" or a dialect
    param_bad = False  # a URL parameter the commands that connect refuse
    url: str | None
    if kind == "sqlite":
        url = f"sqlite:///{db_file}"
        connects_to = "sqlite"
    elif kind == "sqlite-param":
        value = draw(st.sampled_from(["nan", "inf", "-5", "1e300", "abc", "0.5", "5"]))
        url = f"sqlite:///{db_file}?timeout={value}"
        connects_to = "sqlite"
        # refused by the commands that connect (`schema` only reads the URL's dialect)
        param_bad = value in ("abc", "nan", "inf", "-5", "1e300")
    elif kind == "unreachable":
        scheme = draw(st.sampled_from(["postgresql", "mysql"]))
        url = f"{scheme}://dbuser:{secret}@127.0.0.1:1/db"
        if draw(st.booleans()):  # a secret in a query parameter is hidden too
            name = draw(st.sampled_from(["password", "sslpassword"]))
            url = f"postgresql://dbuser@127.0.0.1:1/db?{name}={secret}"
        case.secrets.append(secret)
        connects_to = "unreachable"
    elif kind == "bad-url":
        url = draw(
            st.sampled_from(
                [
                    "mongodb://127.0.0.1:27017/0",
                    f"postgresql://u:{secret}@[::1",
                    f"mysql://u:{secret}@h:99999/x",
                    f"postgresql://u:{secret}@host:port/x",
                    "sqlite://host/x.db",
                    "sqlite:///",
                    "",
                    "nonsense",
                    f"postgresql://u:{secret}@h/x\x1b[2J",
                    f"mysql://u:{secret}@127.0.0.1:1/x?foo=1",
                ]
            )
        )
        case.secrets.append(secret)
        bad = True
    else:
        base = SERVERS[kind]
        scheme, rest = base.split("://", 1)
        userinfo, where = rest.split("@", 1)
        if kind == "mysql":  # a wrong password: refused for good by the server, 2, never shown
            url = f"{scheme}://{userinfo}:{secret}@{where}"
            connects_to = "refused"
        else:  # trust authentication: the password is not even asked for
            url = f"{scheme}://{userinfo}:{secret}@{where}?connect_timeout=5"
            connects_to = kind
        case.secrets.append(secret)
    if url is not None:
        case.argv += ["--url", url]

    # -- which table --------------------------------------------------------------------
    table_kind = pick(["default", "valid", "valid", "bad", "foreign"], ("bad",))
    table = "dblock_locks"
    if table_kind == "valid":
        table = draw(st.sampled_from(VALID_TABLES))
    elif table_kind == "bad":
        table = draw(st.sampled_from(BAD_TABLES))
        bad = True
    elif table_kind == "foreign":
        table = APP_TABLE
    if connects_to in ("postgresql", "mysql") and table == "dblock_locks":
        table = VALID_TABLES[0]  # never the shared servers' default table
    if table_kind != "default" or connects_to in ("postgresql", "mysql"):
        case.argv += ["--table", table]
    if draw(st.integers(0, 9)) == 0:
        case.argv.append("--debug")
        case.debug = True

    # -- what ---------------------------------------------------------------------------
    command = pick(
        ["run", "run", "once", "list", "info", "release", "purge", "schema", "nonsense"],
        ("nonsense",),
    )
    connects = command not in ("schema", "nonsense")
    bad |= param_bad and connects
    read_only = command in ("list", "info")
    args: list[str] = [command]
    key = draw(
        st.one_of(
            st.sampled_from([k for k in HOSTILE_KEYS if not clean or _key_valid(k)]),
            st.text(max_size=12).filter(lambda k: not clean or _key_valid(k)),
            st.from_regex(r"[a-z][a-z0-9:._-]{0,20}", fullmatch=True),
        )
    )
    if command == "once":
        # a key once ran successfully is never free for a lock again (until purged): a run
        # without a timeout on it would wait for ever, so the two never share a key here
        key = "once:" + key
    key_bad = not _key_valid(key)
    if command == "nonsense":
        bad = True
    elif command in ("run", "once"):
        if draw(st.booleans()):
            text, ttl_ok, _ = _number(draw, clean)
            args += ["--ttl", text]
            # CMD must be dead before the lease can end: too short a lease leaves no time
            bad |= not ttl_ok or float(text) < shortest_ttl(None)
        if command == "run":
            wait = pick(["none", "no-wait", "timeout", "both"], ("both",))
            if wait in ("timeout", "both"):
                text, _, wait_ok = _number(draw, clean)
                args += ["--timeout", text]
                bad |= not wait_ok
            if wait in ("no-wait", "both"):
                args.append("--no-wait")
            bad |= wait == "both"
            if draw(st.booleans()):
                code = pick(["0", "3", "255", "256", "-1", "x"], ("256", "-1", "x"))
                args += ["--conflict-exit-code", code]
                if code in ("0", "3", "255"):
                    case.extra_codes.add(int(code))
                else:
                    bad = True
        elif draw(st.booleans()):
            note = pick(["payout", "a\x00b", "\udcff", "\x1b[2J", "é" * 40], ("a\x00b", "\udcff"))
            args += ["--note", note]
            bad |= note in ("a\x00b", "\udcff")
        cmd = draw(st.sampled_from([["true"], ["false"], ["/nonexistent/cmd"], [db_file]]))
        args += [key, "--", *cmd]
        bad |= key_bad
    elif command == "list":
        if draw(st.booleans()):
            prefix = pick(PREFIXES, ("a\x00b", "\udcff", "k" * 256))
            args += ["--prefix", prefix]
            bad |= bool(prefix) and not _key_valid(prefix)
        if draw(st.booleans()):
            args.append("--json")
    elif command in ("info", "release"):
        args += [key]
        bad |= key_bad
        if command == "info" and draw(st.booleans()):
            args.append("--json")
        if command == "release":
            force = clean or draw(st.booleans())
            args += ["--force"] if force else []
            bad |= not force
    elif command == "purge":
        if draw(st.booleans()):
            text, _, wait_ok = _number(draw, clean)
            args += ["--older-than", text]
            bad |= not wait_ok or (wait_ok and float(text) > 100 * 365.25 * 86400)
        if draw(st.booleans()):
            args.append("--include-once")
    elif command == "schema" and draw(st.booleans()):
        dialect = pick(["postgresql", "mysql", "sqlite", "oracle", ""], ("oracle", ""))
        args += ["--dialect", dialect]
        bad |= dialect not in ("postgresql", "mysql", "sqlite")
    case.argv += args

    # -- what must happen ---------------------------------------------------------------
    if bad:  # every one of these is refused before connecting
        case.expect = {2}
    elif connects and connects_to == "unreachable":
        case.expect = {69}
    elif connects and connects_to == "refused":
        case.expect = {2}
    elif connects and table == APP_TABLE:
        case.expect = {2}  # not dblock's table
    elif command == "schema":
        case.expect = {0}
    elif read_only:
        case.expect = {0, 1, 2}  # 2: the lock table does not exist (yet)
    return case


def invoke(argv: list[str]) -> tuple[int, str, str, float]:
    """``dblock argv`` in this process: status, stdout, stderr, seconds taken."""
    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue(), time.monotonic() - started


def check(case: Case, code: int, out: str, err: str, seconds: float) -> None:
    shown = f"argv={case.argv!r}\nstatus={code}\nstdout={out!r}\nstderr={err!r}"
    assert seconds < BUDGET, shown
    assert code in DOCUMENTED | case.extra_codes, shown
    if case.expect is not None:
        assert code in case.expect, shown
    if not case.debug:
        assert "Traceback" not in err, shown
    for secret in case.secrets:
        assert secret not in out and secret not in err, shown
    if code == 69 and not case.debug:
        lines = [line for line in err.splitlines() if "warning: --url" not in line]
        assert len(lines) == 1 and lines[0].startswith("dblock: database unavailable: "), shown


@pytest.fixture(scope="module")
def servers() -> tuple[str, ...]:
    return tuple(d for d, url in SERVERS.items() if reachable(url) is None)


@pytest.fixture(scope="module")
def db_file(tmp_path_factory: pytest.TempPathFactory, servers: tuple[str, ...]) -> Iterator[str]:
    """A SQLite file with an application's table in it; the servers get one too."""
    path = tmp_path_factory.mktemp("fuzz") / "locks.sqlite3"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute(f"CREATE TABLE {APP_TABLE} (id INTEGER PRIMARY KEY, sku TEXT)")
        conn.commit()
    made = []
    for dialect in servers:
        url = SERVERS[dialect]
        conn = raw_connect(url)
        try:
            conn.cursor().execute(
                f"CREATE TABLE IF NOT EXISTS {APP_TABLE} (id INTEGER PRIMARY KEY, sku TEXT)"
            )
        finally:
            conn.close()
        made.append(url)
    yield str(path)
    for url in made:
        for name in (*VALID_TABLES, APP_TABLE):
            drop_tables(url, name)


@FUZZ
@given(data=st.data())
def test_fuzz_cli(db_file: str, servers: tuple[str, ...], data: st.DataObject) -> None:
    case = data.draw(cases(db_file, servers))
    code, out, err, seconds = invoke(case.argv)
    event(f"status {code}")
    check(case, code, out, err, seconds)


#: (argv, the secret in it, the status)
SUBPROCESS_CASES = [
    (["--url", "postgresql://dbuser:Zq9SubProc01@127.0.0.1:1/db", "list"], "Zq9SubProc01", 69),
    (
        ["--url", "mysql://dbuser:Zq9SubProc02@127.0.0.1:1/db", "info", "\x1b[2J\u202ek"],
        "Zq9SubProc02",
        69,
    ),
    (["--url", "postgresql://u:Zq9SubProc03@[::1", "run", "k", "--", "true"], "Zq9SubProc03", 2),
    (
        ["--debug", "--url", "postgresql://dbuser:Zq9SubProc04@127.0.0.1:1/db", "purge"],
        "Zq9SubProc04",
        69,
    ),
]


@pytest.mark.parametrize(
    ("argv", "secret", "status"), SUBPROCESS_CASES, ids=range(len(SUBPROCESS_CASES))
)
def test_real_process(argv: list[str], secret: str, status: int) -> None:
    """The same invariants from outside: a real `python -m dblock`, its real streams."""
    done = subprocess.run(
        [sys.executable, "-m", "dblock", *argv],
        capture_output=True,
        text=True,
        timeout=BUDGET,
        stdin=subprocess.DEVNULL,
        env={k: v for k, v in os.environ.items() if k != "DBLOCK_URL"},
        check=False,
    )
    case = Case(argv=argv, secrets=[secret], expect={status}, debug="--debug" in argv)
    check(case, done.returncode, done.stdout, done.stderr, 0.0)


def test_secret_detector_works() -> None:
    """The oracle itself: a leak is caught."""
    case = Case(argv=["x"], secrets=["Zq9leak"])
    with pytest.raises(AssertionError):
        check(case, 69, "", "dblock: database unavailable: Zq9leak\n", 0.0)
