"""URL parameters handed to the drivers: a user's MySQL ``init_command`` cannot replace the
session settings dblock relies on (issue 29, point 15), and a parameter the driver refuses is a
ConfigurationError, exit 2, never "database unavailable" 69 (point 14)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest

import dblock
from dblock.cli import main
from tests._internals import store_of
from tests._servers import MYSQL_URL, POSTGRESQL_URL, drop_tables, require_server


@pytest.fixture
def mysql_table() -> Iterator[str]:
    require_server("mysql", MYSQL_URL)
    name = "t_" + uuid.uuid4().hex[:16]
    yield name
    drop_tables(MYSQL_URL, name)


def _with_init(statement: str) -> str:
    return f"{MYSQL_URL}?init_command={quote(statement)}"


def _session(client: dblock.Client, sql: str) -> Any:
    """``sql``'s value on a connection of the client's own pool."""

    def op(conn: Any) -> Any:
        with conn.cursor() as cur:
            cur.execute(sql)
            return cur.fetchone()[-1]

    return store_of(client).run("probe", op)  # type: ignore[attr-defined]


def test_init_command_cannot_replace_dblocks_session_settings(mysql_table: str) -> None:
    url = _with_init(
        "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED; SET autocommit = 0; "
        "SET @dblock_test_probe = 42"
    )
    with dblock.connect(url, table=mysql_table) as client:
        # dblock's INSERT ... SELECT takes shared locks on what it reads only under
        # REPEATABLE READ; each lock statement commits on its own
        isolation = (
            "SHOW SESSION VARIABLES WHERE Variable_name IN "
            "('tx_isolation', 'transaction_isolation')"  # MariaDB < 11.1, MySQL 8
        )
        assert _session(client, isolation) == "REPEATABLE-READ"
        assert _session(client, "SELECT @@autocommit") == 1
        assert _session(client, "SELECT @dblock_test_probe") == 42  # the user's ran too
        with client.lock("k", ttl=5, timeout=5) as lock:
            assert lock.token is not None


@pytest.mark.parametrize("statement", ["SET nonsense", "SET SESSION no_such_variable = 1"])
def test_failing_init_command_is_a_configuration_error(
    mysql_table: str, statement: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(dblock.ConfigurationError, match="init_command"):
        dblock.connect(_with_init(statement), table=mysql_table)
    assert main(["--url", _with_init(statement), "--table", mysql_table, "list"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dblock: the init_command of "), err


@pytest.mark.parametrize(
    "query", ["foo=bar", "sslmode=bogus", "connect_timeout=abc", "target_session_attrs=x"]
)
def test_postgresql_parameter_refused_by_the_driver_exits_2(
    query: str, capsys: pytest.CaptureFixture[str]
) -> None:
    require_server("postgresql", POSTGRESQL_URL)
    url = f"{POSTGRESQL_URL}?{query}"
    with pytest.raises(dblock.ConfigurationError, match="URL parameter"):
        dblock.connect(url, table="t_" + uuid.uuid4().hex[:16])
    assert main(["--url", url, "list"]) == 2
    err = capsys.readouterr().err
    # dblock checks the parameters it reads itself (connect_timeout); libpq the rest
    assert err.count("\n") == 1 and err.startswith("dblock: ") and "URL parameter" in err, err
