"""The migration operation that creates dblock's tables: ``dblock schema``'s DDL for the
database being migrated, so ``sqlmigrate dblock 0001`` shows exactly what a DBA would apply."""

from __future__ import annotations

from typing import Any

from django.db.migrations.operations.base import Operation

from dblock.tools import ddl_for

from .config import dblock_settings, target

#: Django vendor -> dblock dialect
DIALECTS = {"sqlite": "sqlite", "postgresql": "postgresql", "mysql": "mysql"}


class CreateLockTables(Operation):
    """Create the lock table named by ``settings.DBLOCK["TABLE"]`` (and its companions) on the
    database ``settings.DBLOCK["DATABASE"]``; other databases are left alone. Idempotent
    (``CREATE ... IF NOT EXISTS``), so tables a client already made are kept as they are.

    Unapplying it keeps the tables: dropping them would forget ``once`` records, and a payout
    recorded as done could run again."""

    reduces_to_sql = True
    reversible = True

    def state_forwards(self, app_label: str, state: Any) -> None:
        pass  # no model: the tables are dblock's, not the ORM's

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if schema_editor.connection.alias != dblock_settings()["DATABASE"]:
            return
        where = target()  # ImproperlyConfigured for an engine dblock cannot use
        dialect = DIALECTS[schema_editor.connection.vendor]
        for statement in ddl_for(dialect, where.table):
            schema_editor.execute(statement, params=None)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        pass  # see the class docstring: the tables stay

    def describe(self) -> str:
        return "Create dblock's lock tables"


__all__ = ["CreateLockTables"]
