"""settings.DATABASES -> dblock URL: every supported engine maps, the password survives any
character and is never shown, and what dblock cannot use is a clear error."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import uuid
from typing import Any
from urllib.parse import urlsplit

import pytest

import dblock
from dblock.tools import parse_url
from tests._private_servers import free_ports
from tests._servers import MYSQL_URL, REQUIRE_SERVERS, raw_connect

from ._project import sqlite_site

pytest.importorskip("django")

from dblock.contrib.django.config import ImproperlyConfigured, Target, database_url

PASSWORD = "p@ss:w/rd?#%&= é"  # noqa: S105 - a test value, to show it is never shown


def _pg(**extra: Any) -> dict[str, Any]:
    return {"NAME": "app", "USER": "app user", "PASSWORD": PASSWORD, "HOST": "db.example",
            "PORT": "6432", "OPTIONS": {}, **extra}  # fmt: skip


def test_postgresql_maps_every_field_and_keeps_the_password_exact() -> None:
    db = _pg(OPTIONS={"sslmode": "require", "isolation_level": 2, "connect_timeout": 5})
    url = parse_url(database_url("default", "postgresql", db))
    assert (url.dialect, url.host, url.port, url.database) == (
        "postgresql",
        "db.example",
        6432,
        "app",
    )
    assert (url.user, url.password) == ("app user", PASSWORD)
    # libpq's parameters pass; Django's own session setting does not reach libpq
    assert url.query == {"sslmode": "require", "connect_timeout": "5"}
    assert PASSWORD not in url.safe


def test_the_target_does_not_show_its_url() -> None:
    where = Target("default", database_url("default", "postgresql", _pg()), "dblock_locks", None)
    assert PASSWORD not in repr(where)
    assert "p%40ss" not in repr(where)


def test_a_socket_directory_is_libpqs_host_parameter() -> None:
    url = parse_url(database_url("x", "postgresql", {"NAME": "app", "HOST": "/run/postgresql"}))
    assert (url.host, url.query) == (None, {"host": "/run/postgresql"})


def test_mysql_maps_ssl_files_and_the_socket() -> None:
    options = {"charset": "utf8mb4", "ssl": {"ca": "/ca.pem"}, "connect_timeout": 3}
    db = {"NAME": "shop", "USER": "root", "PASSWORD": PASSWORD, "HOST": "/run/mysqld.sock",
          "OPTIONS": options}  # fmt: skip
    url = parse_url(database_url("default", "mysql", db))
    assert (url.dialect, url.password, url.database) == ("mysql", PASSWORD, "shop")
    assert url.query == {
        "connect_timeout": "3",
        "ssl_ca": "/ca.pem",
        "unix_socket": "/run/mysqld.sock",
    }


def test_sqlite_is_the_absolute_path_of_name(tmp_path: Any) -> None:
    name = tmp_path / "a b%.sqlite3"
    url = parse_url(database_url("default", "sqlite", {"NAME": name, "OPTIONS": {"timeout": 20}}))
    assert (url.database, url.query) == (str(name), {"timeout": "20"})


@pytest.mark.parametrize(
    ("vendor", "db", "says"),
    [
        ("oracle", {"ENGINE": "django.db.backends.oracle", "NAME": "x"}, "ENGINE"),
        ("sqlite", {"NAME": ":memory:"}, "in-memory"),
        ("sqlite", {"NAME": "file:memorydb_default?mode=memory&cache=shared"}, "in-memory"),
        ("postgresql", _pg(OPTIONS={"assume_role": "admin"}), "assume_role"),
        (
            "mysql",
            {"NAME": "x", "PASSWORD": PASSWORD, "OPTIONS": {"read_default_file": "/my.cnf"}},
            "read_default_file",
        ),
        ("postgresql", _pg(NAME=""), "NAME"),
    ],
)
def test_what_dblock_cannot_use_is_a_clear_error(
    vendor: str, db: dict[str, Any], says: str
) -> None:
    with pytest.raises(ImproperlyConfigured, match=says) as caught:
        database_url("default", vendor, db)
    assert PASSWORD not in str(caught.value)


def test_importing_dblock_loads_no_django() -> None:
    code = "import sys, dblock, dblock.contrib; print('django' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_manage_py_reports_a_bad_setting_in_one_line(tmp_path: Any) -> None:
    site = sqlite_site(tmp_path)
    site.dblock = {"DATABASE": "locks"}
    done = site.run("dblock", "list", status=2)
    assert done.stderr.strip() == (
        "CommandError: settings.DBLOCK['DATABASE'] is 'locks', which settings.DATABASES does "
        "not have"
    )
    assert "dblock.E001" in site.run("check", status=1).stderr


def test_an_unreachable_database_exits_69_without_its_password(tmp_path: Any) -> None:
    site = sqlite_site(tmp_path)
    [port] = free_ports(1)
    site.databases["default"] = {"ENGINE": "django.db.backends.postgresql", "NAME": "app",
                                 "USER": "app", "PASSWORD": PASSWORD, "HOST": "127.0.0.1",
                                 "PORT": str(port), "OPTIONS": {"connect_timeout": 2}}  # fmt: skip
    done = site.run("dblock", "list", status=69)
    assert done.stderr.startswith("dblock: database unavailable: cannot connect to ")
    assert f"postgresql://app:***@127.0.0.1:{port}/app" in done.stderr
    assert PASSWORD not in done.stderr + done.stdout
    assert "p%40ss" not in done.stderr


def test_using_locks_before_migrating_says_to_migrate(tmp_path: Any) -> None:
    site = sqlite_site(tmp_path)
    assert site.run("dblock", "list").stdout == "no locks held\n"  # it looks, creates nothing
    done = site.run("payout", "b1", status=None)
    assert done.returncode == 1
    assert "run `python manage.py migrate dblock --database default`" in done.stderr


def test_a_named_database_keeps_the_locks_and_only_it_gets_the_tables(tmp_path: Any) -> None:
    site = sqlite_site(tmp_path)
    locks = tmp_path / "locks.sqlite3"
    site.databases["locks"] = {"ENGINE": "django.db.backends.sqlite3", "NAME": str(locks)}
    site.dblock = {"DATABASE": "locks", "TABLE": "app_locks"}
    site.run("migrate", "--no-input")  # the default database: no lock table there
    site.run("migrate", "--no-input", "--database", "locks")
    with sqlite3.connect(tmp_path / "shop.sqlite3") as default, sqlite3.connect(locks) as other:
        tables = "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE '%locks%'"
        assert default.execute(tables).fetchall() == []
        assert sorted(r[0] for r in other.execute(tables)) == [
            "app_locks", "app_locks_holders", "app_locks_meta",
        ]  # fmt: skip
    site.run("payout", "p1")
    held = site.run("dblock", "purge", "--include-once").stdout
    assert held == "purged 1 row\n"  # the payout's once record, in app_locks of `locks`


def test_on_mysql_migrate_makes_the_tables_a_client_then_uses(tmp_path: Any) -> None:
    """The MySQL DDL through Django's schema editor (PyMySQL standing in for mysqlclient)."""
    pytest.importorskip("pymysql")
    try:
        admin = raw_connect(MYSQL_URL)
    except Exception as exc:
        if REQUIRE_SERVERS:
            raise
        pytest.skip(f"MySQL not reachable: {exc}")
    name = f"q1_django_{uuid.uuid4().hex[:10]}"
    admin.cursor().execute(f"CREATE DATABASE `{name}`")
    try:
        parts = urlsplit(MYSQL_URL)
        site = sqlite_site(tmp_path)
        site.databases["default"] = {
            "ENGINE": "django.db.backends.mysql",
            "NAME": name,
            "USER": parts.username or "",
            "PASSWORD": parts.password or "",
            "HOST": parts.hostname,
            "PORT": str(parts.port or ""),
        }
        site.run("migrate", "--no-input")
        url = parts._replace(path=f"/{name}").geturl()
        with dblock.connect(url, create_schema=False) as client, client.lock("m") as held:
            assert client.info("m") is not None
            assert held.token is not None
        assert site.run("dblock", "list").stdout == "no locks held\n"
        assert site.run("payout", "m1").stdout.strip() == "ran"
        assert site.run("payout", "m1").stdout.strip() == "already done"
    finally:
        admin.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
        admin.close()
