"""Bad input is refused before any SQL runs, with the documented error classes."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

import dblock
from dblock._timing import Backoff
from dblock._validate import check_key, check_table, check_ttl

# An address nothing listens on: if any SQL ran, we would see BackendError, not the error asked.
UNREACHABLE = "postgresql://u:s3cret-pw@127.0.0.1:1/db?connect_timeout=2"


@pytest.fixture
def sqlite_client(tmp_path):  # type: ignore[no-untyped-def]
    with dblock.connect(f"sqlite:///{tmp_path}/v.sqlite3") as c:
        yield c


@pytest.mark.parametrize("key", [None, 42, b"bytes", ["k"]])
def test_non_str_key_is_type_error(sqlite_client: dblock.Client, key: object) -> None:
    with pytest.raises(TypeError):
        sqlite_client.lock(key)  # type: ignore[arg-type]


@pytest.mark.parametrize("key", ["", "x" * 256, "a\x00b"])
def test_bad_key_is_value_error(sqlite_client: dblock.Client, key: str) -> None:
    with pytest.raises(ValueError):
        sqlite_client.lock(key)
    with pytest.raises(ValueError):
        sqlite_client.info(key)


@pytest.mark.parametrize("ttl", [0, -1, math.nan, math.inf, -math.inf, 31_536_000.5])
def test_bad_ttl_is_value_error(sqlite_client: dblock.Client, ttl: float) -> None:
    with pytest.raises(ValueError):
        sqlite_client.lock("k", ttl=ttl)


def test_ttl_of_one_year_is_accepted(sqlite_client: dblock.Client) -> None:
    assert sqlite_client.lock("k", ttl=31_536_000).ttl == 31_536_000


@pytest.mark.parametrize("timeout", [-1, math.nan])
def test_bad_timeout(sqlite_client: dblock.Client, timeout: float) -> None:
    with pytest.raises(ValueError):
        sqlite_client.lock("k", timeout=timeout)
    lock = sqlite_client.lock("k")
    with pytest.raises(ValueError):
        lock.acquire(timeout=timeout)


@pytest.mark.parametrize(
    "table",
    ["", "1abc", "a-b", "a b", "x" * 64, "a.b.c", "t;DROP TABLE x", 'a"b', "a.", "ä"],
)
def test_bad_table_names_raise_before_any_sql(table: str) -> None:
    with pytest.raises(dblock.ConfigurationError, match="table"):
        dblock.connect(UNREACHABLE, table=table)


def test_good_table_names() -> None:
    assert check_table("x" * 63) == (None, "x" * 63)
    assert check_table("_s1.T_2") == ("_s1", "T_2")


@pytest.mark.parametrize(
    "url",
    ["mongo://localhost", "nonsense", "sqlite://host/x.db", "sqlite:///", "mysql://h:notaport/db"],
)
def test_bad_urls_are_configuration_errors(url: str) -> None:
    with pytest.raises(dblock.ConfigurationError):
        dblock.connect(url)


@pytest.mark.parametrize(
    "url",
    [UNREACHABLE, "mysql://u:s3cret-pw@127.0.0.1:1/db?connect_timeout=2"],
)
def test_unreachable_database_is_backend_error_without_password(url: str) -> None:
    with pytest.raises(dblock.BackendError) as info:
        dblock.connect(url)
    message = str(info.value)
    assert "s3cret-pw" not in message
    assert "127.0.0.1:1" in message
    assert info.value.__cause__ is not None


def test_unknown_url_parameter_is_named() -> None:
    with pytest.raises(dblock.ConfigurationError, match="bogus"):
        dblock.connect("mysql://root@127.0.0.1/test?bogus=1")


@given(st.text(max_size=300))
def test_key_validation_matches_the_contract(key: str) -> None:
    valid = 0 < len(key) <= 255 and "\x00" not in key
    if valid:
        assert check_key(key) == key
    else:
        with pytest.raises(ValueError):
            check_key(key)


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_ttl_validation_matches_the_contract(ttl: float) -> None:
    if math.isfinite(ttl) and 0 < ttl <= 31_536_000:
        assert check_ttl(ttl) == ttl
    else:
        with pytest.raises(ValueError):
            check_ttl(ttl)


@given(
    st.floats(min_value=1e-4, max_value=1.0),
    st.floats(min_value=1.0, max_value=10.0),
    st.integers(min_value=1, max_value=50),
)
def test_backoff_stays_within_bounds_and_reaches_the_cap(
    base: float, factor: float, n: int
) -> None:
    cap = base * factor
    backoff = Backoff(base, cap)
    sleeps = [backoff.next() for _ in range(n)]
    assert all(base <= s <= cap for s in sleeps)
