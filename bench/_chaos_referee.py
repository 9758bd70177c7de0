"""The referee: reads the workers' logs, the orchestrator's fault log and the audit table
(the database's own record of accepted writes, in commit order), and judges.

Violations (each must be 0):

* ``order``: an accepted write's token is not greater than the previous accepted write's on
  the same resource (commit order from the audit table).
* ``overlap``: two holds of one resource overlapped in time, both writes were accepted, and
  the one that committed later carries the smaller token.
* ``final``: the resource row does not end with the token and writer of its last accepted
  write.
* ``audit``: a worker saw its write accepted but the audit table has no such write.
* ``mutex``: two holds of one key were live at once by the lock's own account: the later one
  was acquired before the earlier one's release was sent, and that release still succeeded.
* ``token``: a hold acquired after another hold of the same key had been acquired carries a
  token that is not greater.
* ``false-loss``: a hold was reported lost (``LockLost`` from its release, or ``on_lost``)
  although nothing could have ended it: it did not renew, its release was sent within half
  a lease of its acquire, and no fault but lost replies, kills and pauses of other
  processes overlapped it (a lost reply, in particular, must never be taken for a loss).
* ``lost-update``: a key's counter in the guarded writers' business table (no token column)
  is not the number of their committed transactions on it (log rows): two holders'
  read-modify-writes interleaved, the later one's write erasing the other's.
* ``interleave``: two committed guarded transactions wrote the same counter value for one
  key (both read it before either wrote), or a later value carries a token that is not
  greater (a stale holder's transaction committed after its successor's).
* ``guarded-audit``: a worker saw its guarded transaction commit but its log row is missing.
* ``escape``: an exception outside dblock's hierarchy came out of dblock.
* ``hang``: a process did not end by the deadline plus grace (workers and ``dblock lead``).

The leaders (``dblock lead`` running ``_chaos_lead_cmd.py``, which logs ``start``, ``beat``
and ``stop`` lines with its term's token): ``judge_leaders`` below.

* ``lead-overlap``: a CMD logged a line after a CMD with a greater token had started (two
  CMDs ran at once), unless its ``dblock lead`` had been paused (SIGSTOP of it and its CMD)
  since before that start and the line came within ``slack`` of the resume: the stale
  leader that fencing is for, counted as ``stale after pause``.
* ``lead-order``: a CMD started after a CMD with a greater or equal token had started (same
  exception), or two CMDs ran with one token.
"""

from __future__ import annotations

import bisect
import glob
import itertools
import json
import os
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


def load_logs(run_dir: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for path in sorted(glob.glob(os.path.join(run_dir, "w*.jsonl"))):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    events.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # a line cut by SIGKILL
    return events


def judge(
    *,
    events: list[dict[str, Any]],
    faults: list[dict[str, Any]],
    deaths: dict[int, float],
    hung: list[int],
    audit: list[tuple[int, int, int, str]],
    final: list[Any],
    run_end: float,
    ttl: float,
    guarded: dict[str, Any] | None = None,
    file_lock: bool = False,
) -> dict[str, Any]:
    """The summary; ``guarded``: the business tables of the guarded writers (``read_guarded``),
    None where there are none; ``file_lock``: one transaction holds the whole database (SQLite),
    so a holder paused inside its guarded transaction stalls every other holder."""
    holds: dict[str, dict[str, Any]] = {}
    violations: list[str] = []
    counts: Counter[str] = Counter()
    for ev in events:
        kind = ev["ev"]
        counts["ev_" + kind] += 1
        if kind in ("hold", "write", "end", "gbegin", "guarded"):
            # one owner holds several keys at once with lock_many: a hold is (owner, key)
            h = holds.setdefault(f"{ev['owner']} {ev['key']}", {"owner": ev["owner"]})
            if kind == "hold" and ev.get("many"):
                counts["many_holds"] += 1
            h.update({k: v for k, v in ev.items() if k not in ("ev", "t")})
            if kind == "end":
                h["ended"] = ev["rel_ret"]
        elif kind == "escape":
            violations.append(f"escape: {ev.get('op')}: {ev.get('cls')}: {ev.get('msg')}")
        elif kind == "error":
            counts[f"error_{ev.get('op')}"] += 1
        elif kind == "slow":
            counts["slow_acquire"] += 1
            counts["slow_max_ms"] = max(counts["slow_max_ms"], int(1000 * ev["took"]))
    for h in holds.values():
        if "ended" not in h:  # killed, or still stopped at the end: the hold ends with it
            h["ended"] = deaths.get(h["pid"], run_end)
            h.setdefault("outcome", "died")
        counts["release_" + h.get("outcome", "none")] += 1
        if "accepted" in h:
            acc = h["accepted"]
            counts["write_" + {True: "accepted", False: "rejected", None: "error"}[acc]] += 1
        if h.get("on_lost"):
            counts["on_lost"] += 1
        if "goutcome" in h:
            counts["guarded_" + h["goutcome"]] += 1

    by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for h in holds.values():
        if "got" in h:
            by_key[h["key"]].append(h)
    overlaps = 0
    for hs in by_key.values():
        hs.sort(key=lambda h: h["got"])
        for i, a in enumerate(hs):
            for b in hs[i + 1 :]:
                if b["got"] >= a["ended"]:
                    break
                if b["got"] < a.get("rel_sent", a["ended"]):
                    overlaps += 1  # b acquired before a's release was even sent
    violations += exclusion_violations(by_key)
    violations += false_losses(holds.values(), faults, ttl, file_lock)
    if guarded is not None:
        violations += guarded_violations(holds.values(), guarded)

    # the database's record of accepted writes
    by_rid: dict[int, list[tuple[int, int, str]]] = defaultdict(list)
    for seq, rid, token, owner in audit:
        by_rid[rid].append((seq, token, owner))
    audited = {(owner, token) for _, _, token, owner in audit}
    for h in holds.values():
        if h.get("accepted") is True and (h["owner"], h["token"]) not in audited:
            violations.append(f"audit: write of token {h['token']} by {h['owner']} not audited")
    for rid, writes in by_rid.items():
        for (_, t1, _), (_, t2, _) in itertools.pairwise(writes):
            if t2 <= t1:
                violations.append(f"order: resource {rid}: token {t2} accepted after {t1}")
        # overlapping holds whose accepted writes committed against token order
        spans = []
        for seq, token, owner in writes:
            h = holds.get(owner)
            if h is not None and "got" in h:
                spans.append((h["got"], h["ended"], seq, token))
        spans.sort()
        for i, (_s1, e1, q1, t1) in enumerate(spans):
            for s2, _e2, q2, t2 in spans[i + 1 :]:
                if s2 >= e1:
                    break
                later, earlier = (t2, t1) if q2 > q1 else (t1, t2)
                if later <= earlier:
                    violations.append(
                        f"overlap: resource {rid}: overlapping holds' writes committed with "
                        f"token {later} after {earlier}"
                    )
    for rid, writer, token in final:
        writes = by_rid.get(int(rid), [])
        if writes:
            _, last_token, last_owner = writes[-1]
            if token is None or int(token) != last_token or writer != last_owner:
                violations.append(
                    f"final: resource {rid} ends with token {token}, last accepted {last_token}"
                )
        elif token is not None:
            violations.append(f"final: resource {rid} has token {token} but no audited write")

    for pid in hung:
        violations.append(f"hang: process {pid} had not ended by the deadline plus grace")

    # availability after each fault
    recovery: dict[str, list[float]] = defaultdict(list)
    unrecovered: Counter[str] = Counter()
    for f in faults:
        if f.get("lead") is not None:  # a leader's: judge_leaders measures its failover
            continue
        keys = [f["key"]] if f.get("key") else list(by_key) or []
        worst = 0.0
        for key in keys:
            after = [
                h["got"]
                for h in by_key.get(key, [])
                if h["got"] > f["start"] and h["owner"] != f.get("owner")
            ]
            if after:
                worst = max(worst, min(after) - f["start"])
            elif f["start"] < run_end - 3 * ttl - 10:
                unrecovered[f["kind"]] += 1
                worst = float("inf")
        f["recovery"] = worst
        if worst != float("inf"):
            recovery[f["kind"]].append(worst)

    first_hold = min((ev["t"] for ev in events if ev["ev"] == "hold"), default=float("inf"))
    return {
        "holds": len([h for h in holds.values() if "got" in h]),
        # the injector waits for a first hold: a fault before it would test nothing
        "faults_before_first_hold": sum(f["start"] < first_hold for f in faults),
        "many_holds": counts["many_holds"],
        "faults": dict(Counter(f["kind"] for f in faults)),
        "fault_durations": {
            k: max((f["end"] - f["start"]) for f in faults if f["kind"] == k)
            for k in {f["kind"] for f in faults}
        },
        "recovery_worst": {k: max(v) for k, v in recovery.items()},
        "recovery_median": {k: sorted(v)[len(v) // 2] for k, v in recovery.items()},
        "unrecovered": dict(unrecovered),
        "accepted": counts["write_accepted"],
        "rejected_stale": counts["write_rejected"],
        "write_errors": counts["write_error"],
        "released_ok": counts["release_ok"],
        "released_lost": counts["release_lost"],
        "release_errors": counts["release_error"],
        "died_holding": counts["release_died"],
        "on_lost_calls": counts["on_lost"],
        "acquire_errors": counts["error_acquire"],
        "connect_errors": counts["error_connect"],
        "overlapping_holds": overlaps,
        "audited_writes": len(audit),
        "hung": len(hung),
        "slow_acquires": counts["slow_acquire"],
        "slow_acquire_max": counts["slow_max_ms"] / 1000,
        # guarded writers (per key; None: the store has none)
        "guarded_commits": None if guarded is None else len(guarded["log"]),
        "guarded_acked": counts["guarded_committed"],
        "guard_lost": counts["guarded_lost"],
        "guarded_errors": counts["guarded_error"],
        "violations": violations,
    }


def exclusion_violations(by_key: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The lock's own account of mutual exclusion, from the holders' logs.

    Database order of two acquisitions of one key is their token order. If ``hi`` (the later
    token) had been granted — its acquire call returned — before ``lo``'s release was even
    sent, and that release still succeeded, both leases were live at once: a violation.
    Timestamps of when a call *returned* are never used as the database's order (a holder
    paused inside acquire returns late with an old, already expired token).
    Also: a hold whose acquire was sent after another's had returned has the greater token.
    """
    found = []
    for key, hs in by_key.items():
        by_token = sorted(hs, key=lambda h: h["token"])
        for i, lo in enumerate(by_token):
            rel = lo.get("rel_sent") if lo.get("outcome") == "ok" else None
            for hi in by_token[i + 1 :]:
                if rel is not None and hi["got"] < rel:
                    found.append(
                        f"mutex: {key}: token {hi['token']} was granted (by {hi['got']:.3f}) "
                        f"before the release of token {lo['token']} was sent "
                        f"({rel:.3f}), and that release succeeded"
                    )
                if hi["token"] == lo["token"] or lo["sent"] > hi["got"]:
                    found.append(
                        f"token: {key}: token {hi['token']} was granted before an "
                        f"acquisition sent later got token {lo['token']}"
                    )
    return found


def guarded_violations(holds: Iterable[dict[str, Any]], guarded: dict[str, Any]) -> list[str]:
    """The business tables against the guarded writers' account (see ``lost-update``,
    ``interleave`` and ``guarded-audit`` above)."""
    found = []
    by_rid: dict[int, list[tuple[int, int, str, int]]] = defaultdict(list)
    for _seq, rid, n, owner, token in guarded["log"]:
        by_rid[rid].append((n, _seq, owner, token))
    for rid, counter in sorted(guarded["counters"].items()):
        rows = sorted(by_rid.get(rid, []))
        if counter != len(rows):
            found.append(
                f"lost-update: resource {rid}: counter {counter} after {len(rows)} committed "
                "guarded transactions (two holders' transactions interleaved)"
            )
        for (n1, _, o1, t1), (n2, _, o2, t2) in itertools.pairwise(rows):
            if n1 == n2:
                found.append(
                    f"interleave: resource {rid}: tokens {t1} ({o1}) and {t2} ({o2}) both "
                    f"committed counter {n1}"
                )
            elif t2 <= t1:
                found.append(
                    f"interleave: resource {rid}: counter {n2} committed with token {t2} "
                    f"after counter {n1} with token {t1}"
                )
    logged = {(owner, rid, token) for _, rid, _, owner, token in guarded["log"]}
    for h in holds:
        if h.get("goutcome") == "committed" and (h["owner"], h["rid"], h["token"]) not in logged:
            found.append(
                f"guarded-audit: committed transaction of token {h['token']} by {h['owner']} "
                f"on resource {h['rid']} has no log row"
            )
    return found


def _guarded_spans(holds: Iterable[dict[str, Any]]) -> dict[int, list[tuple[float, float]]]:
    """Per pid, when it had a guarded transaction open (to its end, or its process's)."""
    spans: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for h in holds:
        if "g0" in h:
            spans[h["pid"]].append((h["g0"], h.get("g1", h["ended"])))
    return spans


#: faults that end no other process's hold
_HARMLESS = ("lostreply", "kill", "pause")


def false_losses(
    holds: Iterable[dict[str, Any]],
    faults: list[dict[str, Any]],
    ttl: float,
    file_lock: bool = False,
) -> list[str]:
    """Holds reported lost that nothing could have ended (see ``false-loss`` above).

    ``file_lock``: a holder paused inside its guarded transaction keeps the database's one
    write lock (SQLite): no other holder renews or releases until it ends, as under a
    ``filelock`` fault, so such a pause counts as a fault for every hold. So may a holder
    that the machine did not schedule for a while inside any transaction, which is no fault:
    there, a release that returned a whole lease after its acquire was sent may have run after
    the lease's end, and its loss is no false one. (A lost reply is no excuse: the embedded
    file has none.)"""
    holds = list(holds)
    stalls = []
    if file_lock:
        spans = _guarded_spans(holds)
        stalls = [
            f
            for f in faults
            if f["kind"] == "pause"
            and any(g0 < f["end"] and g1 > f["start"] for g0, g1 in spans.get(f.get("pid"), []))
        ]
    found = []
    for h in holds:
        lost = h.get("outcome") == "lost" or bool(h.get("on_lost"))
        if not lost or h.get("auto_renew") or "rel_sent" not in h or "sent" not in h:
            continue
        if h["rel_sent"] - h["sent"] >= 0.5 * ttl:
            continue  # a slow machine may have let the lease run out
        start, end = h["sent"], h.get("rel_ret", h["rel_sent"])
        if file_lock and end - start >= ttl:
            continue  # the release waited for the file past the lease's end (see above)
        if any(
            f["start"] < end
            and f.get("end", end) > start
            and (f["kind"] not in _HARMLESS or (f["kind"] == "pause" and f.get("pid") == h["pid"]))
            for f in faults
        ) or any(f["start"] < end and f["end"] > start for f in stalls):
            continue
        found.append(
            f"false-loss: {h['key']}: token {h['token']} held {h['rel_sent'] - h['sent']:.2f} s "
            f"of a {ttl:g} s lease (its release took {end - h['rel_sent']:.2f} s) was reported "
            f"lost ({h.get('detail') or 'on_lost'})"
        )
    return found


# -- the leaders ------------------------------------------------------------------------------
@dataclass
class CmdRun:
    """One CMD process of a ``dblock lead``: one term."""

    lead: int
    pid: int
    token: int
    #: the times of its lines, in order (the first is its start)
    times: list[float] = field(default_factory=list)
    started: bool = False
    stopped: bool = False

    @property
    def start(self) -> float:
        return self.times[0]


def load_lead_logs(run_dir: str) -> dict[int, list[str]]:
    """The CMD logs of the leaders, by the ``dblock lead`` process's index (``lead<i>.log``)."""
    logs: dict[int, list[str]] = {}
    for path in glob.glob(os.path.join(run_dir, "lead*.log")):
        found = re.fullmatch(r"lead(\d+)\.log", os.path.basename(path))
        if found:
            with open(path, encoding="utf-8", errors="replace") as fh:
                logs[int(found.group(1))] = fh.read().splitlines()
    return logs


def cmd_runs(logs: dict[int, list[str]]) -> tuple[list[CmdRun], list[str]]:
    """The CMD runs in the logs, and what is wrong with the lines themselves."""
    runs: dict[tuple[int, int], CmdRun] = {}
    bad: list[str] = []
    for lead, lines in logs.items():
        for text in lines:
            parts = text.split()
            try:
                kind, pid, token, t = parts[0], int(parts[1]), int(parts[2]), float(parts[3])
            except (IndexError, ValueError):
                bad.append(f"lead-log: leader {lead}: unreadable line {text[:80]!r}")
                continue
            run = runs.setdefault((lead, pid), CmdRun(lead, pid, token))
            if token != run.token:
                bad.append(f"lead-log: CMD {pid} logged tokens {run.token} and {token}")
            run.times.append(t)
            run.started |= kind == "start"
            run.stopped |= kind == "stop"
    for run in runs.values():
        run.times.sort()
    return sorted(runs.values(), key=lambda r: r.start), bad


def judge_leaders(
    logs: dict[int, list[str]],
    pauses: dict[int, list[tuple[float, float]]],
    slack: float,
) -> dict[str, Any]:
    """Did two leaders' CMDs ever run at once (see ``lead-overlap`` and ``lead-order``)?

    ``pauses``: per leader index, the (SIGSTOP, SIGCONT) moments of its ``dblock lead`` and
    CMD. A CMD's line after a newer term's start is excused only as the stale leader's: its
    process was stopped before the newer term started (it could not have seen the loss) and
    the line came within ``slack`` seconds of the resume, before ``dblock lead`` stopped it.
    """
    runs, violations = cmd_runs(logs)
    by_token = sorted(runs, key=lambda r: r.token)
    for a, b in itertools.pairwise(by_token):
        if a.token == b.token:
            violations.append(
                f"lead-order: token {a.token} ran twice (CMDs {a.pid} and {b.pid}, "
                f"leaders {a.lead} and {b.lead})"
            )
    # the earliest start of any term with a greater token, per run
    newer_start: dict[int, float] = {}
    earliest = float("inf")
    for run in reversed(by_token):
        newer_start[id(run)] = earliest
        earliest = min(earliest, run.start)

    def stale(run: CmdRun, t: float, newer: float) -> bool:
        return any(p0 <= newer and p1 <= t <= p1 + slack for p0, p1 in pauses.get(run.lead, []))

    overlaps = stale_lines = stale_terms = 0
    for run in runs:
        newer = newer_start[id(run)]
        late = run.times[bisect.bisect_left(run.times, newer) :]
        if not late:
            continue
        unexcused = [t for t in late if not stale(run, t, newer)]
        if unexcused:
            overlaps += 1
            violations.append(
                f"lead-overlap: CMD {run.pid} of leader {run.lead} (token {run.token}) ran "
                f"until {unexcused[-1]:.3f}, after a term with a greater token had started at "
                f"{newer:.3f} ({len(unexcused)} lines)"
            )
        else:
            stale_lines += len(late)
            stale_terms += 1
    top = -1
    for run in runs:
        if run.token < top and not stale(run, run.start, newer_start[id(run)]):
            violations.append(
                f"lead-order: CMD {run.pid} of leader {run.lead} started with token "
                f"{run.token} after a CMD with token {top} had started"
            )
        top = max(top, run.token)
    return {
        "lead_terms": len(runs),
        "lead_beats": sum(len(r.times) for r in runs),
        "lead_overlaps": overlaps,
        "lead_stale_lines": stale_lines,
        "lead_stale_terms": stale_terms,
        "lead_violations": violations,
        "lead_starts": [(r.start, r.lead, r.token) for r in runs],
    }


def lead_failovers(
    starts: list[tuple[float, int, int]], faults: list[dict[str, Any]]
) -> list[float]:
    """Seconds from each kill of the leader to the next CMD start by another leader."""
    found = []
    for f in faults:
        if f["kind"] == "kill" and f.get("lead") is not None:
            after = [t for t, lead, _ in starts if t > f["start"] and lead != f["lead"]]
            if after:
                found.append(min(after) - f["start"])
    return found


def render(summary: dict[str, Any], header: str) -> str:
    rows = [
        ("holds", summary["holds"]),
        ("of them lock_many (per key)", summary["many_holds"]),
        ("fenced writes accepted", summary["accepted"]),
        ("stale writes rejected by fencing", summary["rejected_stale"]),
        ("fenced writes failed (db error)", summary["write_errors"]),
        ("overlapping holds (lease ran out under a holder)", summary["overlapping_holds"]),
        (
            "releases ok / LockLost / error / died holding",
            f"{summary['released_ok']} / {summary['released_lost']} / "
            f"{summary['release_errors']} / {summary['died_holding']}",
        ),
        ("on_lost callbacks", summary["on_lost_calls"]),
        ("acquire errors (BackendError)", summary["acquire_errors"]),
        ("connect errors", summary["connect_errors"]),
        (
            "acquire(timeout=T) overran T by > 5 s (longest)",
            f"{summary['slow_acquires']} ({summary['slow_acquire_max']:.1f} s)",
        ),
        ("hung processes", summary["hung"]),
    ]
    if summary.get("guarded_commits") is not None:
        rows += [
            (
                "guarded commits (log rows) / acked by workers"
                + ("" if summary.get("guard", True) else " [UNGUARDED]"),
                f"{summary['guarded_commits']} / {summary['guarded_acked']}",
            ),
            ("guard LockLost (rolled back)", summary["guard_lost"]),
            ("guarded transactions failed (rolled back)", summary["guarded_errors"]),
        ]
    if summary.get("leaders"):
        fail = summary["lead_failover"]
        rows += [
            (
                "leaders (dblock lead) / terms (CMDs started)",
                f"{summary['leaders']} / {summary['lead_terms']}",
            ),
            (
                "kills / pauses of the leader",
                f"{summary['lead_kills']} / {summary['lead_pauses']}",
            ),
            (
                "failover after a leader kill, median / worst",
                "-" if not fail else f"{sorted(fail)[len(fail) // 2]:.2f} / {max(fail):.2f} s",
            ),
            (
                "stale CMD lines after a pause (lower token) / terms",
                f"{summary['lead_stale_lines']} / {summary['lead_stale_terms']}",
            ),
            ("dblock lead exits 69 (store unreachable), started again", summary["lead_exits"]),
            ("overlapping CMDs (violations)", summary["lead_overlaps"]),
        ]
    rows += [
        ("violations", len(summary["violations"])),
    ]
    width = max(len(r[0]) for r in rows) + 2
    out = [header, "-" * len(header)]
    out += [f"{name:<{width}}{value}" for name, value in rows]
    out.append("")
    out.append(
        f"{'fault':<14}{'count':>6}{'longest s':>11}{'recovery median s':>19}"
        f"{'worst s':>9}{'unrecovered':>13}"
    )
    for kind in sorted(summary["faults"]):
        med = summary["recovery_median"].get(kind)
        worst = summary["recovery_worst"].get(kind)
        out.append(
            f"{kind:<14}{summary['faults'][kind]:>6}{summary['fault_durations'][kind]:>11.2f}"
            f"{'-' if med is None else f'{med:.2f}':>19}"
            f"{'-' if worst is None else f'{worst:.2f}':>9}"
            f"{summary['unrecovered'].get(kind, 0):>13}"
        )
    if summary["faults"].get("pause", 0) >= 5 and summary["rejected_stale"] == 0:
        out.append("NOTE no stale write was rejected although holders were paused")
    for v in summary["violations"][:20]:
        out.append("VIOLATION " + v)
    if len(summary["violations"]) > 20:
        out.append(f"... and {len(summary['violations']) - 20} more")
    return "\n".join(out)
