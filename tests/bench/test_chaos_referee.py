"""The chaos referee's check of the leaders (``dblock lead``) on hand-made CMD logs: it must
catch two CMDs that ran at once, and tell them from the stale leader a pause leaves behind;
and its check of holds reported lost that nothing could have ended."""

from __future__ import annotations

from pathlib import Path

from bench import _chaos_referee as referee

SLACK = 2.0


def cmd(pid: int, token: int, start: float, end: float, *, stop: bool = False) -> list[str]:
    """The lines of one CMD that beat every 0.1 s from ``start`` to ``end``."""
    lines = [f"start {pid} {token} {start:.6f}"]
    t = start + 0.1
    while t < end:
        lines.append(f"beat {pid} {token} {t:.6f}")
        t += 0.1
    if stop:
        lines.append(f"stop {pid} {token} {end:.6f}")
    return lines


def test_successive_terms_are_clean() -> None:
    logs = {0: cmd(100, 5, 10.0, 12.0, stop=True), 1: cmd(200, 7, 14.5, 16.0)}
    found = referee.judge_leaders(logs, {}, SLACK)
    assert found["lead_violations"] == []
    assert (found["lead_terms"], found["lead_overlaps"], found["lead_stale_lines"]) == (2, 0, 0)


def test_overlapping_cmds_are_a_violation() -> None:
    # leader 1's term began while leader 0's CMD still ran, and leader 0 was never paused
    logs = {0: cmd(100, 5, 10.0, 13.0), 1: cmd(200, 7, 12.0, 15.0)}
    found = referee.judge_leaders(logs, {}, SLACK)
    assert found["lead_overlaps"] == 1
    assert any(v.startswith("lead-overlap: CMD 100") for v in found["lead_violations"])


def test_a_pause_after_the_newer_term_began_does_not_excuse_an_overlap() -> None:
    logs = {0: cmd(100, 5, 10.0, 13.0), 1: cmd(200, 7, 12.0, 15.0)}
    found = referee.judge_leaders(logs, {0: [(12.5, 12.8)]}, SLACK)
    assert found["lead_overlaps"] == 1


def test_a_paused_leaders_stale_lines_with_a_lower_token_are_counted_not_violations() -> None:
    # leader 0 paused at 11 (its CMD's lines stop), leader 1 leads from 13.2, leader 0
    # resumes at 15 and its CMD logs 0.2 s more before dblock lead stops it
    old = [line for line in cmd(100, 5, 10.0, 15.2) if not 11.0 < float(line.split()[3]) < 15.0]
    logs = {0: old, 1: cmd(200, 7, 13.2, 18.0)}
    found = referee.judge_leaders(logs, {0: [(11.0, 15.0)]}, SLACK)
    assert found["lead_violations"] == []
    assert found["lead_overlaps"] == 0
    assert found["lead_stale_terms"] == 1 and found["lead_stale_lines"] >= 2


def test_stale_lines_long_after_the_resume_are_a_violation() -> None:
    old = [line for line in cmd(100, 5, 10.0, 18.0) if not 11.0 < float(line.split()[3]) < 15.0]
    logs = {0: old, 1: cmd(200, 7, 13.2, 18.0)}
    found = referee.judge_leaders(logs, {0: [(11.0, 15.0)]}, SLACK)
    assert found["lead_overlaps"] == 1


def test_a_paused_cmd_with_the_greater_token_is_a_violation() -> None:
    # the paused one must be the deposed leader: a newer term under an older token is wrong
    old = [line for line in cmd(100, 9, 10.0, 15.2) if not 11.0 < float(line.split()[3]) < 15.0]
    logs = {0: old, 1: cmd(200, 7, 13.2, 18.0)}
    found = referee.judge_leaders(logs, {0: [(11.0, 15.0)]}, SLACK)
    assert found["lead_violations"]


def test_tokens_of_successive_starts_must_increase() -> None:
    logs = {0: cmd(100, 7, 10.0, 12.0, stop=True), 1: cmd(200, 5, 13.0, 14.0)}
    found = referee.judge_leaders(logs, {}, SLACK)
    assert any(v.startswith("lead-order") for v in found["lead_violations"])
    same = {0: cmd(100, 7, 10.0, 12.0, stop=True), 1: cmd(200, 7, 13.0, 14.0)}
    found = referee.judge_leaders(same, {}, SLACK)
    assert any("ran twice" in v for v in found["lead_violations"])


def test_a_start_delayed_by_a_pause_is_stale_not_out_of_order() -> None:
    # leader 0 was granted token 5 and paused before its CMD started; leader 1 led with 7;
    # on the resume leader 0's CMD starts, and dblock lead stops it at once
    logs = {0: cmd(100, 5, 15.05, 15.1), 1: cmd(200, 7, 13.0, 18.0)}
    found = referee.judge_leaders(logs, {0: [(10.5, 15.0)]}, SLACK)
    assert found["lead_violations"] == []
    assert found["lead_stale_terms"] == 1


def test_logs_are_read_per_leader_and_cut_lines_reported(tmp_path: Path) -> None:
    (tmp_path / "lead0.log").write_text("\n".join(cmd(100, 5, 10.0, 10.5)) + "\n")
    (tmp_path / "lead3.log").write_text("start 300 9 20.0\nbeat 300 9 20.1\nbeat 30")
    (tmp_path / "lead-stderr-0.txt").write_text("not a log")
    logs = referee.load_lead_logs(str(tmp_path))
    assert sorted(logs) == [0, 3]
    found = referee.judge_leaders(logs, {}, SLACK)
    assert found["lead_terms"] == 2
    assert [v for v in found["lead_violations"] if v.startswith("lead-log")]


def test_failover_is_measured_from_the_kill_to_another_leaders_start() -> None:
    starts = [(10.0, 0, 5), (12.6, 1, 7), (20.0, 2, 9)]
    faults = [
        {"kind": "kill", "lead": 0, "start": 10.5},
        {"kind": "kill", "pid": 1, "start": 11.0},  # a worker's
    ]
    assert referee.lead_failovers(starts, faults) == [12.6 - 10.5]


def _lost_hold(rel_sent: float, rel_ret: float) -> dict[str, object]:
    """A hold of a 2 s lease, acquire sent at 10.0, reported lost by its release."""
    return {
        "key": "k",
        "token": 7,
        "sent": 10.0,
        "rel_sent": rel_sent,
        "rel_ret": rel_ret,
        "outcome": "lost",
        "detail": "LockLost",
    }


def test_a_loss_nothing_could_have_caused_is_a_false_loss() -> None:
    quick = _lost_hold(10.9, 10.95)  # released within half the lease, and at once
    for file_lock in (False, True):
        (found,) = referee.false_losses([quick], [], 2.0, file_lock)
        assert found.startswith("false-loss: k: token 7 held 0.90 s")
        assert "its release took 0.05 s" in found


def test_a_release_that_waited_for_the_file_past_the_lease_may_find_it_lost() -> None:
    """On a store of one file lock (SQLite) a release may wait for the file's write lock, held
    by a holder the machine did not schedule: returned past the lease's end, it may have run
    after it. Elsewhere the same timing stays a false loss (a slow retry after a lost reply
    must still count the first attempt's release)."""
    slow = _lost_hold(10.9, 12.1)
    assert referee.false_losses([slow], [], 2.0, file_lock=True) == []
    (found,) = referee.false_losses([slow], [], 2.0, file_lock=False)
    assert "its release took 1.20 s" in found
