from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ._project import Site, postgres_database, sqlite_site


@pytest.fixture(autouse=True)
def _started_processes_end(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "site" in request.fixturenames:
        request.getfixturevalue("site").end_started()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def site(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Site]:
    """The test project on a database of its own, migrated (``manage.py migrate``)."""
    tmp: Path = tmp_path_factory.mktemp(f"django-{request.param}")
    if request.param == "sqlite":
        made = sqlite_site(tmp)
        made.run("migrate", "--no-input")
        yield made
        return
    for db in postgres_database():
        made = Site({"default": db.settings}, db.url, tmp)
        made.run("migrate", "--no-input")
        yield made
