"""The key prefix that labels metrics and groups the dashboard's chart."""

from __future__ import annotations

#: the label of keys that have no ``:``
NO_PREFIX = "(none)"
#: the label of the keys whose prefix came after ``max_prefixes`` others (parenthesised, as
#: ``(none)``: no prefix before a ``:`` is mistaken for it by accident)
OTHER = "(other)"
#: distinct prefixes that get series of their own, by default. Each costs a scrape about 37
#: samples (two histograms): 200 make about 7,400 and a scrape of about 60 ms, 1,000 took
#: 300 ms (bench ``scrape``)
DEFAULT_MAX_PREFIXES = 200


def key_prefix(key: str) -> str:
    """The part of ``key`` before its first ``:`` (``"inventory:ACME:sku-42"`` ->
    ``"inventory"``); ``"(none)"`` for a key without one, so that keys like ``job-1842``
    do not each become a time series."""
    head, sep, _ = key.partition(":")
    return head if sep and head else NO_PREFIX
