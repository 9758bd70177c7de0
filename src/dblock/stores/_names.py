"""Names of the objects that live beside the lock table (pure)."""

from __future__ import annotations

import hashlib

_MAX_IDENTIFIER = 63  # PostgreSQL truncates longer identifiers; MySQL allows 64


def aux_name(table: str, suffix: str) -> str:
    """``table + suffix``, shortened with a hash when that would exceed 63 characters.

    Deterministic, so every client and ``dblock schema`` agree on the name.
    """
    name = table + suffix
    if len(name) <= _MAX_IDENTIFIER:
        return name
    digest = hashlib.sha1(table.encode(), usedforsecurity=False).hexdigest()[:8]
    return f"{table[: _MAX_IDENTIFIER - len(suffix) - 9]}_{digest}{suffix}"


def qualify(schema: str | None, name: str, quote: str) -> str:
    """A quoted, optionally schema-qualified identifier (inputs already validated)."""
    quoted = f"{quote}{name}{quote}"
    return f"{quote}{schema}{quote}.{quoted}" if schema else quoted
