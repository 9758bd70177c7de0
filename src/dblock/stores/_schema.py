"""Recognising dblock's own tables before anything is created or used.

A table name is the user's to give, and it may name a table of the application. dblock
recognises its own by their columns: it creates the lock table, its ``_holders`` table and its
``_meta`` table (SQLite, MySQL) or ``_token_seq`` sequence (PostgreSQL) with at least the
columns below. An object of one of those names that lacks them is someone else's: dblock
refuses it (ConfigurationError) whatever ``create_schema`` says, and never creates, alters or
writes anything beside it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Final

from .._errors import ConfigurationError

#: columns the lock table has
MAIN: Final = frozenset(
    {"lock_key", "kind", "owner", "token", "acquired_at", "expires_at", "state", "note"}
)
#: ... its holders table
HOLDERS: Final = frozenset(
    {"lock_key", "holder", "kind", "waiting", "token", "acquired_at", "expires_at"}
)
#: ... its meta table (SQLite, MySQL)
META: Final = frozenset({"id", "hwm"})


def refuse_foreign(
    table: str,
    safe_url: str,
    found: Mapping[str, Collection[str]],
    required: Mapping[str, frozenset[str]],
) -> None:
    """Raise ConfigurationError if an object that exists lacks columns dblock's always has.

    ``found`` maps the name of each object that exists to its columns; ``required`` maps every
    name dblock uses for lock table ``table``, the lock table's first, to the columns it must
    have.
    """
    main = next(iter(required))
    for name, needed in required.items():
        if name not in found:
            continue
        lacking = needed - {column.lower() for column in found[name]}
        if not lacking:
            continue
        what = f"table {table}" if name == main else f"table {name} (beside lock table {table})"
        raise ConfigurationError(
            f"{what} in {safe_url} is not dblock's (it lacks dblock's column(s) "
            f"{', '.join(sorted(lacking))}): dblock never changes a table it did not create; "
            "give another table name (--table, connect(table=...))"
        )


class MissingTable(ConfigurationError):
    """create_schema=False and the lock table (or part of it) does not exist: nothing was ever
    held in it, which the read-only commands report as such."""


def missing(table: str, safe_url: str, dialect: str) -> MissingTable:
    """The error for create_schema=False when the lock table (or part of it) does not exist."""
    return MissingTable(
        f"the lock table {table} does not exist in {safe_url}; it is created by "
        "connect(create_schema=True) and by the dblock commands that take locks (run, once), "
        f"or apply `dblock schema --dialect {dialect}`"
    )


__all__ = [
    "HOLDERS",
    "MAIN",
    "META",
    "MissingTable",
    "missing",
    "refuse_foreign",
]
