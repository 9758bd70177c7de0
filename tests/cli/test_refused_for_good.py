"""What a store refuses for good (a password, a role, a database or db index that does not
exist, a parameter the server does not know, credentials for a cluster without auth) is the
user's to fix: ``ConfigurationError`` from the library, exit 2 with one line from the command
line, never a secret. A store that cannot be reached stays a ``BackendError``, exit 69."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from urllib.parse import quote

import pytest

import dblock
from dblock.cli import main
from tests._servers import (
    ETCD_URL,
    MYSQL_URL,
    POSTGRESQL_URL,
    REDIS_URL,
    execute,
    require_server,
)

SECRET = "S3cret-" + uuid.uuid4().hex[:8]


def _swap(url: str, *, user: str | None = None, path: str | None = None, query: str = "") -> str:
    scheme, rest = url.split("://", 1)
    netloc, _, tail = rest.partition("/")
    host = netloc.rsplit("@", 1)[-1]
    if user is not None:
        host = f"{user}@{host}"
    tail = tail.split("?", 1)[0] if path is None else path
    return f"{scheme}://{host}/{tail}" + (f"?{query}" if query else "")


@pytest.fixture(scope="module")
def mysql_user() -> Iterator[str]:
    require_server("mysql", MYSQL_URL)
    name = "dblock_refused_" + uuid.uuid4().hex[:6]
    execute(MYSQL_URL, f"CREATE USER '{name}'@'%' IDENTIFIED BY 'right-{SECRET}'")
    try:
        yield name
    finally:
        execute(MYSQL_URL, f"DROP USER IF EXISTS '{name}'@'%'")


def refusals(mysql_user: str) -> list[tuple[str, str, str]]:
    """(server, URL, what the one line must name)."""
    return [
        ("postgresql", _swap(POSTGRESQL_URL, user="no_such_role_x"), "no_such_role_x"),
        ("postgresql", _swap(POSTGRESQL_URL, path="no_such_db_x"), "no_such_db_x"),
        (
            "postgresql",
            _swap(POSTGRESQL_URL, query="options=" + quote("-c no_such_param=1")),
            "no_such_param",
        ),
        ("mysql", _swap(MYSQL_URL, user=f"{mysql_user}:{SECRET}"), mysql_user),
        ("mysql", _swap(MYSQL_URL, path="no_such_db_x"), "no_such_db_x"),
        ("redis", _swap(REDIS_URL, path="99"), "99"),
        ("redis", _swap(REDIS_URL, user=f"no_such_user:{SECRET}"), "no_such_user"),
        ("etcd", _swap(ETCD_URL, user=f"alice:{SECRET}", path=""), "auth"),
    ]


@pytest.fixture(
    params=range(8),
    ids=lambda i: [
        "pg-role",
        "pg-db",
        "pg-param",
        "mysql-pw",
        "mysql-db",
        "redis-db",
        "redis-user",
        "etcd-auth",
    ][i],
)
def refused(request: pytest.FixtureRequest, mysql_user: str) -> tuple[str, str, str]:
    server, url, names = refusals(mysql_user)[request.param]
    require_server(
        server,
        {"postgresql": POSTGRESQL_URL, "mysql": MYSQL_URL, "redis": REDIS_URL, "etcd": ETCD_URL}[
            server
        ],
    )
    return server, url, names


def test_the_library_raises_configuration_error(refused: tuple[str, str, str]) -> None:
    _server, url, names = refused
    with pytest.raises(dblock.ConfigurationError) as caught:
        dblock.connect(url, table="refused_t").close()
    text = str(caught.value)
    assert names in text
    assert SECRET not in text and SECRET not in repr(caught.value.__cause__)


def test_the_command_line_exits_2_with_one_line(
    refused: tuple[str, str, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _server, url, names = refused
    monkeypatch.setenv("DBLOCK_URL", url)  # (--url with a password adds a warning line)
    for debug in ([], ["--debug"]):
        assert main([*debug, "--table", "refused_t", "list"]) == 2
        err = capsys.readouterr().err
        assert SECRET not in err
        if not debug:
            assert err.count("\n") == 1 and err.startswith("dblock: "), err
            assert names in err and "Traceback" not in err


def test_an_unreachable_store_still_exits_69(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = _swap(POSTGRESQL_URL, user=f"postgres:{SECRET}").replace(":5432", ":1")
    monkeypatch.setenv("DBLOCK_URL", url)
    assert main(["list"]) == 69
    err = capsys.readouterr().err
    assert SECRET not in err and err.count("\n") == 1


def test_a_database_closed_to_connections_is_an_outage_not_a_refusal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """PostgreSQL's 'database "x" is not currently accepting connections' (what an operator's
    ALLOW_CONNECTIONS false, or a database being dropped, says) is worth retrying: 69."""
    require_server("postgresql", POSTGRESQL_URL)
    name = "dblock_closed_" + uuid.uuid4().hex[:8]
    execute(
        POSTGRESQL_URL, f"CREATE DATABASE {name}", f"ALTER DATABASE {name} ALLOW_CONNECTIONS false"
    )
    try:
        with pytest.raises(dblock.BackendError):
            dblock.connect(_swap(POSTGRESQL_URL, path=name), table="refused_t")
        assert main(["--url", _swap(POSTGRESQL_URL, path=name), "list"]) == 69
        assert "not currently accepting connections" in capsys.readouterr().err
    finally:
        execute(POSTGRESQL_URL, f"DROP DATABASE IF EXISTS {name}")
