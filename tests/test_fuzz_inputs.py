"""Bad-input fuzzing (hypothesis): keys, notes, ttls, timeouts, table names and URLs.

No input may make dblock hang, raise outside its hierarchy (TypeError / ValueError only where
the README says so; ConfigurationError is a ValueError, LockTimeout a TimeoutError), or put a
secret (the password, or the value of a query parameter such as ``sslpassword``) into a
message, ``repr(client)`` or ``client.url``. Servers are reached on loopback only: unreachable
ports are closed loopback ports, and every connect URL carries a short connect_timeout.

Named cases pin what random inputs rarely reach: surrogate keys, a password cut out of a
malformed URL, and MySQL endpoints that accept TCP but never greet.
"""

from __future__ import annotations

import contextlib
import math
import re
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote, quote_plus

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import dblock
from tests._servers import MYSQL_URL, POSTGRESQL_URL, drop_tables, raw_connect

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
#: a dblock call may take this long on bad input before it counts as a hang
BUDGET = 8.0


def timed(fn: Callable[[], Any], budget: float = BUDGET) -> tuple[Any, BaseException | None]:
    """Run fn in a daemon thread; fail the test if it has not returned within budget."""
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:
            out["exc"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(budget)
    if thread.is_alive():
        pytest.fail(f"dblock call still running after {budget} s (hang)")
    return out.get("value"), out.get("exc")


def capture(fn: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    """(value, None) or (None, exception): for oracles, in the calling thread."""
    try:
        return fn(), None
    except Exception as exc:
        return None, exc


def bounded(fn: Callable[[], Any], budget: float = BUDGET) -> Any:
    """Run a whole scenario (locks are thread-bound) in one thread, within budget."""
    value, exc = timed(fn, budget)
    if exc is not None:
        raise exc
    return value


@pytest.fixture(scope="module", autouse=True)
def _drop_fuzz_tables() -> Iterator[None]:
    yield
    for url in (POSTGRESQL_URL, MYSQL_URL):
        with contextlib.suppress(Exception):
            drop_all(url, "fuzz_urls")


def drop_all(url: str, name: str) -> None:
    """The lock table and everything dblock keeps beside it."""
    from dblock.stores._names import aux_name

    drop_tables(url, name)
    with contextlib.closing(raw_connect(url)) as conn:
        q = "`" if url.startswith("mysql") else '"'
        conn.cursor().execute(f"DROP TABLE IF EXISTS {q}{aux_name(name, '_holders')}{q}")


def in_hierarchy(exc: BaseException) -> bool:
    return isinstance(exc, dblock.DBLockError)


@pytest.fixture(scope="module")
def closed_port() -> int:
    """A loopback port nobody listens on (connection refused at once)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


# -- keys -------------------------------------------------------------------------------------
def _key_oracle(key: object) -> type[BaseException] | None:
    if not isinstance(key, str):
        return TypeError
    if not key or len(key) > 255 or "\x00" in key:
        return ValueError
    return None


keys = st.one_of(
    st.text(st.characters(exclude_categories=["Cs"]), max_size=300),
    st.text(
        st.sampled_from(["\x00", "a", "é", "\U0010ffff", " ", "%", "'", '"', "\\"]), max_size=260
    ),
    st.integers(),
    st.binary(max_size=10),
    st.none(),
    st.floats(),
    st.lists(st.text(max_size=3), max_size=2),
)


@FUZZ
@given(key=keys)
def test_keys(client: dblock.Client, key: Any) -> None:
    bounded(lambda: _keys_scenario(client, key))


def _keys_scenario(client: dblock.Client, key: Any) -> None:
    expected = _key_oracle(key)
    lock, exc = capture(lambda: client.lock(key, ttl=5))
    if expected is not None:
        assert isinstance(exc, expected), f"{key!r}: expected {expected.__name__}, got {exc!r}"
        return
    assert exc is None, f"valid key {key!r} refused: {exc!r}"
    got, exc = capture(lambda: lock.acquire(blocking=False))
    assert exc is None, f"acquire({key!r}) raised {exc!r}"
    assert got is True
    info, exc = capture(lambda: client.info(key))
    assert exc is None
    assert info is not None
    assert info.key == key  # round trip, byte for byte
    assert info.token == lock.token
    _, exc = capture(lock.release)
    assert exc is None, f"release({key!r}) raised {exc!r}"


def test_surrogate_key_is_refused_or_works(client: dblock.Client) -> None:
    try:
        lock = client.lock("\ud800", ttl=5)
    except UnicodeError:
        raise
    except ValueError:
        return  # refused up front, as for NUL: fine
    assert lock.acquire(blocking=False)
    lock.release()


# -- ttl and timeouts -------------------------------------------------------------------------
numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=0, max_value=0.3),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 0.0, -0.0, 5e-324, 31_536_000, 31_536_000.000001, 1e308, True, False]),
    st.none(),
    st.text(max_size=3),
    st.sampled_from([[1], {"a": 1}, b"1", 1j]),
)


def _seconds_oracle(value: object, *, ttl: bool) -> type[BaseException] | None:
    if value is None:
        return TypeError if ttl else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return TypeError
    v = float(value)
    if not math.isfinite(v) or v < 0 or (ttl and (v == 0 or v > 31_536_000)):
        return ValueError
    return None


@FUZZ
@given(ttl=numbers, timeout=numbers, wait=numbers)
# a ttl shorter than any round trip: refused by ValueError naming the shortest ttl the store
# confirms, never granted with its lease already over, nor waited on forever (CI drew it once,
# when a grant that came back after its lease was taken for a stalled reply)
@example(ttl=3.1e-59, timeout=None, wait=None)
def test_ttls_and_timeouts(client: dblock.Client, ttl: Any, timeout: Any, wait: Any) -> None:
    bounded(lambda: _ttl_scenario(client, ttl, timeout, wait))


def _ttl_scenario(client: dblock.Client, ttl: Any, timeout: Any, wait: Any) -> None:
    key = "fuzz-" + uuid.uuid4().hex
    # ttl=None is a session hold (API.md § Session locks), not an error, for lock()
    refused = None if ttl is None else _seconds_oracle(ttl, ttl=True)
    expected = refused or _seconds_oracle(timeout, ttl=False)
    lock, exc = capture(lambda: client.lock(key, ttl=ttl, timeout=timeout, reentrant=False))
    if expected is not None:
        assert isinstance(exc, expected), f"ttl={ttl!r} timeout={timeout!r}: got {exc!r}"
        return
    assert exc is None, f"ttl={ttl!r} timeout={timeout!r} refused: {exc!r}"
    # contended: the wait must be bounded by the timeout asked for
    holder = client.lock(key, ttl=30)
    assert holder.acquire(blocking=False)
    wait_error = _seconds_oracle(wait, ttl=False)
    if wait is None or wait_error is not None or float(wait) > 0.3:
        wait = 0.2
    t0 = time.monotonic()
    got, exc = capture(lambda: lock.acquire(timeout=wait))
    assert exc is None, f"acquire(timeout={wait!r}) raised {exc!r}"
    assert got is False
    assert time.monotonic() - t0 < float(wait) + 2.0
    holder.release()
    # uncontended: taken soon (a try without waiting may find its grant came back too late in
    # a lease about as short as the round trip: not usable), or, for a ttl the store's replies
    # do not confirm, refused by ValueError naming the shortest they do; a tiny ttl may have
    # expired by the release (LockLost)
    got, exc = capture(lambda: lock.acquire(timeout=5))
    if isinstance(exc, ValueError) and not isinstance(exc, dblock.DBLockError):
        assert float(ttl) < 0.05 and "the shortest ttl it confirms" in str(exc), repr(exc)
        assert client.info(key) is None
        return
    assert exc is None, f"acquire(ttl={ttl!r}) raised {exc!r}"
    assert got is True
    _, exc = capture(lock.release)
    assert exc is None or isinstance(exc, dblock.LockLost), f"release raised {exc!r}"


@FUZZ
@given(wait=numbers)
def test_acquire_timeout_argument(client: dblock.Client, wait: Any) -> None:
    bounded(lambda: _timeout_scenario(client, wait))


def _timeout_scenario(client: dblock.Client, wait: Any) -> None:
    lock = client.lock("fuzz-" + uuid.uuid4().hex, ttl=5)
    expected = None if wait is None else _seconds_oracle(wait, ttl=False)
    got, exc = capture(lambda: lock.acquire(timeout=wait))
    if expected is not None:
        assert isinstance(exc, expected), f"acquire(timeout={wait!r}): got {exc!r}"
        return
    assert exc is None
    assert got is True
    lock.release()


# -- notes and purge ages ---------------------------------------------------------------------
notes = st.one_of(
    st.none(),
    st.text(max_size=20),  # lone surrogates included
    st.text(st.sampled_from(["\x00", "a", "\ud800", "\udfff", "é", "\U0010ffff"]), max_size=8),
    st.integers(min_value=4090, max_value=4100).map(lambda n: "n" * n),
    st.integers(),
    st.binary(max_size=4),
)


def _note_oracle(note: object) -> type[BaseException] | None:
    if note is None:
        return None
    if not isinstance(note, str):
        return TypeError
    if len(note) > 4096 or "\x00" in note or any(0xD800 <= ord(c) <= 0xDFFF for c in note):
        return ValueError
    return None


@FUZZ
@given(note=notes)
def test_notes(client: dblock.Client, note: Any) -> None:
    bounded(lambda: _note_scenario(client, note))


def _note_scenario(client: dblock.Client, note: Any) -> None:
    key = "fuzz-" + uuid.uuid4().hex
    expected = _note_oracle(note)
    once, exc = capture(lambda: client.once(key, ttl=5, note=note))
    if expected is not None:
        assert isinstance(exc, expected), f"note {note!r}: expected {expected.__name__}, {exc!r}"
        assert not isinstance(exc, UnicodeError), f"note {note!r}: a codec's error, {exc!r}"
        return
    assert exc is None, f"valid note {note!r} refused: {exc!r}"
    _, exc = capture(once.__enter__)
    assert exc is None, f"once(note={note!r}) raised {exc!r}"
    once.__exit__(None, None, None)
    assert client.state(key) == "succeeded"


@FUZZ
@given(older_than=numbers)
def test_purge_ages(client: dblock.Client, older_than: Any) -> None:
    expected = _seconds_oracle(older_than, ttl=False) if older_than is not None else TypeError
    purged, exc = timed(lambda: client.purge(older_than))
    if expected is not None:
        assert isinstance(exc, expected), f"purge({older_than!r}): got {exc!r}"
        return
    assert exc is None, f"purge({older_than!r}) raised {exc!r}"
    assert isinstance(purged, int)
    assert purged >= 0


@settings(FUZZ, max_examples=30)
@given(value=st.one_of(numbers, st.integers(min_value=-2, max_value=12)))
def test_max_connections_values(tmp_path_factory: Any, value: Any) -> None:
    url = f"sqlite:///{tmp_path_factory.mktemp('p')}/p.db"
    valid = value is None or (type(value) is int and 1 <= value <= 10_000)
    client, exc = timed(lambda: dblock.connect(url, max_connections=value))
    if not valid:
        assert isinstance(exc, dblock.ConfigurationError), f"{value!r}: got {exc!r}"
        return
    assert exc is None, f"max_connections={value!r} refused: {exc!r}"
    try:
        lock = client.lock("k", ttl=5)
        assert lock.acquire(blocking=False)
        lock.release()
    finally:
        client.close()


# -- table names ------------------------------------------------------------------------------
def _table_ok(name: object) -> bool:
    if not isinstance(name, str):
        return False
    parts = name.split(".")
    return len(parts) <= 2 and all(IDENTIFIER.fullmatch(p) for p in parts)


tables = st.one_of(
    st.text(max_size=70),
    st.from_regex(r"\Afz_[A-Za-z0-9_]{1,20}\Z"),
    st.from_regex(r"\Anosuch_[a-z0-9]{1,8}\.fz_[a-z0-9_]{1,20}\Z"),
    st.sampled_from(
        [
            "select",
            "order",
            "user",
            "T" * 63,
            "T" * 64,
            "a.b.c",
            ".t",
            "t.",
            "1t",
            "t-1",
            "t;drop table x",
            't"',
            "t`",
            "\uff54",
            "t\x00",
        ]
    ),
    st.integers(),
    st.none(),
)


@settings(FUZZ, max_examples=40)
@given(name=tables)
def test_table_names(db_url: str, name: Any) -> None:
    bounded(lambda: _table_scenario(db_url, name))


def _table_scenario(db_url: str, name: Any) -> None:
    valid = _table_ok(name)
    client, exc = capture(lambda: dblock.connect(db_url, table=name))
    try:
        if not valid:
            assert isinstance(exc, dblock.ConfigurationError), f"table {name!r}: got {exc!r}"
            return
        if exc is not None:  # e.g. a schema that does not exist: dblock's error, not a driver's
            assert in_hierarchy(exc), f"table {name!r}: {exc!r} is outside dblock's hierarchy"
            return
        lock = client.lock("k", ttl=5)
        assert lock.acquire(blocking=False)
        lock.release()
    finally:
        if client is not None:
            client.close()
        if valid and "." not in name:
            drop_all(db_url, name)


# -- URLs -------------------------------------------------------------------------------------
no_nul = st.characters(exclude_characters=["\x00"], exclude_categories=["Cs"])
#: passwords start with a marker so the leak check does not match ordinary words
passwords = st.builds(lambda s: "Pw9" + s, st.text(no_nul, min_size=5, max_size=16))
query_values = st.one_of(
    st.sampled_from(
        ["1", "0", "-1", "abc", "", "1.5", "99999999999", "nan", "inf", "-5", "1e300", "1e-300"]
    ),
    st.text(no_nul, max_size=5),
)
#: query parameters that carry secrets: libpq's, PyMySQL's, and names that look like one
SECRET_PARAMS = [
    "password",
    "sslpassword",
    "passwd",
    "pwd",
    "PASSWORD",
    "sslkey",
    "ssl_key",
    "passfile",
    "auth_token",
    "api_key",
    "client_secret",
]


@st.composite
def urls(draw: st.DrawFn, closed_port: int) -> tuple[str, list[str]]:
    scheme = draw(
        st.sampled_from(
            [
                "postgresql",
                "postgres",
                "mysql",
                "mariadb",
                "sqlite",
                "MYSQL",
                "http",
                "mysql+pymysql",
            ]
        )
    )
    user = draw(st.text(no_nul, max_size=8))
    password = draw(passwords)
    host = draw(st.sampled_from(["127.0.0.1", "localhost", "[::1]", "[::1", ""]))
    port = draw(st.sampled_from([str(closed_port), "5432", "3306", "0", "65536", "-1", "x", ""]))
    db = draw(st.text(no_nul, max_size=8))
    encode = draw(st.booleans())
    if encode:
        user, password_part, db = quote(user, safe=""), quote(password, safe=""), quote(db)
    else:  # raw, minus the characters that end the authority part of a URL
        password = password.translate({ord(c): None for c in "/?#[]%"})
        password_part = password
        user = user.translate({ord(c): None for c in "/?#[]%@:"})
    netloc = f"{user}:{password_part}@{host}" + (f":{port}" if port else "")
    params = draw(
        st.dictionaries(
            st.sampled_from(
                [
                    "connect_timeout",
                    "read_timeout",
                    "timeout",
                    "application_name",
                    "sslmode",
                    "foo",
                    "init_command",
                    "max_connections",
                ]
            ),
            query_values,
            max_size=3,
        )
    )
    params.setdefault("connect_timeout", "1")
    if params["connect_timeout"] not in ("1", "abc", "x", "-1", "0", "nan"):
        params["connect_timeout"] = "1"  # never wait long on loopback
    query = "&".join(f"{quote(k)}={quote(v, safe='')}" for k, v in params.items())
    secrets = [password]
    for name in draw(st.lists(st.sampled_from(SECRET_PARAMS), max_size=3, unique=True)):
        secret = draw(passwords)
        if draw(st.booleans()):
            value = quote(secret, safe="")
        else:  # raw, minus what ends a query value ('+' stays: it reads as a space)
            secret = secret.translate({ord(c): None for c in "&#%"})
            value = secret
        secrets.append(secret)
        query += f"&{name}={value}"
    if not draw(st.booleans()):  # no password in the user part: only the query's
        netloc = f"{user}@{host}" + (f":{port}" if port else "")
        secrets.remove(password)
    return f"{scheme}://{netloc}/{db}?{query}", secrets


def _check_no_leak(exc: BaseException, password: str | list[str]) -> None:
    texts = [str(exc), repr(exc), getattr(exc, "message", "")]
    # the whole chain, as a logged traceback would show it
    texts.append("".join(traceback.format_exception(exc)))
    _check_texts(texts, password)


def _check_texts(texts: list[str], secrets: str | list[str]) -> None:
    for secret in [secrets] if isinstance(secrets, str) else secrets:
        forms = {secret, quote(secret, safe=""), quote(secret), quote_plus(secret)}
        for text in texts:
            for form in forms:
                assert form not in text, f"secret {secret!r} shown: {text[:300]!r}"


@settings(FUZZ, max_examples=80)
@given(data=st.data())
def test_urls(closed_port: int, data: st.DataObject, tmp_path_factory: Any) -> None:
    url, secrets = data.draw(urls(closed_port))
    create = data.draw(st.booleans())
    if url.lower().startswith("sqlite"):
        # a file URL: keep it inside a temporary directory
        url = "sqlite:///" + str(tmp_path_factory.mktemp("u")) + "/f.db?" + url.partition("?")[2]
    client, exc = timed(lambda: dblock.connect(url, table="fuzz_urls", create_schema=create))
    if client is not None:
        try:
            _check_texts([client.url, repr(client)], secrets)
        finally:
            client.close()
        return
    assert exc is not None
    assert in_hierarchy(exc), f"{url!r}: {type(exc).__name__}: {exc}"
    _check_no_leak(exc, secrets)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://user:Sekr1t/x@127.0.0.1:1/db",  # unencoded '/' in the password
        "mysql://user:Sekr1t?x@127.0.0.1:1/db",  # unencoded '?'
        "postgresql://user:Sekr1t#x@127.0.0.1:1/db",  # unencoded '#'
        "postgresql:/user:Sekr1t@127.0.0.1:1/db",  # one slash too few
        "mysql//user:Sekr1t@127.0.0.1:1/db",  # no colon after the scheme
        "://user:Sekr1t@127.0.0.1:1/db",  # no scheme
        "postgresql://us#er:Sekr1t@127.0.0.1:1/db",  # unencoded '#' in the user name
    ],
)
def test_malformed_url_does_not_echo_password(url: str) -> None:
    with pytest.raises(dblock.DBLockError) as info:
        dblock.connect(url + "?connect_timeout=1")
    assert "Sekr1t" not in str(info.value)


@pytest.mark.parametrize(
    "url",
    [
        # dblock accepts the scheme in any case, libpq does not: it parses the whole URL as a
        # conninfo keyword and quotes it, password included
        "PostgreSQL://u:Pw9secret@127.0.0.1:{port}/db?connect_timeout=1",
        # an unencoded '%' in the password: libpq quotes the bad percent-encoded token
        "postgresql://u:Pw9secret%@127.0.0.1:{port}/db?connect_timeout=1",
    ],
)
def test_driver_error_in_the_chain_has_no_password(closed_port: int, url: str) -> None:
    with pytest.raises(dblock.BackendError) as info:
        dblock.connect(url.format(port=closed_port))
    assert "Pw9secret" not in str(info.value)  # dblock's own message is clean
    _check_no_leak(info.value, "Pw9secret")


# -- servers that accept a connection and then say nothing ------------------------------------
@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that completes the TCP handshake (backlog) and never sends a byte."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    yield int(s.getsockname()[1])
    s.close()  # resets the pending connections: a blocked client wakes up


def test_postgresql_silent_server_times_out(silent_port: int) -> None:
    url = f"postgresql://u:Pw9secret@127.0.0.1:{silent_port}/db?connect_timeout=2"
    client, exc = timed(lambda: dblock.connect(url), budget=BUDGET)
    assert client is None
    assert isinstance(exc, dblock.BackendError)
    _check_no_leak(exc, "Pw9secret")


def test_mysql_silent_server_times_out(silent_port: int) -> None:
    url = f"mysql://u:Pw9secret@127.0.0.1:{silent_port}/db?connect_timeout=2"
    client, exc = timed(lambda: dblock.connect(url), budget=BUDGET)
    assert client is None
    assert isinstance(exc, dblock.BackendError)
