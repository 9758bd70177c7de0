"""The smoke test scripts/check-wheel runs in a clean virtual environment with the wheel.

``python smoke_wheel.py EXTRA``: ``import dblock`` loads no driver and no CLI toolkit, a lock
on a fresh SQLite file works (with fencing tokens that increase), and the extra's own modules
import and do their first job. Prints one line; exit status 1 with the reason otherwise.
"""

from __future__ import annotations

import asyncio
import importlib
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, NoReturn


def stores() -> list[Any]:
    """The registry's entries (dblock.stores._registry): every store, its extra, its drivers."""
    from dblock.stores._registry import BUILT_IN

    return list(BUILT_IN)


#: what ``import dblock`` must not load: the CLI toolkit, greenlet, every store's driver
HEAVY = {"click", "rich", "greenlet"}
#: extra -> modules it must make importable: each store's extra its drivers, and the others
MODULES: dict[str, list[str]] = {
    "": [],
    "async": ["greenlet"],
    "asyncio": ["greenlet"],  # the async extra's earlier name, kept as an alias
    "mysql-async": ["pymysql", "aiomysql", "greenlet"],
    "prometheus": ["prometheus_client"],
    "otel": ["opentelemetry.trace"],
    "dashboard": ["prometheus_client", "starlette", "uvicorn"],
    "all": ["greenlet"],
}


def registered() -> None:
    """HEAVY and MODULES from the registry (read after ``import dblock`` was checked)."""
    for entry in stores():
        drivers = [d for d in entry.drivers if d != "sqlite3"]  # the standard library's
        HEAVY.update(d for d in (*drivers, *entry.async_drivers) if "." not in d)
        if entry.extra:
            MODULES[entry.extra] = drivers
            MODULES["all"] += drivers + list(entry.async_drivers)


def fail(why: str) -> NoReturn:
    print(f"smoke FAILED: {why}")
    sys.exit(1)


def sqlite_lock(url: str) -> list[int]:
    """Two holds of one key on a fresh file: their fencing tokens, which must increase."""
    import dblock

    tokens: list[int] = []
    with dblock.connect(url) as client:
        for _ in range(2):
            with client.lock("smoke", ttl=10, timeout=5) as lock:
                if lock.token is None or [i.key for i in client.list()] != ["smoke"]:
                    fail("a held lock has no token, or list() does not show it")
                tokens.append(lock.token)
    if tokens[1] <= tokens[0]:
        fail(f"fencing tokens did not increase: {tokens}")
    return tokens


def the_extra(extra: str) -> None:
    """The extra's modules import and do their first job."""
    for name in MODULES[extra]:
        importlib.import_module(name)
    if extra in ("prometheus", "dashboard"):
        from dblock.observability import enable_metrics

        enable_metrics()
    if extra == "otel":
        from dblock.observability import enable_tracing

        enable_tracing()


def the_command(extra: str, version: str) -> None:
    """The installed ``dblock`` command answers."""
    command = str(Path(sys.executable).parent / "dblock")
    argvs = [["--help"], ["--version"], ["schema", "--dialect", "sqlite"]]
    if extra == "dashboard":
        argvs.append(["dashboard", "--help"])
    for argv in argvs:
        out = subprocess.run(  # noqa: S603 - the installed command, fixed arguments
            [command, *argv], capture_output=True, text=True, check=False
        )
        if out.returncode != 0:
            fail(f"dblock {' '.join(argv)} exited {out.returncode}: {out.stderr.strip()}")
        if argv == ["--version"] and version not in out.stdout:
            fail(f"dblock --version printed {out.stdout.strip()!r}")


def main(extra: str) -> None:
    import dblock

    before = set(sys.modules)
    registered()
    loaded = HEAVY & before
    if loaded:
        fail(f"import dblock loaded {sorted(loaded)}")
    if dblock.__file__ is None or "site-packages" not in dblock.__file__:
        fail(f"dblock imported from {dblock.__file__}, not the installed wheel")
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'locks.db'}"
        tokens = sqlite_lock(url)
        if extra in ("async", "asyncio", "mysql-async", "all"):
            asyncio.run(async_lock(url))
    the_extra(extra)
    the_command(extra, dblock.__version__)
    print(
        f"smoke ok: dblock {dblock.__version__} [{extra or 'no extra'}] on Python "
        f"{sys.version.split()[0]}: tokens {tokens}"
    )


async def async_lock(url: str) -> None:
    import dblock

    client = await dblock.connect_async(url)
    async with client, client.lock("smoke-async", ttl=10, timeout=5) as lock:
        if lock.token is None:
            fail("the async lock has no token")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
