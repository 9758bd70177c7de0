"""Input validation shared by the client, the locks and the CLI (pure, no I/O)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Final

from ._errors import ConfigurationError

MAX_KEY_LENGTH: Final = 255
MAX_TTL: Final = 31_536_000.0  # one year, in seconds
MAX_TABLE_LENGTH: Final = 63
MAX_NOTE_LENGTH: Final = 4096
#: the longest value an election's leader may proclaim
MAX_LEADER_VALUE: Final = 1024
#: the most connections one client's pool may be allowed
MAX_CONNECTIONS: Final = 10_000
#: purge(older_than=) beyond this (about a century) means the same as this
MAX_PURGE_AGE: Final = 3_155_760_000.0
_IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def check_key(key: object) -> str:
    """Return ``key`` if it is a valid lock key, else raise TypeError or ValueError."""
    if not isinstance(key, str):
        raise TypeError(f"lock key must be a str, not {type(key).__name__}")
    if not key:
        raise ValueError("lock key must not be empty")
    if len(key) > MAX_KEY_LENGTH:
        raise ValueError(
            f"lock key is {len(key)} characters long; at most {MAX_KEY_LENGTH} are allowed"
        )
    if "\x00" in key:
        raise ValueError("lock key must not contain NUL characters")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            "lock key must be valid Unicode text (it contains a lone surrogate)"
        ) from None
    return key


def check_note(note: object) -> str | None:
    """Return ``note`` (None or text stored beside a once-record) if valid, like a key: a
    ``str`` (else TypeError) of at most MAX_NOTE_LENGTH characters, no NUL, no lone surrogate
    (else ValueError)."""
    if note is None:
        return None
    if not isinstance(note, str):
        raise TypeError(f"note must be a str or None, not {type(note).__name__}")
    if len(note) > MAX_NOTE_LENGTH:
        raise ValueError(
            f"note is {len(note)} characters long; at most {MAX_NOTE_LENGTH} are allowed"
        )
    if "\x00" in note:
        raise ValueError("note must not contain NUL characters (PostgreSQL cannot store them)")
    try:
        note.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("note must be valid Unicode text (it contains a lone surrogate)") from None
    return note


def check_leader_value(value: object) -> str | None:
    """Return ``value`` (what a leader proclaims: None or text) if valid: a ``str`` (else
    TypeError) of at most MAX_LEADER_VALUE characters, no NUL, no lone surrogate (else
    ValueError)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"a leader's value must be a str or None, not {type(value).__name__}")
    if len(value) > MAX_LEADER_VALUE:
        raise ValueError(
            f"a leader's value is {len(value)} characters long; at most {MAX_LEADER_VALUE} "
            "are allowed"
        )
    if "\x00" in value:
        raise ValueError("a leader's value must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            "a leader's value must be valid Unicode text (it contains a lone surrogate)"
        ) from None
    return value


def check_max_connections(value: object) -> int:
    """The pool's bound: a whole number from 1 to MAX_CONNECTIONS (ConfigurationError)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CONNECTIONS:
        raise ConfigurationError(
            f"max_connections must be a whole number from 1 to {MAX_CONNECTIONS}, got {value!r}"
        )
    return value


def check_seconds(
    value: object, name: str, *, allow_zero: bool = False, maximum: float = MAX_TTL
) -> float:
    """Return ``value`` as float seconds if finite, positive (or zero) and within ``maximum``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    seconds = float(value)
    if not math.isfinite(seconds):
        raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {bound} seconds, got {value!r}")
    if seconds > maximum:
        raise ValueError(f"{name} must be at most {maximum:g} seconds, got {value!r}")
    return seconds


def check_ttl(ttl: object) -> float:
    """A lease: finite, > 0 and at most one year."""
    return check_seconds(ttl, "ttl")


def check_timeout(timeout: object) -> float | None:
    """A wait: None (forever) or a finite number >= 0."""
    if timeout is None:
        return None
    return check_seconds(timeout, "timeout", allow_zero=True, maximum=math.inf)


def check_table(table: object) -> tuple[str | None, str]:
    """Split a validated ``[schema.]table`` name; raise ConfigurationError otherwise."""
    if not isinstance(table, str):
        raise ConfigurationError(f"table must be a str, not {type(table).__name__}")
    parts = table.split(".")
    if len(parts) > 2 or not all(_IDENTIFIER.fullmatch(p) for p in parts):
        raise ConfigurationError(
            f"invalid table name {table!r}: use letters, digits and '_', starting with a "
            f"letter or '_', at most {MAX_TABLE_LENGTH} characters, optionally 'schema.table'"
        )
    if len(parts) == 2:
        return parts[0], parts[1]
    return None, parts[0]


def check_keys(keys: object, max_keys: int, store: str) -> tuple[str, ...]:
    """The keys of ``lock_many`` as given, each a valid key: a sequence (a ``str`` is one key,
    not a sequence of them: TypeError) that is not empty, has no key twice and at most
    ``max_keys`` of them (what the ``store`` takes in one atomic step), else ValueError."""
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Iterable):
        raise TypeError(
            f"lock_many takes a list of keys, not {type(keys).__name__}: "
            "lock_many(['sku-1', 'sku-7'])"
        )
    checked = tuple(map(check_key, keys))
    if not checked:
        raise ValueError("lock_many needs at least one key")
    if len(set(checked)) < len(checked):
        seen: set[str] = set()
        for key in checked:
            if key in seen:
                raise ValueError(f"lock_many: key {key!r} is given twice; give each key once")
            seen.add(key)
    if len(checked) > max_keys:
        raise ValueError(
            f"lock_many: {len(checked)} keys, but the {store} store takes at most {max_keys} "
            "in one atomic step; split the set, or lock a coarser key that covers them"
        )
    return checked
