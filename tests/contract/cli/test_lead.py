"""``dblock lead`` and ``dblock leader`` (issue 48) on every store with the ``cli`` capability:
one CMD at a time among several ``dblock lead``; a killed leader's standby runs CMD; a lost
term stops CMD and campaigns again; CMD's own exit resigns and is dblock's status."""

from __future__ import annotations

import json
import signal
import time

import pytest

from .conftest import Dblock, alive, finish, wait_for

pytestmark = pytest.mark.needs("LeaderValues")


def _starts(cli: Dblock) -> list[tuple[int, int]]:
    """(pid, token) of every CMD started, in order."""
    return [(int(p), int(t)) for p, t in (line.split() for line in cli.runs())]


def test_lead_runs_cmd_while_leading_and_exits_with_its_status(cli: Dblock, key: str) -> None:
    done = cli.run("lead", key, "--value", "10.0.0.7:8080", *cli.child("exit:7"))
    assert done.returncode == 7, done.stderr
    ((_, token),) = _starts(cli)
    assert token > 0
    assert cli.run("leader", key).returncode == 1  # resigned when CMD ended


def test_leader_shows_the_leader_and_its_value(cli: Dblock, key: str) -> None:
    proc = cli.start("lead", key, "--value", "10.0.0.7:8080", *cli.child("wait"))
    try:
        wait_for(cli.ready_pids, what="CMD to start")
        ((_, token),) = _starts(cli)
        shown = cli.run("leader", key)
        assert shown.returncode == 0, shown.stderr
        assert "10.0.0.7:8080" in shown.stdout and f"token {token}" in shown.stdout
        as_json = json.loads(cli.run("leader", key, "--json").stdout)
        assert (as_json["name"], as_json["value"], as_json["token"]) == (
            key,
            "10.0.0.7:8080",
            token,
        )
        assert as_json["since"].endswith("Z") or "+" in as_json["since"]
    finally:
        (cli.work / "stop").touch()
    status, _, err = finish(cli, proc)
    assert status == 0, err
    nobody = cli.run("leader", key)
    assert nobody.returncode == 1 and nobody.stdout == "" and "nobody leads" in nobody.stderr


def test_one_cmd_at_a_time_and_a_killed_leaders_standby_takes_over(cli: Dblock, key: str) -> None:
    leaders = [
        cli.start("lead", key, "--ttl", "3", "--value", str(i), *cli.child("sleep"))
        for i in range(3)
    ]
    try:
        wait_for(cli.ready_pids, what="the first CMD")
        time.sleep(1.0)
        assert len(cli.ready_pids()) == 1  # the others stand by
        for _ in range(2):
            (pid, token) = _starts(cli)[-1]
            leader = next(p for p in leaders if p.poll() is None and _leads(cli, p, pid))
            before = len(_starts(cli))
            killed = time.monotonic()
            leader.send_signal(signal.SIGKILL)  # its CMD dies with it
            wait_for(lambda b=before: len(_starts(cli)) > b, what="a standby's CMD")
            took = time.monotonic() - killed
            assert took < 3 + 3.0, took  # the lease left (< 3 s), a look, CMD's start
            assert not alive(pid)
            assert _starts(cli)[-1][1] > token
            time.sleep(0.5)
            running = [p for p, _ in _starts(cli) if alive(p)]
            assert len(running) == 1, running
    finally:
        for p in leaders:
            p.kill()
            p.wait()


def _leads(cli: Dblock, proc: object, cmd_pid: int) -> bool:
    """``cmd_pid`` is a child of ``proc`` (a started ``dblock lead``)."""
    try:
        with open(f"/proc/{cmd_pid}/stat") as f:
            ppid = int(f.read().rsplit(")", 1)[1].split()[1])
    except FileNotFoundError:
        return False
    return ppid == getattr(proc, "pid", None)


def test_a_lost_term_stops_cmd_and_campaigns_again(cli: Dblock, key: str) -> None:
    proc = cli.start("lead", key, "--ttl", "3", *cli.child("sleep"))
    try:
        wait_for(cli.ready_pids, what="CMD to start")
        ((pid, token),) = _starts(cli)
        released = cli.run("release", key, "--force")
        assert released.returncode == 0, released.stderr
        wait_for(lambda: not alive(pid), what="CMD to be stopped")
        wait_for(lambda: len(_starts(cli)) == 2, what="CMD again, in a new term")
        assert _starts(cli)[1][1] > token
        err = cli.stderr(proc)
        assert "campaigning for" in err and "Traceback" not in err
    finally:
        proc.send_signal(signal.SIGTERM)
        finish(cli, proc)


def test_leader_watch_follows_changes(cli: Dblock, key: str) -> None:
    watch = cli.start("leader", key, "--watch", "--json")
    try:
        # its first line (nobody leads) is out before anyone leads: a loaded machine has
        # taken over a second to start it
        wait_for(lambda: cli.stdout(watch).strip() != "", what="the watch's first line")
        for value in ("a", "b"):
            done = cli.run("lead", key, "--value", value, "--", "sleep", "0.5")
            assert done.returncode == 0, done.stderr
        time.sleep(1.0)
    finally:
        watch.send_signal(signal.SIGINT)
        status, out, err = finish(cli, watch)
    assert status == 0, err
    seen = [json.loads(line) for line in out.splitlines()]
    values = [s and s["value"] for s in seen]
    assert values == [None, "a", None, "b", None], seen


def test_leader_watch_ends_cleanly_on_a_signal_at_the_worst_moment(cli: Dblock, key: str) -> None:
    # the signal lands as the watch's wait has let go of its condition's lock and not yet
    # set up to take it back: a handler that raised there made the wait's `with` release a
    # lock it no longer held (CI: "RuntimeError: release unlocked lock", exit 1)
    watch = cli.start_signalled(signal.SIGINT, "leader", key, "--watch", "--json")
    try:
        wait_for(lambda: cli.stdout(watch).strip() != "", what="the watch's first line")
        cli.arm(watch)
    finally:
        status, out, err = finish(cli, watch)
    assert (status, err) == (0, "")
    assert [json.loads(line) for line in out.splitlines()] == [None]


def test_lead_refuses_bad_input_before_connecting(cli: Dblock, key: str) -> None:
    too_long = cli.run("lead", key, "--value", "x" * 1025, "--", "true")
    assert too_long.returncode == 2 and "1024" in too_long.stderr
    short = cli.run("lead", key, "--ttl", "0.5", "--", "true")
    assert short.returncode == 2 and "--ttl" in short.stderr
    no_cmd = cli.run("lead", key)
    assert no_cmd.returncode == 2


def test_a_signal_forwarded_before_the_term_was_lost_ends_lead(cli: Dblock, key: str) -> None:
    """SIGTERM reached CMD, which went on running, then the term was lost: dblock stops CMD
    and ends (128 + 15) instead of campaigning again, as it would while campaigning: the
    signal asked it to end (systemd's stop coming as a term is lost)."""
    proc = cli.start("lead", "--ttl", "3", key, *cli.child("deaf"))
    wait_for(cli.ready_pids, what="CMD to start")
    (pid,) = cli.ready_pids()
    proc.send_signal(signal.SIGTERM)
    wait_for((cli.work / "signal").exists, what="the signal forwarded to CMD")
    released = cli.run("release", key, "--force")
    assert released.returncode == 0, released.stderr
    status, _, err = finish(cli, proc)
    assert status == 128 + signal.SIGTERM, err
    assert not alive(pid)
    assert len(_starts(cli)) == 1, "dblock lead campaigned again and led a second term"
