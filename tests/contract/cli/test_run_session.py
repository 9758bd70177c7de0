"""``dblock run --session``: CMD under a hold with no lease (docs/session-locks.md)."""

from __future__ import annotations

import pytest

from .conftest import Dblock, alive, finish, wait_for


def test_session_run_excludes_others_and_sets_the_token(cli: Dblock, key: str) -> None:
    holder = cli.start("run", "--session", key, *cli.child("wait"))
    wait_for(cli.ready_pids, what="CMD to start")
    busy = cli.run("run", "--no-wait", key, "--", "true")
    assert busy.returncode == 75, busy.stderr
    busy = cli.run("run", "--session", "--no-wait", key, "--", "true")
    assert busy.returncode == 75, busy.stderr
    cli.stop_children()
    status, _, err = finish(cli, holder)
    assert status == 0, err
    (line,) = cli.runs()
    assert line.split()[1].isdigit()  # DBLOCK_TOKEN was set
    refused = cli.run("run", "--session", "--ttl", "5", key, "--", "true")
    assert refused.returncode == 2
    assert "--session" in refused.stderr


@pytest.mark.needs("SessionHolds", "server")
def test_a_killed_session_stops_cmd(cli: Dblock, key: str) -> None:
    proc = cli.start("run", "--session", "--kill-grace", "1", key, *cli.child("sleep"))
    wait_for(cli.ready_pids, what="CMD to start")
    (pid,) = cli.ready_pids()
    released = cli.run("release", key, "--force")  # ends the holder's session in the server
    assert released.returncode == 0, released.stderr
    status, _, err = finish(cli, proc)
    assert status == 70, err
    assert "session hold" in err
    assert not alive(pid)
