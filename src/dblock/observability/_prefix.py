"""The key prefix that labels metrics and groups the dashboard's chart."""

from __future__ import annotations

#: the label of keys that have no ``:``
NO_PREFIX = "(none)"


def key_prefix(key: str) -> str:
    """The part of ``key`` before its first ``:`` (``"inventory:ACME:sku-42"`` ->
    ``"inventory"``); ``"(none)"`` for a key without one, so that keys like ``job-1842``
    do not each become a time series."""
    head, sep, _ = key.partition(":")
    return head if sep and head else NO_PREFIX
