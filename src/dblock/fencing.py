"""Fenced writes: let the protected resource reject work done under a lost lease.

A lease can run out while its holder is paused (GC, swap, SIGSTOP, a slow network); another
owner then takes the key and acts. Renewal narrows that window but cannot close it. The
resource itself can: every acquisition carries a fencing token (``lock.token``) that strictly
increases per key, so each write records the token it was made under and is accepted only if
that token is at least the last one recorded. A stale holder's write then changes nothing, and
one hold may write many times (a token belongs to one grant: no other holder ever has it).

:func:`fenced_update` builds that guarded ``UPDATE`` for your table and driver::

    import dblock.fencing

    stmt = dblock.fencing.fenced_update(
        client.dialect, "inventory", set_columns=["stock"], key_columns=["sku"]
    )
    # UPDATE "inventory" SET "stock" = ?, "fence_token" = ?
    #   WHERE "sku" = ? AND ("fence_token" IS NULL OR "fence_token" <= ?)
    with client.lock("inventory:sku-42", ttl=30) as lock:
        stock = read_stock(conn, "sku-42")
        cur = conn.cursor()
        if not stmt.execute(cur, [stock - 1], ["sku-42"], lock.token):
            raise RuntimeError("a newer holder has written: this hold was stale")
        conn.commit()

Rules for it to protect anything:

* Guard each resource with one lock key, and add the token column to its rows (``BIGINT``,
  NULL or 0 for rows never written). Tokens increase per key, not across keys.
* The row must exist: an ``UPDATE`` of a missing row changes nothing and reads as "rejected".
  Insert rows beforehand (with a NULL or 0 token).
* Make the guarded ``UPDATE`` the write that counts (or run the rest of the work in the same
  transaction and roll back when it was rejected). Reads done under a stale lease may be stale
  too: decide from the database row, not from what the stale holder read earlier.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

from ._errors import ConfigurationError
from ._validate import check_table

__all__ = ["DIALECTS", "FencedUpdate", "fenced_update"]

#: dialect -> (identifier quote, DB-API placeholder). ``client.dialect`` is one of the keys.
DIALECTS: Final[dict[str, tuple[str, str]]] = {
    "sqlite": ('"', "?"),  # sqlite3: paramstyle qmark
    "postgresql": ('"', "%s"),  # psycopg 3 (and psycopg2): format
    "mysql": ("`", "%s"),  # PyMySQL, mysqlclient: format
}
_ALIASES: Final = {"postgres": "postgresql", "mariadb": "mysql"}
_IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


class Cursor(Protocol):
    """The part of a DB-API cursor that :meth:`FencedUpdate.execute` uses."""

    @property
    def rowcount(self) -> int: ...

    def execute(self, query: Any, params: Any = ..., /) -> Any: ...


@dataclass(frozen=True)
class FencedUpdate:
    """A guarded ``UPDATE``: ``sql`` with its placeholders, and how to fill them.

    ``sql`` sets ``set_columns`` and the token column of the row whose key columns match, if
    the row's recorded token is NULL or not larger than the new one (the same hold may write
    again). One row changed means accepted; none means rejected (a newer token was recorded,
    or no such row).
    """

    sql: str
    set_columns: tuple[str, ...]
    key_columns: tuple[str, ...]
    token_column: str

    def params(self, values: Sequence[Any], keys: Sequence[Any], token: int) -> tuple[Any, ...]:
        """The parameters for ``sql``, in order: values, token, keys, token."""
        if isinstance(token, bool) or not isinstance(token, int):
            raise TypeError(f"token must be an int (lock.token), not {type(token).__name__}")
        values, keys = tuple(values), tuple(keys)
        if len(values) != len(self.set_columns):
            raise ValueError(
                f"expected {len(self.set_columns)} value(s) for {list(self.set_columns)}, "
                f"got {len(values)}"
            )
        if len(keys) != len(self.key_columns):
            raise ValueError(
                f"expected {len(self.key_columns)} key value(s) for {list(self.key_columns)}, "
                f"got {len(keys)}"
            )
        return (*values, token, *keys, token)

    def execute(
        self, cursor: Cursor, values: Sequence[Any], keys: Sequence[Any], token: int
    ) -> bool:
        """Run the update on a DB-API ``cursor``; True if the write was accepted.

        Commit (or run in autocommit) as you would any write; the result is final only then.
        """
        cursor.execute(self.sql, self.params(values, keys, token))
        return cursor.rowcount == 1


def _identifier(name: object, what: str) -> str:
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
        raise ConfigurationError(
            f"invalid {what} {name!r}: use letters, digits and '_', starting with a letter or "
            "'_', at most 63 characters"
        )
    return name


def _columns(names: object, what: str) -> tuple[str, ...]:
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise ConfigurationError(f"{what} must be a list of column names, not {names!r}")
    return tuple(_identifier(n, f"{what[:-1]} name") for n in names)


def fenced_update(
    dialect: str,
    table: str,
    set_columns: Sequence[str],
    key_columns: Sequence[str],
    *,
    token_column: str = "fence_token",  # noqa: S107 - a column name, not a password
) -> FencedUpdate:
    """Build the fenced ``UPDATE`` of ``table`` for ``dialect``.

    ``dialect``: ``"sqlite"``, ``"postgresql"`` or ``"mysql"`` (``client.dialect``; also
    ``"postgres"``, ``"mariadb"``), which picks the quoting and the driver's placeholder.
    ``table``: ``name`` or ``schema.name``; columns: plain names. Identifiers follow the rules
    of dblock's own table name; anything else raises :class:`dblock.ConfigurationError`
    before any SQL exists, so the statement holds no caller text but validated names.

    >>> u = fenced_update("mysql", "accounts", ["balance"], ["id"])
    >>> print(u.sql)  # doctest: +NORMALIZE_WHITESPACE
    UPDATE `accounts` SET `balance` = %s, `fence_token` = %s
    WHERE `id` = %s AND (`fence_token` IS NULL OR `fence_token` <= %s)
    >>> u.params([90], [7], token=12)
    (90, 12, 7, 12)
    """
    name = _ALIASES.get(dialect, dialect) if isinstance(dialect, str) else dialect
    if not isinstance(name, str) or name not in DIALECTS:
        raise ConfigurationError(
            f"unknown dialect {dialect!r}: use one of {', '.join(sorted(DIALECTS))} "
            "(client.dialect)"
        )
    quote, mark = DIALECTS[name]
    schema, bare = check_table(table)
    sets = _columns(set_columns, "set_columns")
    keys = _columns(key_columns, "key_columns")
    token = _identifier(token_column, "token column name")
    if not keys:
        raise ConfigurationError("key_columns must name at least one column (the row's key)")
    every = [*sets, *keys, token]
    folded = [c.lower() for c in every]  # MySQL and SQLite compare column names caselessly
    if len(set(folded)) != len(folded):
        raise ConfigurationError(
            f"columns must be distinct, and the token column {token!r} must be neither set "
            f"nor a key: got set_columns={list(sets)}, key_columns={list(keys)}"
        )

    def q(ident: str) -> str:
        return f"{quote}{ident}{quote}"

    target = f"{q(schema)}.{q(bare)}" if schema else q(bare)
    assignments = ", ".join(f"{q(c)} = {mark}" for c in (*sets, token))
    where = " AND ".join(f"{q(c)} = {mark}" for c in keys)
    sql = (
        f"UPDATE {target} SET {assignments} WHERE {where} "
        f"AND ({q(token)} IS NULL OR {q(token)} <= {mark})"
    )
    return FencedUpdate(sql, sets, keys, token)
