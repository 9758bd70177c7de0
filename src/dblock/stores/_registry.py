"""Every store dblock can open, by name and URL scheme: the built-in stores' entries (each in
its package's ``__init__``) and those another distribution adds under the entry-point group
``dblock.stores`` (each an object :class:`~dblock.stores._entry.StoreEntry`).

URL parsing, opening a store, ``dblock schema``, the wheel's smoke test, the architecture
test and the docs tables all read this one list. No driver is imported here."""

from __future__ import annotations

import functools
import importlib

from .._errors import ConfigurationError
from .._url import DatabaseURL, checked_url
from ._entry import StoreEntry

#: the entry-point group under which a distribution registers a store of its own
GROUP = "dblock.stores"
#: the packages of the stores that come with dblock (``stores/<name>/``, whose ``__init__``
#: holds its ``ENTRY`` and imports no driver), in the order the docs and messages list them
PACKAGES = ("sqlite", "postgresql", "mysql", "redis", "zookeeper", "etcd")
BUILT_IN: tuple[StoreEntry, ...] = tuple(
    importlib.import_module(f"{__package__}.{name}").ENTRY for name in PACKAGES
)
_SCHEMES = {scheme: entry for entry in BUILT_IN for scheme in entry.schemes}
_NAMES = {entry.name: entry for entry in BUILT_IN}


@functools.cache
def plugged() -> tuple[StoreEntry, ...]:
    """The stores other distributions register (read once, when a URL names no built-in
    scheme); one whose name or scheme a built-in store has is an error."""
    from importlib import metadata  # here: reading it costs a cold start ~10 ms

    found: list[StoreEntry] = []
    for point in metadata.entry_points(group=GROUP):
        entry = point.load()
        if not isinstance(entry, StoreEntry):
            raise ConfigurationError(
                f"the entry point {point.name} = {point.value} of group {GROUP} is not a "
                f"dblock StoreEntry but {type(entry).__name__}"
            )
        taken = [s for s in entry.schemes if s in _SCHEMES] + (
            [entry.name] if entry.name in _NAMES else []
        )
        if taken:
            raise ConfigurationError(
                f"the store {entry.name!r} of entry point {point.value} takes what a "
                f"built-in store has: {', '.join(taken)}"
            )
        found.append(entry)
    return tuple(found)


def entries() -> tuple[StoreEntry, ...]:
    """Every store: the built-in ones, then the plugged-in ones."""
    return BUILT_IN + plugged()


def entry(name: str) -> StoreEntry:
    """The store named ``name`` (a parsed URL's ``dialect``)."""
    found = _NAMES.get(name) or next((e for e in plugged() if e.name == name), None)
    if found is None:
        raise ConfigurationError(f"no store is named {name!r}")
    return found


def by_scheme(scheme: str) -> StoreEntry | None:
    """The store a URL scheme reaches (any case), or None."""
    scheme = scheme.lower()
    found = _SCHEMES.get(scheme)
    if found is None:
        found = next((e for e in plugged() if scheme in e.schemes), None)
    return found


def parse_url(url: str | None) -> DatabaseURL:
    """Parse ``url`` (None: the default); raise ConfigurationError naming what is wrong."""
    url, safe = checked_url(url)
    scheme, sep, _ = url.partition("://")
    found = by_scheme(scheme) if sep else None
    if found is None:
        usages = [e.usage for e in entries()]
        raise ConfigurationError(
            f"unsupported database URL {safe!r}: use {', '.join(usages[:-1])} or {usages[-1]}"
        )
    return found.parse(url, found.name, safe)


__all__ = ["BUILT_IN", "GROUP", "StoreEntry", "by_scheme", "entries", "entry", "parse_url"]
