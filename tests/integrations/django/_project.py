"""The test project (``project/``) on a database of its own, driven through ``manage.py``."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests._servers import POSTGRESQL_URL, REQUIRE_SERVERS, raw_connect

PROJECT = Path(__file__).resolve().parent / "project"


@dataclass
class Site:
    """One database with the project migrated on it."""

    databases: dict[str, Any]
    url: str  # the dblock URL of the default database
    tmp: Path
    dblock: dict[str, Any] | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    #: what :meth:`popen` started, until :meth:`end_started`
    started: list[subprocess.Popen[str]] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        env = {**os.environ, "SHOP_DATABASES": json.dumps(self.databases), **self.extra_env}
        env.pop("DJANGO_SETTINGS_MODULE", None)
        if self.dblock is not None:
            env["SHOP_DBLOCK"] = json.dumps(self.dblock)
        return env

    def popen(self, *args: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", *args],
            cwd=PROJECT,
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.started.append(proc)
        return proc

    def end_started(self) -> None:
        """End what a test started and left running (a failed test does not wait for it),
        and close its pipes: not left for the site's next test to find."""
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(ValueError, OSError):  # already communicated
                proc.communicate(timeout=30)
        self.started.clear()

    def run(self, *args: str, status: int | None = 0) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=PROJECT,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
        if status is not None:
            assert done.returncode == status, (done.returncode, done.stdout, done.stderr)
        return done

    def get(self, *paths: str) -> list[tuple[int, Any]]:
        """GET each path through Django (the project's ``get`` command, one process for all):
        its status and JSON body (the text of any other answer)."""
        answers = []
        for line in self.run("get", *paths).stdout.strip().split("\n"):
            status, _, body = line.partition(" ")
            answers.append((int(status), json.loads(body) if status == "200" else body))
        return answers

    def gate(self) -> str:
        return str(self.tmp / f"gate-{uuid.uuid4().hex[:8]}")


def wait_for(path: str, proc: subprocess.Popen[str] | None = None) -> None:
    """Until ``path`` exists (a process reached its gate); fail if ``proc`` exits first."""
    deadline = time.monotonic() + 60
    while not Path(path).exists():
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"exited {proc.returncode} before its gate: {out} {err}")
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def open_gate(gate: str) -> None:
    Path(f"{gate}.go").touch()


def sqlite_site(tmp: Path) -> Site:
    name = str(tmp / "shop.sqlite3")
    return Site(
        {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": name}},
        f"sqlite:///{name}",
        tmp,
    )


@dataclass
class PostgresDatabase:
    name: str
    settings: dict[str, Any]
    url: str


def postgres_database() -> Iterator[PostgresDatabase]:
    """A database of its own on the shared server, dropped afterwards."""
    import psycopg

    try:
        admin = raw_connect(POSTGRESQL_URL)
    except psycopg.OperationalError as exc:
        if REQUIRE_SERVERS:
            raise
        pytest.skip(f"PostgreSQL not reachable: {exc}")
    name = f"q1_django_{uuid.uuid4().hex[:10]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    parts = urlsplit(POSTGRESQL_URL)
    settings = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": parts.username or "",
        "PASSWORD": parts.password or "",
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
    }
    try:
        yield PostgresDatabase(name, settings, parts._replace(path=f"/{name}").geturl())
    finally:
        for made in (name, f"test_{name}"):  # and Django's test database, if a run left it
            admin.execute(f'DROP DATABASE IF EXISTS "{made}" WITH (FORCE)')
        admin.close()
