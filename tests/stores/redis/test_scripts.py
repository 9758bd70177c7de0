"""Each operation is one function of dblock's library (FCALL), or its script (EVALSHA) where the
server has no functions or the user may not use them, on the server's clock; list and purge
walk the table's prefix with SCAN; tables do not collide."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

import dblock
from tests._private_servers import PrivateServer, private_redis
from tests._servers import raw_redis
from tests.stores.redis.conftest import command_calls


@pytest.fixture
def operations() -> str:
    """These tests ask for functions or scripts themselves (the server's own way)."""
    return "functions"


@pytest.mark.parametrize(
    ("denied", "sent"),
    [("", "fcall"), ("-fcall", "evalsha"), ("-function", "evalsha")],
    ids=["functions", "user-may-not-call-functions", "user-may-not-load-functions"],
)
def test_every_operation_is_one_call_that_reads_the_servers_clock(
    server: PrivateServer, denied: str, sent: str
) -> None:
    """The server's statistics count what the client sent and what ran inside it: one TIME
    per operation, nothing else from the client. The operation is its function (FCALL); its
    script (EVALSHA) where the user may not call functions or load them."""
    raw = raw_redis(server.url)
    url = server.url
    if denied:
        raw.execute_command("ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", denied)
        url = url.replace("redis://", "redis://app:pw@")
    with dblock.connect(url, table="ops") as client:
        warm = client.lock("warm", ttl=5)
        with warm:  # connects, and loads what it calls (the library, or scripts after NOSCRIPT)
            warm.renew()
        raw.config_resetstat()
        lock = client.lock("k", ttl=5)
        for _ in range(10):
            assert lock.acquire(blocking=False)
            lock.renew()
            lock.release()
        calls = command_calls(raw)
    functions = raw.execute_command("FUNCTION", "LIST")
    raw.close()
    assert calls.pop(sent) == 30
    assert calls.pop("time") == 30
    calls.pop("config|resetstat", None)
    calls.pop("info", None)
    inside = {"hget", "hgetall", "hmget", "hset", "hdel", "publish", "zrange"}
    assert set(calls) <= inside, f"commands besides one {sent.upper()} per operation: {calls}"
    # the library is loaded only where its functions are called
    assert len(functions) == (0 if denied else 1)


@pytest.mark.parametrize("six", [False, True], ids=["fcall-renamed-away", "redis-6.2"])
def test_a_server_without_functions_runs_every_operation_as_a_script(
    tmp_path: Path, six: bool
) -> None:
    """A server before Redis 7 (Redis 6.2 itself, and a Redis 7 with FCALL and FUNCTION renamed
    away, which answers as it does: an unknown command): scripts, and the contract holds (the
    contract suite's tests of what depends on the server also run on Redis 6.2:
    tests/stores/redis/provider.py)."""
    options = () if six else ("--rename-command", "FCALL", "", "--rename-command", "FUNCTION", "")
    with private_redis(tmp_path, options=options, six=six) as server:
        raw = raw_redis(server.url)
        assert raw.info("server")["redis_version"].startswith("6.2." if six else "7.")
        with (
            dblock.connect(server.url, table="old") as client,
            dblock.connect(server.url, table="old") as other,
        ):
            lock = client.lock("k", ttl=5)
            raw.config_resetstat()
            with lock:
                assert not other.lock("k").acquire(blocking=False)
                lock.renew()
            assert other.lock("k").acquire(blocking=False)
            calls = command_calls(raw)
        raw.close()
    assert calls.get("evalsha", 0) >= 4 and "fcall" not in calls


def test_a_server_that_forgot_the_functions_or_scripts_is_given_them_again(
    server: PrivateServer,
) -> None:
    """FUNCTION FLUSH or SCRIPT FLUSH (as after a restart): the next call loads the library
    (or the script), and the operation still runs once."""
    raw = raw_redis(server.url)
    with dblock.connect(server.url, table="flush") as client:
        lock = client.lock("k", ttl=5)
        with lock:
            raw.execute_command("FUNCTION", "FLUSH")
            raw.script_flush()
            raw.config_resetstat()
            lock.renew()
            reloaded = command_calls(raw)
        raw.execute_command("FUNCTION", "FLUSH")
        with lock:
            assert [i.owner for i in client.list("k")] == [lock.owner]
        assert client.info("k") is None
    raw.close()
    # the renewal: FCALL, not found; FUNCTION LOAD; FCALL again (which renewed)
    assert reloaded.get("fcall") == 2 and reloaded.get("function|load") == 1
    assert reloaded.get("hset") == 1


def test_list_and_purge_scan_and_never_use_keys(server: PrivateServer) -> None:
    raw = raw_redis(server.url)
    with dblock.connect(server.url, table="walk") as client:
        held = [client.lock(f"job:{i}", ttl=30) for i in range(3)]
        for lock in held:
            lock.acquire()
        with client.lock("other", ttl=30):
            pass
        raw.config_resetstat()
        assert [i.key for i in client.list("job:")] == ["job:0", "job:1", "job:2"]
        assert client.purge(older_than=0) == 1  # "other"
        calls = command_calls(raw)
        for lock in held:
            lock.release()
    raw.close()
    assert calls.get("scan", 0) >= 2
    assert "keys" not in calls


def test_leases_are_on_the_servers_clock(
    url: str, table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client's clock is a year off: the lease still starts at the server's TIME and
    lasts ttl by it."""
    raw = raw_redis(url)
    year = 365 * 86400.0
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + year)
    with dblock.connect(url, table=table) as client:
        before = raw.time()
        lock = client.lock("k", ttl=7)
        lock.acquire()
        after = raw.time()
        info = client.info("k")
        lock.release()
    raw.close()
    assert info is not None

    def at(t: tuple[int, int]) -> datetime:
        return datetime.fromtimestamp(t[0] + t[1] / 1e6, tz=timezone.utc)

    assert at(before) <= info.acquired_at <= at(after)
    assert (info.expires_at - info.acquired_at).total_seconds() == pytest.approx(7, abs=1e-6)


def test_two_tables_on_one_redis_do_not_collide(url: str, table: str) -> None:
    other = table + "_b"
    try:
        with (
            dblock.connect(url, table=table) as a,
            dblock.connect(url, table=other) as b,
        ):
            first = a.lock("shared-name", ttl=30)
            second = b.lock("shared-name", ttl=30)
            assert first.acquire(blocking=False)
            assert second.acquire(blocking=False)  # another table: another lock
            assert [i.owner for i in a.list()] == [first.owner]
            assert [i.owner for i in b.list()] == [second.owner]
            first.release()
            assert a.purge(older_than=0) == 1
            assert b.info("shared-name") is not None  # untouched by a's purge
            assert b.force_release("shared-name")
            assert a.info("shared-name") is None
            with pytest.raises(dblock.LockLost):
                second.release()
    finally:
        from tests._servers import drop_tables

        drop_tables(url, other)


def test_a_script_call_is_sent_as_redis_py_would_send_it() -> None:
    # the store packs FCALL and EVALSHA with hiredis itself (stores/redis/store.py,
    # _roundtrip): the bytes
    # must be redis-py's own for str (UTF-8, not only ASCII) and int arguments
    hiredis = pytest.importorskip("hiredis")
    redis = pytest.importorskip("redis")
    from redis.connection import PythonRespSerializer

    encoder = redis.Redis().connection_pool.get_encoder()
    command = ("EVALSHA", "f" * 40, 2, "dblock:{t}:r:clé", "dblock:{t}:meta", "", 30_000_000, -1)
    expected = b"".join(PythonRespSerializer(6000, encoder.encode).pack(*command))
    assert hiredis.pack_command(command) == expected


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("0", "0"),
        ("-5", "-5"),
        ("1796149814736515", "1796149814736515"),  # a token: microseconds of the clock
        ("2^53", "9007199254740992"),
        ("1e18", "1000000000000000000"),
        ("1e19", "10000000000000000000"),  # beyond a C long: written as '%.0f' writes it
        ("-1e19", "-10000000000000000000"),
        ("math.huge", "inf"),
    ],
)
def test_numbers_are_written_as_the_integers_they_hold(url: str, value: str, text: str) -> None:
    """``num`` writes what the scripts store and compare: exact integers throughout, and what
    a C long cannot hold as ``%.0f`` would, not cut short."""
    from dblock.stores.redis.scripts import PREAMBLE, STATE

    raw = raw_redis(url)
    try:
        # twice: the first call settles how integers are written, the second uses it
        script = STATE + PREAMBLE + f"return {{num({value}), num({value})}}"
        assert raw.eval(script, 0) == [text, text]
    finally:
        raw.close()
