"""``dblock run`` in real subprocesses, on every backend."""

from __future__ import annotations

import contextlib
import os
import pty
import select
import signal
import subprocess
import sys

import pytest

from .conftest import WAIT, Dblock, alive, finish, wait_for


def test_no_wait_runs_cmd_exactly_once(cli: Dblock, key: str) -> None:
    procs = {
        75: cli.start("run", "--no-wait", key, *cli.child("wait")),
        9: cli.start("run", "--no-wait", "--conflict-exit-code", "9", key, *cli.child("wait")),
        76: cli.start("run", "--no-wait", key, "--conflict-exit-code", "76", *cli.child("wait")),
    }
    wait_for(lambda: sum(p.poll() is not None for p in procs.values()) == 2, what="two losers")
    wait_for(lambda: len(cli.runs()) == 1, what="the winner's CMD")
    for expected, proc in procs.items():
        if proc.poll() is not None:
            status, _, err = finish(cli, proc)
            assert status == expected, err
            assert key in err
            assert "is busy" in err
    cli.stop_children()
    (winner,) = [p for p in procs.values() if p.returncode is None]
    status, _, err = finish(cli, winner)
    assert status == 0, err
    assert len(cli.runs()) == 1


def test_quiet_conflict_prints_nothing(cli: Dblock, key: str) -> None:
    holder = cli.start("run", key, *cli.child("wait"))
    wait_for(cli.ready_pids, what="CMD to start")
    loser = cli.run("run", "-q", "--no-wait", key, "--", "true")
    assert (loser.returncode, loser.stdout, loser.stderr) == (75, "", "")
    timed_out = cli.run("run", "--timeout", "0.3", key, "--", "true")
    assert timed_out.returncode == 75
    cli.stop_children()
    assert finish(cli, holder)[0] == 0


def test_exit_status_of_cmd(cli: Dblock, key: str) -> None:
    done = cli.run("run", key, *cli.child("exit:3"))
    assert done.returncode == 3, done.stderr
    (line,) = cli.runs()
    assert line.split()[1].isdigit()  # DBLOCK_TOKEN was set
    killed = cli.run("run", key, "--", "sh", "-c", "kill -KILL $$")
    assert killed.returncode == 128 + signal.SIGKILL
    missing = cli.run("run", key, "--", "/nonexistent/cmd")
    assert missing.returncode == 127
    assert missing.stderr.count("\n") == 1
    # every run released the key
    assert cli.run("info", key).returncode == 1


def test_cmd_gets_the_environment_dblock_was_given(cli: Dblock, key: str) -> None:
    # and nothing set in dblock's process for itself (gRPC's settings, on etcd)
    for name in ("GRPC_VERBOSITY", "GRPC_ENABLE_FORK_SUPPORT"):  # this process's, if any
        cli.env.pop(name, None)
    done = cli.run("run", key, "--", "env", "-0")
    assert done.returncode == 0, done.stderr
    given = dict(line.split("=", 1) for line in done.stdout.split("\0") if line)
    ours = {"DBLOCK_KEY", "DBLOCK_OWNER", "DBLOCK_TOKEN"}
    assert {"DBLOCK_KEY", "DBLOCK_OWNER"} <= given.keys()
    assert {k: v for k, v in given.items() if k not in ours} == {
        k: v for k, v in cli.env.items() if k not in ours
    }


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signal_reaches_cmd_and_lock_is_released(
    cli: Dblock, key: str, signum: signal.Signals
) -> None:
    proc = cli.start("run", key, *cli.child("trap"))
    wait_for(cli.ready_pids, what="CMD to start")
    proc.send_signal(signum)
    status, _, err = finish(cli, proc)
    assert status == 42, err
    assert (cli.work / "signal").read_text() == signum.name
    again = cli.run("run", "--no-wait", key, "--", "true")
    assert again.returncode == 0, again.stderr


def test_signal_while_waiting_ends_the_wait(cli: Dblock, key: str) -> None:
    holder = cli.start("run", key, *cli.child("wait"))
    wait_for(cli.ready_pids, what="CMD to start")
    waiter = cli.start("--debug", "run", key, *cli.child("exit:0"))
    wait_for(lambda: "waiting for" in cli.stderr(waiter), what="the waiter to wait")
    waiter.send_signal(signal.SIGTERM)
    status, _, err = finish(cli, waiter)
    assert status == 128 + signal.SIGTERM, err
    assert "Traceback" not in err
    cli.stop_children()
    assert finish(cli, holder)[0] == 0
    assert len(cli.runs()) == 1  # the waiter never ran CMD


def test_signal_while_waiting_at_the_worst_moment_ends_the_wait(cli: Dblock, key: str) -> None:
    # as in test_lead's: the signal lands inside a wait on a condition, between letting go of
    # its lock and setting up to take it back
    holder = cli.start("run", key, *cli.child("wait"))
    wait_for(cli.ready_pids, what="CMD to start")
    waiter = cli.start_signalled(signal.SIGINT, "--debug", "run", key, *cli.child("exit:0"))
    wait_for(lambda: "waiting for" in cli.stderr(waiter), what="the waiter to wait")
    cli.arm(waiter)
    status, _, err = finish(cli, waiter)
    assert status == 128 + signal.SIGINT, err
    assert "Traceback" not in err
    cli.stop_children()
    assert finish(cli, holder)[0] == 0
    assert len(cli.runs()) == 1  # the waiter never ran CMD
    again = cli.run("run", "--no-wait", key, "--", "true")
    assert again.returncode == 0, again.stderr  # and left nothing behind


def test_status_line_only_on_a_terminal(cli: Dblock, key: str) -> None:
    holder = cli.start("run", key, *cli.child("wait"))
    wait_for(cli.ready_pids, what="CMD to start")
    not_a_terminal = cli.run("run", "--timeout", "1.5", key, "--", "true")
    assert not_a_terminal.returncode == 75
    assert "waiting for" not in not_a_terminal.stderr

    master, replica = pty.openpty()
    env = {**cli.env, "TERM": "xterm", "COLUMNS": "300"}
    waiter = subprocess.Popen(
        cli.argv("run", key, "--", "true"),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=replica,
        env=env,
    )
    os.close(replica)
    seen = b""
    try:

        def read_some() -> bool:
            nonlocal seen
            if select.select([master], [], [], 0.1)[0]:
                with contextlib.suppress(OSError):  # EIO once the waiter has exited
                    seen += os.read(master, 65536)
            return f"waiting for {key}".encode() in seen and b"held by" in seen

        wait_for(read_some, what="the status line")
        cli.stop_children()
        wait_for(lambda: (read_some(), waiter.poll() is not None)[1], what="the waiter")
        assert waiter.wait(timeout=WAIT) == 0
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()
        os.close(master)
    assert finish(cli, holder)[0] == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_cmd_dies_with_a_killed_dblock(cli: Dblock, key: str) -> None:
    """dblock SIGKILLed cannot stop CMD or renew the lease: the kernel kills CMD with it, so
    CMD is not left running unprotected once the lease runs out."""
    proc = cli.start("run", "--ttl", "2", key, *cli.child("wait"))
    wait_for(cli.ready_pids, what="CMD to start")
    (cmd_pid,) = cli.ready_pids()
    assert alive(cmd_pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    wait_for(lambda: not alive(cmd_pid), timeout=5, what="CMD to die with dblock")
    # the lease lapses by itself, and the next run gets the key
    after = cli.run("run", "--timeout", "10", key, "--", "true")
    assert after.returncode == 0, after.stderr
