"""Fault-injection soak for dblock (issue 7): crash, pause and cut off lock holders, restart
the database, and let an independent referee check that the fenced resource never accepted a
stale write and that no process hung.

    python bench/chaos.py --url postgresql://postgres@127.0.0.1:5432/test --duration 60 \\
        [--workers 8] [--keys 3] [--ttl 2] [--leaders 3] \\
        [--server-cmd CMD | --restart-server] [--json summary.json]

Workers (``_chaos_worker.py``) take ``--keys`` keys with ``--ttl`` leases and, in each hold,
make one fenced write (``dblock.fencing``) to a protected table; half of them use
``auto_renew``. On the SQL stores (PostgreSQL, MySQL/MariaDB, SQLite: ``CommitGuards``) each
hold then runs a guarded transaction on the worker's own application connection (the store's
driver): BEGIN, ``lock.guard(conn)``, read the key's counter in a business table with no
token column, work, write counter + 1 and a log row, COMMIT, and only then release; a
LockLost from the guard rolls it back. The referee checks that no two holders' transactions
interleaved (the counter equals the committed log rows).

Where the store keeps leaders' values (``LeaderValues``), ``--leaders`` processes (default 3)
run ``dblock lead`` on one election with the same ttl, each with ``_chaos_lead_cmd.py`` as
its CMD, which logs its term's token while it runs: ``dblock lead`` must never let two of
them run at once. At the deadline they get SIGTERM (which ends the CMD, then dblock); one
that exits while campaigning (store unreachable: status 69) is started again.

Beside them the injector picks, from the first hold on, every ``--fault-interval`` seconds
(each kind that applies once first, in random order, then at random):

* ``kill``: SIGKILL the process that holds a key (from ``client.info``), start a new worker;
  with leaders, every other kill is of the ``dblock lead`` that leads (its CMD dies with it:
  PR_SET_PDEATHSIG), and a new ``dblock lead`` is started;
* ``pause``: SIGSTOP a holder for 1.5-3 leases, then SIGCONT (its write is then stale); with
  leaders, every other pause is of the leader's ``dblock lead`` and its CMD, a whole host
  frozen (its CMD is looked for once ``dblock lead`` has stopped, so a CMD being started is
  frozen too; the CMD is continued first: it may log a few stale lines, with its lower
  token, before ``dblock lead`` stops it);
* ``connkill``: terminate the workers' sessions from the server side (PostgreSQL
  ``pg_terminate_backend`` by ``application_name``; MariaDB ``KILL`` by a user made for the
  run) — PostgreSQL and MySQL/MariaDB;
* ``restart``: take the database server down and start it again, at most once per
  ``--restart-gap`` seconds — PostgreSQL and MySQL/MariaDB, with one of

  - ``--server-cmd CMD``: chaos runs the server itself, ``CMD`` (split like a shell line) in
    the foreground, e.g. ``'postgres -D /tmp/pg -p 5544 -c listen_addresses=127.0.0.1'``
    for a URL on port 5544. A restart SIGKILLs the server's whole process group (a crash)
    and runs ``CMD`` again; chaos starts it before the run and SIGKILLs it on exit. Give it
    a private server (its own data directory and port), as the test suite does;
  - ``--restart-server`` (by hand only): this host's PostgreSQL/MariaDB service on its
    default port, stopped cleanly (``pg_ctlcluster``, ``mariadb-admin shutdown``) and
    started again. That disturbs every other client of the server: never on a machine that
    others use;
* ``filelock``: hold ``BEGIN EXCLUSIVE`` on the SQLite file for 1.5-2.5 leases — SQLite.
* ``storekill``: for a quorum (``--url`` of several URLs separated by spaces, each store run
  by chaos with ``--member-cmd``, once per store in the same order): SIGKILL one store's
  server and start it again 0.5-2 s later (a Redis without persistence comes back empty).
  One store at a time, and the next only 3 leases after the last one came back, by which
  time every hold granted while it was down has ended or been renewed onto it again
  (docs/stores/quorum.md: a second store restarting empty while a hold lives on a bare majority
  would break the guarantee).

* ``rolling``: for a quorum of at least three stores run by chaos: the stores, in random
  order, go down one after another, never two at once: each but the last is SIGKILLed and
  started again empty (3 leases apart, as for ``storekill``), then the last one is SIGSTOPped
  for 1.5-3 leases (unreachable, its data kept). The workers are stopped (SIGSTOP) until the
  last store is, so that the keys are idle and no grant carries a fence to the restarted
  stores (the leaders too, with their CMDs): the grants after it come from stores that
  have lost every key, and their tokens must still be above every token issued before
  (docs/quorum.md: the fence is floored by the stores' clocks).
* ``lostreply``: for etcd: the workers reach the cluster through a proxy of chaos's
  (``tests/_proxy.py``, their only endpoint, in front of the cluster's first), which for
  1-2 s forwards each call a worker opens, then swallows the answer and resets the
  connection. To the worker the call failed, to etcd it succeeded: the retry must recognise
  its own effect (an acquire, a renewal, a release, a queue step), never take it for a loss.

The referee (``_chaos_referee.py``) is described there. Exit status: 0 clean, 1 violations
or hangs, 2 bad arguments, 3 the database was unreachable at the start, 130 interrupted.
Only loopback URLs are accepted; every process started here is ended on exit (Ctrl-C too),
this host's service is started again if a restart fault had stopped it, and a
``--server-cmd`` server is ended.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import secrets
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _chaos_db as db  # noqa: E402
import _chaos_procs as chaos_procs  # noqa: E402
import _chaos_referee as referee  # noqa: E402
import _chaos_server as servers  # noqa: E402
import dblock  # noqa: E402
from dblock._contract import capabilities  # noqa: E402
from dblock.cli.exit_codes import UNAVAILABLE  # noqa: E402
from dblock.cli.supervisor import MARGIN_SECONDS, descendants, shortest_ttl  # noqa: E402

FAULTS = ("kill", "pause", "connkill", "restart", "filelock", "storekill", "rolling", "lostreply")
ROOT = HERE.parent
#: the election the leaders run for
ELECTION = "chaos-lead"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--url", required=True, help="database URL (loopback only)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load (default 60)")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--keys", type=int, default=3)
    p.add_argument(
        "--leaders",
        type=int,
        default=3,
        help="dblock lead processes on one election, where the store keeps leaders' values "
        "(default 3; 0: none)",
    )
    p.add_argument("--ttl", type=float, default=2.0, help="lease in seconds (default 2)")
    restart = p.add_mutually_exclusive_group()
    restart.add_argument(
        "--server-cmd",
        metavar="CMD",
        help="run the server at --url as this command (a private one) and include restarts: "
        "SIGKILL to its process group, then CMD again",
    )
    restart.add_argument(
        "--restart-server",
        action="store_true",
        help="include restarts of THIS HOST's PostgreSQL/MariaDB service (default port); "
        "it disturbs every other client of it: by hand only",
    )
    p.add_argument(
        "--member-cmd",
        metavar="CMD",
        action="append",
        default=[],
        help="for a quorum --url: run each store's server as this command (once per store, "
        "in --url's order) and include storekill faults",
    )
    p.add_argument(
        "--restart-gap",
        type=float,
        default=15.0,
        help="at least this many seconds between two server restarts (default 15)",
    )
    p.add_argument(
        "--faults",
        default=",".join(FAULTS),
        help="comma-separated fault kinds to use where they apply",
    )
    p.add_argument(
        "--fault-interval",
        default="1.0,4.0",
        metavar="MIN,MAX",
        help="seconds between faults, uniformly drawn (default 1.0,4.0)",
    )
    p.add_argument(
        "--grace",
        type=float,
        default=30.0,
        help="seconds after the deadline before a live process counts as hung",
    )
    p.add_argument("--no-auto-renew", action="store_true", help="no auto_renew workers")
    p.add_argument("--no-many", action="store_true", help="no lock_many workers")
    p.add_argument("--seed", type=int, default=None)
    # a test's: the guarded writers skip lock.guard (the lease alone), to show the referee
    # catching the interleaved transactions a pause past the lease then lets through
    p.add_argument("--unguarded", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json", help="write the summary as JSON to this file")
    p.add_argument(
        "--keep", action="store_true", help="keep the worker logs (the tables are always dropped)"
    )
    args = p.parse_args(argv)
    try:
        lo, hi = (float(x) for x in args.fault_interval.split(","))
    except ValueError:
        p.error("--fault-interval takes MIN,MAX")
    if not (0 < lo <= hi) or args.duration <= 0 or args.ttl <= 0:
        p.error("durations must be positive (and MIN <= MAX)")
    if not (1 <= args.workers <= 64 and 1 <= args.keys <= 100 and 0 <= args.leaders <= 16):
        p.error("--workers must be 1..64, --keys 1..100 and --leaders 0..16")
    if args.leaders and args.ttl < 2 * MARGIN_SECONDS + 0.1:
        p.error(f"--ttl {args.ttl:g} is too short for dblock lead: use --leaders 0")
    args.interval = (lo, hi)
    if args.server_cmd is not None and not shlex.split(args.server_cmd):
        p.error("--server-cmd is empty")
    unknown = set(args.faults.split(",")) - set(FAULTS)
    if unknown:
        p.error(f"unknown fault kinds {sorted(unknown)}; choose from {', '.join(FAULTS)}")
    return args


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.admin_url: str = args.url
        self.dialect = db.dialect_of(args.url)
        run = secrets.token_hex(4)
        self.run = run
        self.table = f"chaos_locks_{run}"
        self.resource = f"chaos_res_{run}"
        self.audit = f"chaos_audit_{run}"
        #: the guarded writers' business tables (SQL stores with CommitGuards)
        self.counter = f"chaos_counter_{run}"
        self.glog = f"chaos_glog_{run}"
        self.guarded = False
        self.dir = tempfile.mkdtemp(prefix=f"dblock-chaos-{run}-")
        self.tag = f"dblock_chaos_{run}"
        self.password = ""
        self.worker_url = args.url
        self.resource_url = db.resource_url(args.url, self.dir)
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.killed: set[int] = set()
        self.deaths: dict[int, float] = {}
        self.crashes: list[str] = []
        self.faults: list[dict[str, Any]] = []
        self.server_down = False
        self.sqlite_lock: sqlite3.Connection | None = None
        self.stopped: set[int] = set()
        self.next_index = 0
        self.server: servers.Server | None = None
        self.own_server: servers.OwnServer | None = None
        if self.dialect != "sqlite" and args.server_cmd:
            self.own_server = servers.OwnServer(
                shlex.split(args.server_cmd), args.url, Path(self.dir) / "server.log"
            )
            self.server = self.own_server
        elif self.dialect != "sqlite" and args.restart_server:
            self.server = servers.HostService(self.dialect)
        #: the servers of a quorum's stores that chaos runs (--member-cmd)
        self.members = [
            servers.OwnServer(shlex.split(cmd), url, Path(self.dir) / f"member{i}.log")
            for i, (cmd, url) in enumerate(zip(args.member_cmd, db.members(args.url), strict=False))
        ]
        self.kinds = self._kinds()
        #: the lost-reply proxy in front of etcd (``lostreply``)
        self.proxy: Any = None
        self.observer: dblock.Client | None = None
        self.last_restart = -math.inf
        self.last_storekill = -math.inf
        #: the leaders: how many run (0 where the store keeps no leaders' values), their
        #: ``dblock lead`` processes by pid, each one's index (its CMD's log is lead<i>.log)
        self.leaders = 0
        self.leads: dict[int, subprocess.Popen[bytes]] = {}
        self.lead_index: dict[int, int] = {}
        #: per leader index, the (SIGSTOP, SIGCONT) moments of its dblock lead and CMD
        self.lead_pauses: dict[int, list[tuple[float, float]]] = {}
        #: dblock lead processes that exited with UNAVAILABLE (the store was unreachable)
        self.lead_exits = 0
        #: whether the next kill (pause) is the leader's: they alternate with the workers',
        #: the leader's first (a short run sees both); a turn passes only once taken
        self.lead_turn = {"kill": True, "pause": True}

    def _kinds(self) -> list[str]:
        wanted = set(self.args.faults.split(","))
        ok = {"kill", "pause"}
        if self.dialect == "quorum":
            if self.members:
                ok.add("storekill")
            if len(self.members) >= 3:
                ok.add("rolling")
        elif self.dialect == "sqlite":
            ok.add("filelock")
        elif self.dialect == "etcd":  # no server-side session kill; a restart kills one node
            ok.add("lostreply")
            if self.server is not None:
                ok.add("restart")
        else:
            if self.dialect != "zookeeper":  # ZooKeeper cannot end a client's session
                ok.add("connkill")
            if self.server is not None:
                ok.add("restart")
        return sorted(wanted & ok)

    # -- setup ------------------------------------------------------------------------------
    def setup(self) -> None:
        for member in self.members:
            if not member.start():
                raise RuntimeError(f"a quorum store did not start:\n{member.log_tail()}")
        if self.own_server is not None and not self.own_server.start():
            raise RuntimeError(
                f"the server did not start ({self.args.server_cmd}):\n{self.own_server.log_tail()}"
            )
        if self.dialect == "postgresql":
            self.worker_url = db.with_query(self.args.url, application_name=self.tag)
        elif self.dialect == "redis":
            self.worker_url = db.with_query(self.args.url, client_name=self.tag)
        elif self.dialect == "etcd" and "lostreply" in self.kinds:
            self.worker_url = self.start_proxy()
        elif self.dialect == "mysql":
            # a user of its own tags the workers' sessions; its password has URL-special
            # characters, and the referee checks it never shows up in a message
            self.password = "p@ss:/%" + secrets.token_hex(6)
            db.mysql_create_user(self.admin_url, self.tag, self.password)
            self.worker_url = db.with_user(self.args.url, self.tag, self.password)
        with dblock.connect(self.worker_url, table=self.table) as client:
            # creates the lock table; lock_many holders run beside single-key ones where the
            # store takes several keys at once
            many = "ManyKeys" in capabilities(client._store)
            self.guarded = "CommitGuards" in capabilities(client._store)
            if "LeaderValues" in capabilities(client._store):
                self.leaders = self.args.leaders
        db.create_tables(self.resource_url, self.resource, self.audit, self.args.keys)
        if self.guarded:  # beside the lock table: guard needs the same database
            db.create_guarded_tables(self.admin_url, self.counter, self.glog, self.args.keys)
        self.start = time.monotonic()
        self.deadline = self.start + self.args.duration
        config = {
            "url": self.worker_url,
            "resource_url": self.resource_url,
            "table": self.table,
            "resource": self.resource,
            "audit": self.audit,
            "keys": self.args.keys,
            "ttl": self.args.ttl,
            "deadline": self.deadline,
            "dir": self.dir,
            "auto_renew": not self.args.no_auto_renew,
            "many": many and not self.args.no_many,
            # a Redis without persistence (alone, or as a quorum's store) loses its table with
            # each restart; a worker that starts after one connects as a service there does,
            # making it again (with create_schema=False a majority of restarted stores would
            # refuse every new client: no hold at all)
            "create_schema": self.dialect in ("redis", "quorum"),
            "guarded": (
                {"counter": self.counter, "log": self.glog, "guard": not self.args.unguarded}
                if self.guarded
                else None
            ),
        }
        self.config_path = os.path.join(self.dir, "config.json")
        with open(self.config_path, "w", encoding="utf-8") as fh:
            json.dump(config, fh)
        for _ in range(self.args.workers):
            self.spawn()
        for _ in range(self.leaders):  # they start beside the workers, not after them
            self.spawn_leader()

    def start_proxy(self) -> str:
        """Start the lost-reply proxy in front of the cluster's first endpoint; the workers'
        URL: the proxy alone (a client fails over to another endpoint after a reset and
        stays there, which would leave the proxy idle after the first losses)."""
        sys.path.insert(0, str(ROOT))
        from tests._proxy import Proxy

        scheme, rest = self.args.url.split("://", 1)
        netloc, sep, tail = rest.partition("/")
        if not sep:
            netloc, sep, tail = rest.partition("?")
        host, _, port = netloc.split(",")[0].rpartition(":")
        self.proxy = Proxy(host or "127.0.0.1", int(port or 2379), Path(self.dir) / "proxy")
        return f"{scheme}://127.0.0.1:{self.proxy.port}{sep}{tail}"

    def spawn(self) -> None:
        index = self.next_index
        self.next_index += 1
        err = open(os.path.join(self.dir, f"stderr-{index}.txt"), "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, str(HERE / "_chaos_worker.py"), self.config_path, str(index)],
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
        err.close()
        self.procs[proc.pid] = proc

    def spawn_leader(self) -> None:
        """Start one ``dblock lead``; the URL goes in the environment (never on a command
        line), and its CMD ends itself well after the run should the orchestrator vanish."""
        index = len(self.lead_index)
        grace = []
        if self.args.ttl < shortest_ttl(None):  # dblock lead's default kill grace is too long
            grace = ["--kill-grace", f"{max(0.01, self.args.ttl / 2 - MARGIN_SECONDS - 0.02):g}"]
        env = dict(os.environ)
        env.update(
            DBLOCK_URL=self.worker_url,
            DBLOCK_CHAOS_UNTIL=str(self.deadline + self.args.grace + 60),
        )
        err = open(os.path.join(self.dir, f"lead-stderr-{index}.txt"), "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dblock",
                "--table",
                self.table,
                "lead",
                ELECTION,
                "--ttl",
                f"{self.args.ttl:g}",
                *grace,
                "--",
                sys.executable,
                str(HERE / "_chaos_lead_cmd.py"),
                os.path.join(self.dir, f"lead{index}.log"),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
            start_new_session=True,
        )
        err.close()
        self.leads[proc.pid] = proc
        self.lead_index[proc.pid] = index

    def live_leads(self) -> list[int]:
        return [p for p, proc in self.leads.items() if proc.poll() is None and p not in self.killed]

    def leader(self) -> tuple[int, str] | None:
        """(pid, owner) of the ``dblock lead`` that holds the election now, by the store."""
        try:
            if self.observer is None:
                self.observer = dblock.connect(self.admin_url, table=self.table)
            info = self.observer.info(ELECTION)
        except dblock.BackendError:
            return None
        if info is None:
            return None
        pid = int(info.owner.rsplit(":", 3)[1])
        return (pid, info.owner) if pid in self.live_leads() else None

    def stop_leaders(self, pids: list[int]) -> list[int]:
        """SIGSTOP these ``dblock lead`` processes, then their CMDs; every process stopped,
        leaders first (for resume_leaders)."""
        return chaos_procs.freeze(pids, descendants)

    def resume_leaders(self, stopped: list[int], since: float) -> None:
        """SIGCONT the CMDs, then their ``dblock lead``; record the pauses, from ``since``
        (once all were stopped) to the first SIGCONT."""
        now = time.monotonic()
        for pid in stopped:
            if pid in self.lead_index:
                self.lead_pauses.setdefault(self.lead_index[pid], []).append((since, now))
        for pid in reversed(stopped):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    # -- faults -----------------------------------------------------------------------------
    def holder(self, youngest: bool = False) -> tuple[int, str, str] | None:
        """(pid, key, owner) of a worker that holds a key now, by the lock table.

        ``youngest``: the most recent acquisition, which has most likely not written yet (a
        pause then turns its write stale); otherwise any holder.
        """
        keys = [f"chaos:{i}" for i in range(self.args.keys)]
        self.rng.shuffle(keys)
        found = []
        try:
            if self.observer is None:
                self.observer = dblock.connect(self.admin_url, table=self.table)
            for key in keys:
                info = self.observer.info(key)
                if info is None:
                    continue
                pid = int(info.owner.rsplit(":", 3)[1])
                proc = self.procs.get(pid)
                if proc is not None and proc.poll() is None and pid not in self.killed:
                    found.append((info.acquired_at, pid, key, info.owner))
        except dblock.BackendError:
            pass
        if not found:
            return None
        _, pid, key, owner = max(found) if youngest else found[0]
        return pid, key, owner

    def sleep_until(self, t: float) -> None:
        while True:
            left = min(t, self.deadline) - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, 0.2))
            self.reap()

    def inject(self, kind: str) -> None:
        record: dict[str, Any] = {"kind": kind, "start": time.monotonic()}
        ttl = self.args.ttl
        if kind in ("kill", "pause") and self.leaders and self.lead_turn[kind]:
            lead = self.leader()
            if lead is not None:
                self.lead_turn[kind] = False
                self.fault_leader(kind, record, *lead)
                return
        if kind in ("kill", "pause"):
            found = None
            for _ in range(20):  # bounded: about 2 s of looking for a holder
                found = self.holder(youngest=kind == "pause")
                if found is not None:
                    break
                time.sleep(0.1)
            if found is None:
                print(f"  {time.monotonic() - self.start:6.1f}s  {kind:<9} skipped: no holder")
                return
            pid, key, owner = found
            record.update(pid=pid, key=key, owner=owner, start=time.monotonic())
            self.lead_turn[kind] = True
            if kind == "kill":
                os.kill(pid, signal.SIGKILL)
                self.killed.add(pid)
                self.deaths[pid] = time.monotonic()
                self.procs[pid].wait(timeout=10)
                self.spawn()
            else:
                os.kill(pid, signal.SIGSTOP)
                self.stopped.add(pid)
                try:
                    self.sleep_until(time.monotonic() + self.rng.uniform(1.5, 3.0) * ttl)
                finally:
                    os.kill(pid, signal.SIGCONT)
                    self.stopped.discard(pid)
        elif kind == "connkill":
            record["detail"] = db.kill_sessions(self.admin_url, self.tag)
        elif kind == "restart":
            assert self.server is not None
            self.server_down = True
            try:
                self.server.stop()
                record["down_at"] = time.monotonic()
                time.sleep(self.rng.uniform(0.5, 2.0))
            finally:
                record["up"] = self.server.start()
                self.server_down = not record["up"]
            if not record["up"]:
                self.crashes.append("the database server did not come back after a restart")
            if self.observer is not None:
                with contextlib.suppress(dblock.DBLockError):
                    self.observer.close()
                self.observer = None
        elif kind == "storekill":
            index = self.rng.randrange(len(self.members))
            member = self.members[index]
            member.stop()
            record["detail"] = f"store {index}"
            time.sleep(self.rng.uniform(0.5, 2.0))
            if not member.start():
                self.crashes.append(f"quorum store {index} did not come back after a kill")
            self.last_storekill = time.monotonic()
        elif kind == "rolling":
            order = list(range(len(self.members)))
            self.rng.shuffle(order)
            *restarted, frozen = order
            # the workers stop meanwhile: the keys go idle, so no grant teaches the restarted
            # stores a fence, and no hold outlives the 3 leases between two restarts
            workers = [p for p, proc in self.procs.items() if proc.poll() is None]
            workers = [p for p in workers if p not in self.killed and p not in self.stopped]
            self.signal_all(workers, signal.SIGSTOP)
            leads = self.stop_leaders(self.live_leads())
            frozen_at = time.monotonic()
            try:
                for n, index in enumerate(restarted):
                    if n:
                        self.sleep_until(time.monotonic() + 3 * ttl)
                    member = self.members[index]
                    member.stop()
                    time.sleep(self.rng.uniform(0.5, 1.0))
                    if not member.start():
                        self.crashes.append(f"quorum store {index} did not come back")
                self.members[frozen].pause()
            finally:
                self.resume_leaders(leads, frozen_at)
                self.signal_all(workers, signal.SIGCONT)
            try:  # the next grants come from stores that all restarted empty
                self.sleep_until(time.monotonic() + self.rng.uniform(1.5, 3.0) * ttl)
            finally:
                self.members[frozen].resume()
            record["detail"] = f"stores {restarted} restarted empty, store {frozen} frozen"
            self.last_storekill = time.monotonic()
        elif kind == "lostreply":
            before = self.proxy.dropped()
            until = time.monotonic() + self.rng.uniform(1.0, 2.0)
            while time.monotonic() < until:
                self.proxy.drop_next_reply()  # the next call opened after the last loss
                time.sleep(0.02)
            (Path(self.dir) / "proxy" / "drop").unlink(missing_ok=True)
            record["lost"] = self.proxy.dropped() - before
            record["detail"] = f"{record['lost']} replies lost"
        elif kind == "filelock":
            conn = sqlite3.connect(
                db.parse_url(self.worker_url).database, timeout=10, isolation_level=None
            )
            self.sqlite_lock = conn
            try:
                conn.execute("BEGIN EXCLUSIVE")
                record["start"] = time.monotonic()
                self.sleep_until(time.monotonic() + self.rng.uniform(1.5, 2.5) * ttl)
                conn.execute("ROLLBACK")
            finally:
                conn.close()
                self.sqlite_lock = None
        self.log_fault(record)

    def fault_leader(self, kind: str, record: dict[str, Any], pid: int, owner: str) -> None:
        """``kill`` or ``pause`` of the ``dblock lead`` that leads (with its CMD)."""
        index = self.lead_index[pid]
        record.update(pid=pid, owner=owner, lead=index, detail=f"leader {index}")
        record["start"] = time.monotonic()
        if kind == "kill":
            os.kill(pid, signal.SIGKILL)  # its CMD gets SIGKILL from the kernel
            self.killed.add(pid)
            self.deaths[pid] = time.monotonic()
            self.leads[pid].wait(timeout=10)
            self.spawn_leader()
        else:
            stopped = self.stop_leaders([pid])
            since = time.monotonic()
            try:
                self.sleep_until(since + self.rng.uniform(1.5, 3.0) * self.args.ttl)
            finally:
                self.resume_leaders(stopped, since)
        self.log_fault(record)

    def log_fault(self, record: dict[str, Any]) -> None:
        record["end"] = time.monotonic()
        self.faults.append(record)
        print(
            f"  {record['start'] - self.start:6.1f}s  {record['kind']:<9} "
            f"{record['end'] - record['start']:5.2f}s  "
            f"{record.get('key') or record.get('detail') or ''}",
            flush=True,
        )

    def signal_all(self, pids: list[int], signum: int) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        if signum == signal.SIGSTOP:
            self.stopped.update(pids)
        else:
            self.stopped.difference_update(pids)

    def reap(self) -> None:
        """Notice workers and leaders that ended on their own before the deadline; start new
        ones."""
        for pid, proc in list(self.procs.items()):
            code = proc.poll()
            if code is None or pid in self.killed or pid in self.deaths:
                continue
            self.deaths[pid] = time.monotonic()
            if time.monotonic() < self.deadline - 1:
                self.crashes.append(f"worker {pid} exited early with status {code}")
                self.spawn()
        for pid, proc in list(self.leads.items()):
            code = proc.poll()
            if code is None or pid in self.killed or pid in self.deaths:
                continue
            self.deaths[pid] = time.monotonic()
            if time.monotonic() >= self.deadline:
                continue
            if code == UNAVAILABLE:  # the store was unreachable: again, as systemd's Restart=
                self.lead_exits += 1
            else:
                self.crashes.append(f"dblock lead {pid} exited early with status {code}")
            self.spawn_leader()

    def first_hold(self) -> bool:
        """Has a worker logged a hold yet?"""
        for name in os.listdir(self.dir):
            if name.startswith("w") and name.endswith(".jsonl"):
                with open(os.path.join(self.dir, name), encoding="utf-8") as fh:
                    if '"ev": "hold"' in fh.read():
                        return True
        return False

    def inject_loop(self) -> None:
        lo, hi = self.args.interval
        count = 0
        # the faults begin once a worker holds a key: on a loaded machine the workers may take
        # seconds to start, and a restart then (a JVM's can take 30 s there) leaves a soak
        # with no hold at all, which tests nothing
        while not self.first_hold() and time.monotonic() < self.deadline - 1:
            self.sleep_until(time.monotonic() + 0.2)
        while time.monotonic() < self.deadline - 1 and count < 100_000:
            count += 1
            self.sleep_until(time.monotonic() + self.rng.uniform(lo, hi))
            if time.monotonic() >= self.deadline - 1 or not self.kinds:
                continue
            kinds = self.kinds
            if time.monotonic() - self.last_restart < self.args.restart_gap:
                kinds = [k for k in kinds if k != "restart"] or kinds
            if time.monotonic() - self.last_storekill < 3 * self.args.ttl:
                kinds = [k for k in kinds if k not in ("storekill", "rolling")] or kinds
            # every kind once before any repeats: a short run still sees each of them
            done = {f["kind"] for f in self.faults}
            kind = self.rng.choice([k for k in kinds if k not in done] or kinds)
            if (
                kind in ("storekill", "rolling")
                and time.monotonic() - self.last_storekill < 3 * self.args.ttl
            ):
                continue
            if kind == "restart":
                if time.monotonic() - self.last_restart < self.args.restart_gap:
                    continue
                self.last_restart = time.monotonic()
            try:
                self.inject(kind)
            except (OSError, subprocess.SubprocessError, dblock.DBLockError) as exc:
                print(f"  fault failed: {type(exc).__name__}: {exc}", flush=True)
            except Exception as exc:  # driver errors of the admin connection
                print(f"  fault failed: {type(exc).__name__}: {exc}", flush=True)

    # -- the end ----------------------------------------------------------------------------
    def wait_workers(self) -> list[int]:
        """End the leaders (SIGTERM), wait for them and the workers until deadline + grace;
        return the pids that had not ended (then kill them)."""
        self.reap()
        for pid in self.live_leads():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        limit = self.deadline + self.args.grace
        hung = []
        for pid, proc in [*self.procs.items(), *self.leads.items()]:
            if pid in self.killed:
                continue
            try:
                proc.wait(timeout=max(0.1, limit - time.monotonic()))
            except subprocess.TimeoutExpired:
                hung.append(pid)
                what = f"dblock lead {self.lead_index[pid]}" if pid in self.leads else "worker"
                print(f"chaos: {what} (pid {pid}) had not ended", flush=True)
                self.dump_stack(pid)
            self.deaths.setdefault(pid, time.monotonic())
        self.late = max(
            (
                self.deaths[p] - self.deadline
                for p in [*self.procs, *self.leads]
                if p not in self.killed
            ),
            default=0.0,
        )
        return hung

    def dump_stack(self, pid: int) -> None:
        """Best effort: py-spy (the dev extra has it) shows where a hung process is. Printed
        too: the run's directory goes at its end, and a hang seen once may not come back."""
        spy = shutil.which("py-spy") or shutil.which("py-spy", path=Path(sys.executable).parent)
        if not spy:
            print("chaos: py-spy is not installed: no stack of it", flush=True)
            return
        out = subprocess.run(
            [spy, "dump", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        stack = out.stdout + out.stderr
        with open(os.path.join(self.dir, f"hung-{pid}.txt"), "w", encoding="utf-8") as fh:
            fh.write(stack)
        print(f"chaos: where {pid} is (py-spy dump):\n{stack[-3000:]}", flush=True)

    def cleanup(self) -> None:
        for pid, proc in [*self.procs.items(), *self.leads.items()]:
            if proc.poll() is None:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGCONT)
                    os.kill(pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
        if self.sqlite_lock is not None:
            with contextlib.suppress(sqlite3.Error):
                self.sqlite_lock.close()
        restarted = any(f["kind"] == "restart" for f in self.faults)
        if self.server is not None and (self.server_down or (restarted and not self.server.up())):
            print("chaos: starting the database server again", flush=True)
            self.server.start(wait=120)
        if self.observer is not None:
            with contextlib.suppress(dblock.DBLockError):
                self.observer.close()
        try:
            db.drop_tables(self.admin_url, [self.table])
            if self.resource_url == self.admin_url:
                db.drop_tables(self.admin_url, [self.resource, self.audit])
            if self.guarded:
                db.drop_tables(self.admin_url, [self.counter, self.glog])
            if self.dialect == "mysql":
                db.mysql_drop_user(self.admin_url, self.tag)
        except Exception as exc:
            print(f"chaos: cleanup of tables failed: {exc}", flush=True)
        if self.server is not None:
            self.server.close()
        if self.proxy is not None:
            self.proxy.close()
        for member in self.members:
            member.close()
        if self.args.keep:
            print(f"chaos: logs kept in {self.dir}", flush=True)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)

    def referee(self, hung: list[int]) -> dict[str, Any]:
        events = referee.load_logs(self.dir)
        audit, final = db.read_audit(self.resource_url, self.audit, self.resource)
        guarded = db.read_guarded(self.admin_url, self.counter, self.glog) if self.guarded else None
        summary = referee.judge(
            events=events,
            faults=self.faults,
            deaths=self.deaths,
            hung=hung,
            audit=audit,
            final=final,
            run_end=max(self.deaths.values(), default=self.deadline),
            ttl=self.args.ttl,
            guarded=guarded,
            file_lock=self.dialect == "sqlite",
        )
        summary["guard"] = not self.args.unguarded
        summary["leaders"] = self.leaders
        if self.leaders:
            lead = referee.judge_leaders(
                referee.load_lead_logs(self.dir), self.lead_pauses, slack=self.args.ttl
            )
            summary["lead_failover"] = referee.lead_failovers(lead.pop("lead_starts"), self.faults)
            summary["violations"] += lead.pop("lead_violations")
            summary.update(lead)
            leader_faults = [f for f in self.faults if f.get("lead") is not None]
            summary["lead_kills"] = sum(f["kind"] == "kill" for f in leader_faults)
            summary["lead_pauses"] = sum(f["kind"] == "pause" for f in leader_faults)
            summary["lead_exits"] = self.lead_exits
        summary["violations"] += [f"crash: {c}" for c in self.crashes]
        if self.password:
            blob = "\n".join(
                Path(p).read_text(encoding="utf-8", errors="replace")
                for p in Path(self.dir).glob("*")
                if p.name not in ("config.json", "server.log")
            )
            for secret in (self.password, quote(self.password, safe="")):
                if secret in blob:
                    summary["violations"].append("leak: the password appears in a log")
        summary["exit_lag_max"] = self.late
        summary["dialect"] = self.dialect
        summary["duration"] = self.args.duration
        summary["workers"] = self.args.workers
        summary["keys"] = self.args.keys
        summary["ttl"] = self.args.ttl
        summary["workers_started"] = self.next_index
        return summary


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    db.check_loopback(args.url)
    try:
        dialect = db.dialect_of(args.url)
    except dblock.ConfigurationError as exc:
        print(f"chaos: {exc}", file=sys.stderr)
        return 2
    if dialect != "sqlite" and args.restart_server:
        port = db.parse_url(args.url).port or servers.SERVICE_PORTS[dialect]
        if port != servers.SERVICE_PORTS[dialect]:
            print(
                f"chaos: --restart-server restarts this host's service on port "
                f"{servers.SERVICE_PORTS[dialect]}, not the server at port {port}: "
                "use --server-cmd",
                file=sys.stderr,
            )
            return 2
        if not servers.HostService(dialect).up():
            print("chaos: the server is not up; not starting a soak with restarts", file=sys.stderr)
            return 3

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    soak = Soak(args)
    try:
        try:
            soak.setup()
        except Exception as exc:  # the driver's errors too: unreachable, no privileges
            print(f"chaos: cannot set up on {db.safe(args.url)}: {exc}", file=sys.stderr)
            return 3
        print(
            f"chaos: {dialect}, {args.workers} workers, {soak.leaders} leaders, {args.keys} keys, "
            f"ttl {args.ttl:g} s, {args.duration:g} s, faults: {', '.join(soak.kinds) or 'none'}",
            flush=True,
        )
        soak.inject_loop()
        soak.sleep_until(soak.deadline)
        hung = soak.wait_workers()
        summary = soak.referee(hung)
    except KeyboardInterrupt:
        print("chaos: interrupted; cleaning up", file=sys.stderr)
        return 130
    finally:
        soak.cleanup()
    header = (
        f"dblock chaos soak: {dialect}, {args.duration:g} s, {args.workers} workers, "
        f"{args.keys} keys, ttl {args.ttl:g} s"
    )
    print(referee.render(summary, header))
    print(f"{'slowest exit after the deadline':<50}{summary['exit_lag_max']:.2f} s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(summary, fh, indent=2, default=str)
    bad = bool(summary["violations"]) or summary["hung"] > 0
    print("RESULT: " + ("FAIL" if bad else "PASS"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
