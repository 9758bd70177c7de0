"""``dblock run KEY KEY... -- CMD``: what is refused before anything runs (exit 2, no
traceback), and a busy key (75, nothing taken). Where the keys are held, on every store, is
tests/contract/cli/test_run_many.py."""

from __future__ import annotations

import uuid

from .conftest import Dblock, finish, wait_for


def _keys(n: int) -> list[str]:
    stem = "ru-" + uuid.uuid4().hex[:8]
    return [f"{stem}-{i}" for i in range(n)]


def test_bad_key_lists_are_usage_errors(cli: Dblock) -> None:
    """A key twice, more keys than the store takes in one step, no CMD."""
    keys = _keys(2)
    twice = cli.run("run", keys[0], keys[1], keys[0], "--", "true")
    assert twice.returncode == 2 and "twice" in twice.stderr
    too_many = cli.run("run", *_keys(200), "--", "true")
    assert too_many.returncode == 2 and "at most" in too_many.stderr
    assert "Traceback" not in twice.stderr + too_many.stderr
    no_cmd = cli.run("run", *keys, "--")
    assert no_cmd.returncode == 2 and "CMD" in no_cmd.stderr


def test_a_busy_key_runs_nothing_and_takes_none(cli: Dblock) -> None:
    keys = _keys(3)
    holder = cli.start("run", keys[2], *cli.child("wait"))
    wait_for(cli.ready_pids, what="the holder's CMD to start")
    loser = cli.run("run", "--no-wait", *keys, "--", "true")
    assert loser.returncode == 75, loser.stderr
    assert keys[2] in loser.stderr and "is busy" in loser.stderr
    assert cli.run("info", keys[0]).returncode == 1 and cli.run("info", keys[1]).returncode == 1
    cli.stop_children()
    assert finish(cli, holder)[0] == 0
