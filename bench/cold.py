"""Scenario ``cold``: a cold start of ``dblock run --no-wait KEY -- CMD`` from a fresh process,
as cron runs it (issue 52, point 3).

Each sample is one process started from the bench: t0 = ``time.time_ns()`` just before the
exec, t1 = CMD's start (CMD is ``date +%s%N``: the nanoseconds it prints, one exec after
dblock's fork), t2 = the process's exit as the bench's wait sees it. Per store (the live ones
of SQLite, PostgreSQL, MariaDB/MySQL, Redis, etcd, ZooKeeper): median and p90 of t1 - t0 and
of t2 - t0 over the rounds, beside, in the same rounds:

- ``flock(1)``: ``flock -n FILE date +%s%N`` on a local file (util-linux);
- ``python -c pass``: the interpreter alone, exec to exit;
- the store's floor: ``python -c`` importing the store's driver, connecting, running one
  statement (``SELECT 1``; Redis ``PING``), then printing ``time.time_ns()``: what any Python
  program that touches the store pays before its first useful step (t1), and its exit (t2,
  by ``os._exit`` after closing, as ``dblock`` ends);
- where the store's driver imports the OpenTelemetry SDK whenever it is installed (redis-py
  8; dblock[dev] installs the SDK), its dblock and floor rows again as on a host without the
  SDK (``NO_SDK``): a meta path finder run first makes its import fail as it fails there.

The contenders alternate within every round (the order rotated each round); two rounds of
warm-up come first, uncounted. dblock runs as ``python -m dblock`` on the bench's own
interpreter and ``PYTHONPATH``; the children's bytecode is cached (``PYTHONPYCACHEPREFIX`` in
the run's temporary directory, ``PYTHONDONTWRITEBYTECODE`` dropped) as in an installed wheel,
whose modules pip compiles.

Target (issue 52): t1 - t0 median ≤ 150 ms on PostgreSQL, MariaDB/MySQL and Redis.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench import servers
from bench.contenders import Targets
from dblock.bench import median, percentile

#: the stores measured, in the order shown, when live
STORES = ("sqlite", "postgresql", "mysql", "redis", "etcd", "zookeeper")
#: the stores the target is set for, and the target (ms, exec to CMD's start)
TARGET_STORES = ("postgresql", "mysql", "redis")
TARGET_MS = 150.0
WARMUP = 2
#: seconds a sample may take before it is killed and the contender reported failing
BOUND = 20.0
CMD = ("date", "+%s%N")

#: each floor's driver module
_DRIVERS = {"sqlite": "sqlite3", "postgresql": "psycopg", "mysql": "pymysql", "redis": "redis"}
#: the floors, after the driver's import: connect, one statement; argv[1] is the URL
_FLOORS = {
    "sqlite": (
        "c = sqlite3.connect(sys.argv[1].removeprefix('sqlite:///'))\n"
        "c.execute('SELECT 1').fetchone()\n"
    ),
    "postgresql": (
        "c = psycopg.connect(sys.argv[1], autocommit=True)\nc.execute('SELECT 1').fetchone()\n"
    ),
    "mysql": (
        "from urllib.parse import urlsplit, unquote\n"
        "u = urlsplit(sys.argv[1])\n"
        "c = pymysql.connect(host=u.hostname, port=u.port or 3306, user=unquote(u.username or ''),"
        " password=unquote(u.password or ''), database=u.path.lstrip('/') or None)\n"
        "k = c.cursor(); k.execute('SELECT 1'); k.fetchone()\n"
    ),
    "redis": "c = redis.Redis.from_url(sys.argv[1])\nc.ping()\n",
}
_FLOOR_END = "print(time.time_ns(), flush=True)\nc.close()\nos._exit(0)\n"


def _floor(store: str) -> str:
    """The floor's program: import the driver, connect, one statement, print the time."""
    return f"import {_DRIVERS[store]}, sys, time, os\n" + _FLOORS[store] + _FLOOR_END


#: the name's end of the rows run as on a host without the OpenTelemetry SDK
NO_SDK = ", no OTel SDK"
#: run first in those rows: the SDK cannot be imported (a driver that tries gets the
#: ImportError it gets where the SDK is not installed)
_HIDE_SDK = (
    "import sys\n"
    "class _NoSdk:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name == 'opentelemetry.sdk' or name.startswith('opentelemetry.sdk.'):\n"
    "            raise ModuleNotFoundError(name)\n"
    "sys.meta_path.insert(0, _NoSdk())\n"
)
_DBLOCK_MAIN = "import runpy\nrunpy.run_module('dblock', run_name='__main__', alter_sys=True)\n"


def loads_sdk(store: str, env: dict[str, str]) -> bool:
    """Importing ``store``'s driver imports the OpenTelemetry SDK (redis-py 8 does, at import,
    wherever the SDK is installed: dblock[dev] installs it)."""
    code = (
        f"import sys, {_DRIVERS[store]}\n"
        "print(any(m.startswith('opentelemetry.sdk') for m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    return done.stdout.strip() == "True"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def child_env(tmp: str) -> dict[str, str]:
    """The children's environment: bytecode cached under ``tmp`` (see the module)."""
    dropped = ("PYTHONDONTWRITEBYTECODE", "DBLOCK_URL")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
    return env


def sides(live: list[str], t: Targets, table: str, tmp: str) -> dict[str, list[str]]:
    """Every contender's argv, by its row name. Where the store's driver imports the
    OpenTelemetry SDK, its dblock and floor rows are also run without it (``NO_SDK``)."""
    key = f"bench-cold-{uuid.uuid4().hex[:8]}"
    out: dict[str, list[str]] = {}
    flock = shutil.which("flock")
    if flock:
        out["flock(1)"] = [flock, "-n", str(Path(tmp) / "cold.flock"), *CMD]
    out["python -c pass"] = [sys.executable, "-c", "pass"]
    env = child_env(tmp)
    for store in STORES:
        if store not in live:
            continue
        url = t.url(store)
        args = ["--url", url, "--table", table, "run", "--no-wait", key, "--", *CMD]
        out[f"{store}/dblock"] = [sys.executable, "-m", "dblock", *args]
        if store in _FLOORS:
            code = _floor(store)
            out[f"{store}/floor"] = [sys.executable, "-c", code, url]
            if loads_sdk(store, env):
                out[f"{store}/dblock{NO_SDK}"] = [
                    sys.executable,
                    "-c",
                    _HIDE_SDK + _DBLOCK_MAIN,
                    *args,
                ]
                out[f"{store}/floor{NO_SDK}"] = [sys.executable, "-c", _HIDE_SDK + code, url]
    return out


def sample(argv: list[str], env: dict[str, str]) -> tuple[float | None, float]:
    """One run: (ms to CMD's start or None if it printed no time, ms to exit)."""
    t0 = time.time_ns()
    done = subprocess.run(
        argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=BOUND, check=False
    )
    t2 = time.time_ns()
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip().splitlines()
        raise RuntimeError(f"exit {done.returncode}: {why[-1] if why else ''}")
    words = done.stdout.split()
    t1 = (int(words[0]) - t0) / 1e6 if words and words[0].isdigit() else None
    return t1, (t2 - t0) / 1e6


def rounds_of(b: Any) -> int:
    """Counted rounds: 11 at the default budget (5 repeats), at least 3."""
    return max(3, 2 * int(b.repeats) + 1)


def scenario_cold(live: list[str], t: Targets, b: Any, tmp: str) -> dict[str, Any]:
    table = f"{t.table}_cold"
    try:
        return _measure(live, t, b, tmp, table)
    finally:
        for store in live:
            servers.drop_dblock_tables(t, store, table)


def _measure(live: list[str], t: Targets, b: Any, tmp: str, table: str) -> dict[str, Any]:
    env = child_env(tmp)
    argvs = sides(live, t, table, tmp)
    names = list(argvs)
    samples: dict[str, dict[str, list[float]]] = {n: {"start": [], "exit": []} for n in names}
    errors: dict[str, str] = {}
    rounds = rounds_of(b)
    for r in range(WARMUP + rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            if name in errors:
                continue
            try:
                start, end = sample(argvs[name], env)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                errors[name] = f"{type(exc).__name__}: {exc}".splitlines()[0]
                log(f"[cold] {name}: {errors[name]}")
                continue
            if r >= WARMUP:
                if start is not None:
                    samples[name]["start"].append(start)
                samples[name]["exit"].append(end)
        if r >= WARMUP:
            log(f"[cold] round {r - WARMUP + 1}/{rounds} done")
    out: dict[str, Any] = {"rounds": rounds, "rows": {}}
    for name in names:
        row: dict[str, Any] = {}
        if name in errors:
            row["error"] = errors[name]
        for what in ("start", "exit"):
            got = samples[name][what]
            if got:
                row[what] = {
                    "median_ms": median(got),
                    "p90_ms": percentile(got, 90),
                    "samples_ms": got,
                }
        out["rows"][name] = row
    return out


def _cell(row: dict[str, Any], what: str) -> str:
    v = row.get(what)
    return "—" if v is None else f"{v['median_ms']:.0f} / {v['p90_ms']:.0f}"


def gap(res: dict[str, Any], store: str, variant: str = "") -> float | None:
    """dblock's median to CMD's start less the store's floor's, ms (of the rows whose names
    end in ``variant``)."""
    rows = res.get("rows", {})
    mine = rows.get(f"{store}/dblock{variant}", {})
    floor = rows.get(f"{store}/floor{variant}", {})
    if "start" not in mine or "start" not in floor:
        return None
    return float(mine["start"]["median_ms"] - floor["start"]["median_ms"])


def markdown(res: dict[str, Any]) -> list[str]:
    lines = [
        "### (cold) `dblock run --no-wait KEY -- CMD` from a fresh process",
        "",
        "Wall time from the exec (t0) to CMD's start (its `date +%s%N`) and to the process's "
        f"exit, ms, median / p90 of {res.get('rounds', 0)} rounds after {WARMUP} of warm-up, "
        "the rows alternating within each round. Floor: `python -c` importing the store's "
        "driver, connecting and running one statement (to its end, then to the exit). "
        f"Target (issue 52): to CMD's start, median ≤ {TARGET_MS:g} ms on PostgreSQL, "
        f"MariaDB/MySQL and Redis. Rows ending `{NO_SDK}` run as on a host without the "
        "OpenTelemetry SDK, which they cannot import: shown for a driver that imports it "
        "wherever it is installed (redis-py 8; dblock[dev] installs it).",
        "",
        "| row | to CMD's start ms | to exit ms | target | dblock − floor ms |",
        "|---|---:|---:|---|---:|",
    ]
    for name, row in res.get("rows", {}).items():
        store, _, side = name.partition("/")
        target = ""
        gap_ms = ""
        if side in ("dblock", f"dblock{NO_SDK}"):
            if store in TARGET_STORES and "start" in row:
                met = row["start"]["median_ms"] <= TARGET_MS
                target = f"≤ {TARGET_MS:g}: {'met' if met else 'not met'}"
            g = gap(res, store, side.removeprefix("dblock"))
            gap_ms = "" if g is None else f"{g:+.0f}"
        if "error" in row:
            target = f"error: {row['error']}"
        lines.append(
            f"| {name} | {_cell(row, 'start')} | {_cell(row, 'exit')} | {target} | {gap_ms} |"
        )
    lines.append("")
    return lines


def targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for store in TARGET_STORES:
        row = res.get("rows", {}).get(f"{store}/dblock")
        if not row or "start" not in row:
            continue
        med = row["start"]["median_ms"]
        floor = res["rows"].get(f"{store}/floor", {}).get("start")
        beside = f"; floor {floor['median_ms']:.0f} ms" if floor else ""
        bare = res["rows"].get(f"{store}/dblock{NO_SDK}", {}).get("start")
        bare_floor = res["rows"].get(f"{store}/floor{NO_SDK}", {}).get("start")
        if bare and bare_floor:
            beside += (
                f"; without the OTel SDK {bare['median_ms']:.0f} ms, "
                f"floor {bare_floor['median_ms']:.0f} ms"
            )
        out.append(
            {
                "target": f"(cold) {store}: exec to CMD's start median ≤ {TARGET_MS:g} ms",
                "measured": f"{med:.0f} ms (p90 {row['start']['p90_ms']:.0f} ms{beside})",
                "met": med <= TARGET_MS,
            }
        )
    return out
