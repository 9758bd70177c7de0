"""``list``, ``info``, ``release``, ``purge`` and ``schema`` in real subprocesses."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest

import dblock
from tests.providers import Provider

from .conftest import Dblock, finish, wait_for


def test_list_and_info_show_the_hold(cli: Dblock, key: str) -> None:
    holder = cli.start("run", "--ttl", "30", key, *cli.child("wait"))
    wait_for(cli.ready_pids, what="CMD to start")
    (run_line,) = cli.runs()
    token = int(run_line.split()[1])

    listed = cli.run("list", "--json", "--prefix", key[:10])
    assert listed.returncode == 0, listed.stderr
    (line,) = listed.stdout.splitlines()
    record = json.loads(line)
    assert record["key"] == key
    assert record["token"] == token
    assert record["kind"] == "lock"
    assert record["owner"]
    acquired = datetime.fromisoformat(record["acquired_at"])
    expires = datetime.fromisoformat(record["expires_at"])
    assert acquired.utcoffset() == expires.utcoffset() == timedelta(0)
    assert expires > acquired

    table = cli.run("list")
    assert table.returncode == 0
    assert key in table.stdout
    assert record["owner"] in table.stdout
    for heading in ("key", "owner", "token", "held for", "expires in"):
        assert heading in table.stdout
    assert cli.run("list", "--json", "--prefix", "no-such-prefix").stdout == ""

    info = cli.run("info", key, "--json")
    assert info.returncode == 0
    shown = json.loads(info.stdout)
    # the run renews the lease every ttl/3: on a slow machine a renewal may come in between
    assert shown["expires_at"] >= record["expires_at"]
    assert {**shown, "expires_at": None} == {**record, "expires_at": None}
    plain = cli.run("info", key)
    assert plain.returncode == 0
    assert f"token:       {token}" in plain.stdout

    cli.stop_children()
    assert finish(cli, holder)[0] == 0
    gone = cli.run("info", key)
    assert (gone.returncode, gone.stdout) == (1, "")
    assert "not held" in gone.stderr
    assert cli.run("list").stdout.strip() == "no locks held"


def test_purge_removes_released_rows(cli: Dblock, key: str) -> None:
    assert cli.run("run", key, *cli.child("exit:0")).returncode == 0
    kept = cli.run("purge", "--older-than", "3600")
    assert (kept.returncode, kept.stdout) == (0, "purged 0 rows\n")
    purged = cli.run("purge")
    assert (purged.returncode, purged.stdout) == (0, "purged 1 row\n")
    again = cli.run("purge")
    assert (again.returncode, again.stdout) == (0, "purged 0 rows\n"), again.stderr
    # tokens stay monotonic across the purge: the next run gets a larger one (how much larger
    # is the store's: +1 on the SQL stores, the server's clock on Redis)
    assert cli.run("run", key, *cli.child("exit:0")).returncode == 0
    first, second = (int(line.split()[1]) for line in cli.runs())
    assert second > first


@pytest.mark.needs("SchemaScript")
def test_schema_applied_by_hand_is_accepted(
    provider: Provider, cli: Dblock, key: str, tmp_path: Path
) -> None:
    with pytest.raises(dblock.ConfigurationError):
        dblock.connect(cli.url, table=cli.table, create_schema=False)
    printed = cli.run("schema")  # the dialect of --url
    assert printed.returncode == 0, printed.stderr
    assert provider.dialect is not None
    assert printed.stdout == cli.run("schema", "--dialect", provider.dialect).stdout
    provider.apply_script(cli.url, printed.stdout, tmp_path)
    with dblock.connect(cli.url, table=cli.table, create_schema=False) as client:
        with client.lock(key, ttl=5, timeout=5) as lock:
            assert lock.token is not None
        assert client.info(key) is None


def test_a_timeout_names_the_info_command_that_finds_the_hold(cli: Dblock, key: str) -> None:
    """LockTimeout's hint is a command that looks where the lock is kept: its URL (every
    store of a quorum) and table, not ``DBLOCK_URL``'s or the default table (issue 46)."""
    with dblock.connect(cli.url, table=cli.table) as client:
        holder = client.lock(key, ttl=30)
        assert holder.acquire()
        with (
            pytest.raises(dblock.LockTimeout) as caught,
            client.lock(key, timeout=0.1, reentrant=False),
        ):
            pass
        hint = re.search(r"`(dblock [^`]+)`", str(caught.value))
        assert hint is not None, caught.value
        words = shlex.split(hint.group(1))
        assert words[-2:] == ["info", key]
        shown = subprocess.run(
            [sys.executable, "-m", "dblock", *words[1:], "--json"],
            capture_output=True,
            text=True,
            timeout=60,
            env=cli.env,  # no DBLOCK_URL: the hint alone must find it
            check=False,
        )
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["token"] == holder.token
        holder.release()
