"""``dblock once`` in real subprocesses, on every backend."""

from __future__ import annotations

import pytest

import dblock

from .conftest import Dblock, alive, finish, wait_for

pytestmark = [
    pytest.mark.skipif(
        not hasattr(dblock.Client, "once"), reason="Client.once() has not landed yet"
    ),
    pytest.mark.needs("OnceRecords"),
]


def test_runs_at_most_once_successfully(cli: Dblock, key: str) -> None:
    failed = cli.run("once", key, *cli.child("exit:3"))
    assert failed.returncode == 3, failed.stderr
    first = cli.run("once", "--note", "nightly", key, *cli.child("exit:0"))
    assert first.returncode == 0, first.stderr
    assert len(cli.runs()) == 2  # the failed run may be retried
    again = cli.run("once", key, *cli.child("exit:0"))
    assert again.returncode == 0
    assert "already succeeded" in again.stderr
    assert len(cli.runs()) == 2  # but a succeeded one never runs again
    quiet = cli.run("once", "-q", key, *cli.child("exit:0"))
    assert (quiet.returncode, quiet.stderr) == (0, "")
    # purge keeps once-records unless asked
    assert cli.run("purge").stdout == "purged 0 rows\n"
    assert cli.run("once", key, *cli.child("exit:0")).returncode == 0
    assert len(cli.runs()) == 2


def test_in_progress_exits_75(cli: Dblock, key: str) -> None:
    holder = cli.start("once", key, *cli.child("wait"))
    wait_for(cli.ready_pids, what="CMD to start")
    busy = cli.run("once", key, *cli.child("exit:0"))
    assert busy.returncode == 75, busy.stderr
    assert "being processed" in busy.stderr
    cli.stop_children()
    assert finish(cli, holder)[0] == 0
    assert len(cli.runs()) == 1


def test_signal_is_forwarded_and_recorded_as_failed(cli: Dblock, key: str) -> None:
    holder = cli.start("once", key, *cli.child("trap"))
    wait_for(cli.ready_pids, what="CMD to start")
    holder.terminate()
    assert finish(cli, holder)[0] == 42
    assert (cli.work / "signal").read_text() == "SIGTERM"
    with dblock.connect(cli.url, table=cli.table) as client:
        assert client.state(key) == "failed"
    assert cli.run("once", key, *cli.child("exit:0")).returncode == 0


def test_lost_lease_stops_cmd(cli: Dblock, key: str) -> None:
    holder = cli.start("once", "--ttl", "2", key, *cli.child("sleep"))
    wait_for(cli.ready_pids, what="CMD to start")
    (pid,) = cli.ready_pids()
    assert cli.run("release", "--force", key).returncode == 0
    status, _, err = finish(cli, holder)
    assert status == 70, err
    assert "lost the lease" in err
    assert not alive(pid)
    assert cli.run("once", key, *cli.child("exit:0")).returncode == 0


def test_run_on_a_finished_once_key_fails_fast(cli: Dblock, key: str) -> None:
    # a once-record is never released: `dblock run` on its key must not wait forever
    assert cli.run("once", key, *cli.child("exit:0")).returncode == 0
    blocked = cli.run("run", key, *cli.child("exit:0"))
    assert blocked.returncode == 2, blocked.stderr
    assert "once-record" in blocked.stderr
    assert "Traceback" not in blocked.stderr
    assert len(cli.runs()) == 1
