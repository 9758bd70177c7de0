"""``lock``, ``locked``, ``once`` on the process's client, and fenced writes through the ORM.

They are the client's own patterns (API.md, Patterns), looked up on first use so that a module
of views or commands can be imported before any database is configured.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, ParamSpec, TypeVar

from django.db.models import Q, QuerySet

import dblock

from .client import get_client

P = ParamSpec("P")
R = TypeVar("R")


def lock(key: str, **options: Any) -> dblock.Lock:
    """``client.lock(key, ...)`` on the Django client: ``with lock("report", timeout=5) as held:``
    (``held.token`` is the fencing token of the hold)."""
    return get_client().lock(key, **options)


def once(key: str, **options: Any) -> AbstractContextManager[dblock.Lock]:
    """``client.once(key, ...)``: the block runs at most once successfully per key; otherwise
    ``dblock.InProgress`` (someone runs it now) or ``dblock.AlreadyDone``."""
    return get_client().once(key, **options)


def locked(template: str, **options: Any) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """``client.locked(template, ...)``: hold ``template.format(**call arguments)`` during each
    call (a view's URL arguments, a command's options); busy past ``timeout`` ->
    ``dblock.LockTimeout``. The options and their defaults are the client's (one place).

    >>> @locked("invoice:{pk}", ttl=60, timeout=0)
    ... def regenerate(request, pk): ...
    """

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        made: list[Any] = [None, fn]  # the client, and fn wrapped by its locked()

        @functools.wraps(fn)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            client = get_client()
            if made[0] is not client:  # the first call, or the client was closed and made anew
                made[:] = [client, client.locked(template, **options)(fn)]
            wrapped: Callable[P, R] = made[1]
            return wrapped(*args, **kwargs)

        return call

    return decorate


def fenced_update(
    queryset: QuerySet[Any], token: int, *, field: str = "fence_token", **values: Any
) -> int:
    """Update the rows of ``queryset`` with ``values`` and ``field=token``, but only those whose
    ``field`` is NULL or lower than ``token``: a holder whose lease ran out (and whose key a
    newer holder took) changes nothing. Returns the rows updated (0: this hold was stale).

    >>> with lock(f"stock:{sku}") as held:
    ...     fenced_update(Stock.objects.filter(sku=sku), held.token, level=F("level") - 1)
    """
    fresh = Q(**{f"{field}__isnull": True}) | Q(**{f"{field}__lt": token})
    updated: int = queryset.filter(fresh).update(**{field: token}, **values)
    return updated


__all__ = ["fenced_update", "lock", "locked", "once"]
