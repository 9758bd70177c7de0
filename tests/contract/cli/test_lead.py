"""``dblock lead`` when its term is lost: what it does next."""

from __future__ import annotations

import signal

from .conftest import Dblock, alive, finish, wait_for


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
    assert len(cli.runs()) == 1, "dblock lead campaigned again and led a second term"
