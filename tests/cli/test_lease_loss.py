"""``dblock run`` stops CMD when its lease is lost because the database is out of reach.

The outages, per backend, touch nothing but this test's own table or database:

- SQLite: another process holds ``BEGIN EXCLUSIVE`` on the file, so renewals cannot write.
- PostgreSQL: in a database created for the test, new connections are refused
  (``ALLOW_CONNECTIONS false``, which binds superusers too, unlike ``CONNECTION LIMIT``) and
  dblock's sessions are ended with ``pg_terminate_backend``. Restored and dropped afterwards.
- MySQL/MariaDB: another session holds ``LOCK TABLES <table> WRITE``, so renewals block.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests._servers import raw_connect

from .conftest import Dblock, alive, finish, wait_for

TTL = "1"


@contextmanager
def own_database(cli: Dblock, dialect: str) -> Iterator[Dblock]:
    """For PostgreSQL a fresh database (dropped afterwards), else the test's own URL."""
    if dialect != "postgresql":
        yield cli
        return
    name = "dblock_cli_" + uuid.uuid4().hex[:12]
    admin = raw_connect(cli.url)
    admin.execute(f'CREATE DATABASE "{name}"')
    runner = Dblock(urlunsplit(urlsplit(cli.url)._replace(path="/" + name)), cli.table, cli.work)
    try:
        yield runner
    finally:
        runner.cleanup()
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@contextmanager
def outage(cli: Dblock, runner: Dblock, dialect: str) -> Iterator[None]:
    """Make ``runner``'s lock table unusable for everyone else while the block runs."""
    url, table = runner.url, runner.table
    if dialect == "postgresql":
        name = urlsplit(url).path.lstrip("/")
        admin = raw_connect(cli.url)  # connected elsewhere: a database cannot lock itself out
        try:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
            yield
        finally:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
            admin.close()
        return
    conn = raw_connect(url)
    try:
        cur = conn.cursor()
        if dialect == "sqlite":
            cur.execute("BEGIN EXCLUSIVE")
        else:
            cur.execute(f"LOCK TABLES `{table}` WRITE")
        try:
            yield
        finally:
            cur.execute("ROLLBACK" if dialect == "sqlite" else "UNLOCK TABLES")
    finally:
        conn.close()


@pytest.mark.slow
def test_lease_loss_stops_cmd(cli: Dblock, key: str, dialect: str) -> None:
    with own_database(cli, dialect) as runner:
        proc = runner.start("run", "--ttl", TTL, key, *runner.child("sleep"))
        wait_for(runner.ready_pids, what="CMD to start")
        (pid,) = runner.ready_pids()
        with outage(cli, runner, dialect):
            status, _, err = finish(runner, proc)
            assert status == 70, err
            assert "lost the lease" in err
            assert not alive(pid)
        assert "Traceback" not in err
        # the lease ran out: the next run gets the key
        again = runner.run("run", "--timeout", "10", key, "--", "true")
        assert again.returncode == 0, again.stderr


def test_force_release_stops_cmd(cli: Dblock, key: str) -> None:
    proc = cli.start("run", "--ttl", "2", key, *cli.child("sleep"))
    wait_for(cli.ready_pids, what="CMD to start")
    (pid,) = cli.ready_pids()
    refused = cli.run("release", key)
    assert refused.returncode == 2
    assert "--force" in refused.stderr
    released = cli.run("release", key, "--force")
    assert released.returncode == 0, released.stderr
    assert key in released.stdout
    status, _, err = finish(cli, proc)
    assert status == 70, err
    assert not alive(pid)
    assert cli.run("release", key, "--force").returncode == 1
