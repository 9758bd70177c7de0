"""Fixtures shared by every suite: one backend parameter, real servers only.

``db_url`` runs a test once per backend (sqlite, postgresql, mysql). PostgreSQL and MySQL are
found through DBLOCK_TEST_POSTGRESQL_URL / DBLOCK_TEST_MYSQL_URL (defaults: the local
services); when one is unreachable its tests skip, or fail under DBLOCK_REQUIRE_SERVERS=1.
"""

from __future__ import annotations

import os
import traceback
import uuid
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

import dblock
from tests import _pg_crowd, _zk_secure
from tests._servers import BACKENDS, POSTGRESQL_URL, drop_tables, require_server, server_url

os.environ.setdefault("DBLOCK_TEST_PG_CROWD", "0")  # the workers' too: see tests/_pg_crowd.py
_pg_crowd.apply()


@pytest.fixture(scope="session", autouse=True)
def _children_without_the_otel_sdk() -> None:
    """The child processes of the test process run as on a host without the OpenTelemetry
    SDK (tests/_children/sitecustomize.py). A session fixture, not an import-time setting: it
    runs in the processes that run tests, never in xdist's controller, whose workers record
    spans with the SDK."""
    children = str(Path(__file__).parent / "_children")
    path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (children, path) if p)
    os.environ["DBLOCK_TEST_CHILD_NO_OTEL_SDK"] = "1"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "needs(*capabilities): the test runs only on providers with these capabilities "
        "(tests/providers.py); elsewhere it is skipped by capability",
    )


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failure whose traceback pytest cannot render is still reported as that failure.

    Python 3.11 gives some frames no line number (``tb_lineno`` None), and pytest's rendering
    then raises TypeError inside the hook: under xdist that ends the whole run (the worker's
    internal error), so one failing test would hide the results of thousands."""
    try:
        return (yield)
    except Exception as exc:
        if call.excinfo is None:
            raise
        try:
            text = "".join(traceback.format_exception(call.excinfo.value))
        except Exception:  # the rendering itself is what failed
            text = f"{call.excinfo.typename}: {call.excinfo.value}"
        text += f"\n(pytest could not render this failure: {type(exc).__name__}: {exc})"
        return pytest.TestReport(
            item.nodeid,
            item.location,
            dict.fromkeys(item.keywords, 1),
            "failed",
            text,
            call.when,
            duration=call.duration,
            start=call.start,
            stop=call.stop,
        )


def _run_temp(factory: pytest.TempPathFactory) -> Path:
    """The temporary directory the whole run shares (pytest-xdist's workers make theirs in it)."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # the run's last step: its shared servers go
        factory = getattr(session.config, "_tmp_path_factory", None)
        if factory is not None:
            _zk_secure.stop_shared(_run_temp(factory))


@pytest.fixture(scope="session")
def secure_zk(tmp_path_factory: pytest.TempPathFactory) -> _zk_secure.SecureZk:
    """The run's private ZooKeeper with digest authentication and a TLS port (one JVM for
    every test process of the run; see tests/_zk_secure.py)."""
    return _zk_secure.shared(_run_temp(tmp_path_factory))


@pytest.fixture(params=BACKENDS)
def dialect(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def db_url(dialect: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    url = server_url(dialect, str(tmp_path_factory.mktemp("db")))
    if dialect != "sqlite":
        require_server(dialect, url)
    return url


@pytest.fixture
def table(db_url: str) -> Iterator[str]:
    """A fresh lock table name for this test, dropped afterwards."""
    name = "t_" + uuid.uuid4().hex[:16]
    yield name
    drop_tables(db_url, name)


@pytest.fixture
def client(db_url: str, table: str) -> Iterator[dblock.Client]:
    with dblock.connect(db_url, table=table) as c:
        yield c


@pytest.fixture
def key() -> str:
    return "k-" + uuid.uuid4().hex


@pytest.fixture(params=[d for d in BACKENDS if d != "sqlite"])
def server_db_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Like db_url, for the client-server backends only (server-side faults)."""
    url = server_url(str(request.param), str(tmp_path_factory.mktemp("db")))
    require_server(str(request.param), url)
    return url


@pytest.fixture
def pg_table() -> Iterator[str]:
    """A fresh lock table name on the PostgreSQL server, dropped afterwards."""
    require_server("postgresql", POSTGRESQL_URL)
    name = "t_" + uuid.uuid4().hex[:16]
    yield name
    drop_tables(POSTGRESQL_URL, name)
