"""The postgresql lock table of an earlier dblock version is upgraded in place."""

from __future__ import annotations

import pytest

from tests._servers import POSTGRESQL_URL, require_server
from tests.backends._schema_upgrade import check_read_only_commands_never_upgrade, check_upgrade


def test_create_schema_upgrades_a_table_of_an_earlier_version(key: str) -> None:
    require_server("postgresql", POSTGRESQL_URL)
    check_upgrade("postgresql", POSTGRESQL_URL, key)


def test_read_only_commands_never_upgrade_an_earlier_table(
    capsys: pytest.CaptureFixture[str],
) -> None:
    require_server("postgresql", POSTGRESQL_URL)
    check_read_only_commands_never_upgrade("postgresql", POSTGRESQL_URL, capsys)
