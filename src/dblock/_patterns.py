"""The patterns on top of Lock: once (the status lock), scheduled, locked.

``once(key)`` is the transaction / retry-compensation lock. Its record moves::

    (none) --claim--> processing --ok--> succeeded          (never runs again: AlreadyDone)
                          |    \\--exception--> failed --claim--> processing ...
                          \\--holder crashed: lease expires --claim--> processing ...

A live ``processing`` record makes others get ``InProgress``. The outcome is written by the
same statement that ends the hold, so no path leaves a key ``processing`` with a live lease
after its holder is gone.
"""

from __future__ import annotations

import functools
import inspect
import logging
import string
from collections.abc import Callable
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from ._contract import OnceRecords, lacking, provides
from ._core import Core
from ._errors import AlreadyDone, ConfigurationError, InProgress
from ._lock import Lock
from ._validate import check_note, check_seconds, check_ttl

log = logging.getLogger("dblock")
P = ParamSpec("P")
R = TypeVar("R")
_CLAIM_ATTEMPTS = 5


class OnceLock(Lock):
    """The hold behind ``client.once()``: claims a once-record, records the outcome."""

    def __init__(
        self, core: Core, key: str, *, ttl: float, note: str | None, auto_renew: bool
    ) -> None:
        super().__init__(core, key, ttl=ttl, reentrant=False, auto_renew=auto_renew, kind="once")
        self._spec.note = check_note(note)

    def __enter__(self) -> OnceLock:
        store = self._core.store
        if not provides(store, OnceRecords):
            raise lacking(store, OnceRecords, "once()")
        for _ in range(_CLAIM_ATTEMPTS):
            if self.acquire(blocking=False):
                return self
            row = store.once_state(self.key)
            if row is None:
                continue  # purged between the two statements: claim again
            kind, state, live = row
            if kind == "once" and state == "succeeded":
                raise AlreadyDone(
                    f"{self.key!r} has already succeeded (table {store.table}); it runs at "
                    "most once successfully",
                    key=self.key,
                )
            if live:
                raise InProgress(
                    f"{self.key!r} is being processed by another owner right now (table "
                    f"{store.table}); try again after it finishes or its lease expires",
                    key=self.key,
                )
        raise InProgress(
            f"{self.key!r} could not be claimed: it changed hands repeatedly", key=self.key
        )

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._spec.outcome = "succeeded" if exc_type is None else "failed"
        self.release()


class ScheduledLock(Lock):
    """The hold behind ``client.scheduled()``: kept until ``at_least`` s after its start."""

    def __init__(self, core: Core, name: str, *, at_most: float, at_least: float) -> None:
        super().__init__(core, name, ttl=at_most, reentrant=False, kind="scheduled")
        self._spec.at_least = at_least


def scheduled_lock(
    core: Core, name: str, at_most: float, at_least: float
) -> Callable[[], ScheduledLock]:
    """``scheduled``'s checks, now; what they give makes the lock of each run."""
    at_most = check_ttl(at_most)
    at_least = check_seconds(at_least, "at_least", allow_zero=True)
    if at_least > at_most:
        raise ConfigurationError(
            f"scheduled({name!r}): need 0 <= at_least <= at_most, got at_least={at_least:g} "
            f"and at_most={at_most:g}"
        )
    ScheduledLock(core, name, at_most=at_most, at_least=at_least)  # validates the name now
    return lambda: ScheduledLock(core, name, at_most=at_most, at_least=at_least)


def scheduled(
    core: Core, name: str, at_most: float, at_least: float = 0.0
) -> Callable[[Callable[P, R]], Callable[P, R | None]]:
    """Decorator: of N hosts calling the job at once, exactly one runs it; others get None."""
    new_lock = scheduled_lock(core, name, at_most, at_least)

    def decorate(fn: Callable[P, R]) -> Callable[P, R | None]:
        @functools.wraps(fn)
        def run(*args: P.args, **kwargs: P.kwargs) -> R | None:
            lock = new_lock()
            if not lock.acquire(blocking=False):
                log.debug("scheduled job %r skipped: another host holds its lock", name)
                return None
            try:
                return fn(*args, **kwargs)
            finally:
                lock.release()

        return run

    return decorate


def locked(
    make_lock: Callable[..., Lock],
    template: str,
    *,
    ttl: float,
    timeout: float | None,
    **options: Any,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorator: hold the lock named by ``template.format(**arguments)`` during each call;
    ``make_lock`` is the client's ``lock``."""
    keys = key_template(template, ttl)

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        key_of = keys(fn)

        @functools.wraps(fn)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            with make_lock(key_of(*args, **kwargs), ttl=ttl, timeout=timeout, **options):
                return fn(*args, **kwargs)

        return call

    return decorate


def key_template(template: str, ttl: float) -> Callable[[Callable[..., Any]], Callable[..., str]]:
    """``locked``'s checks: of the template now, of each function it decorates when it does;
    what they give is the function's call arguments -> its key."""
    if not isinstance(template, str):
        raise TypeError("the key template must be a str")
    check_ttl(ttl)
    fields = {
        name.split(".", 1)[0].split("[", 1)[0]
        for _, name, _, _ in string.Formatter().parse(template)
        if name is not None
    }
    if "" in fields or any(f.isdigit() for f in fields):
        raise ConfigurationError(
            f"key template {template!r}: name the arguments, e.g. 'order:{{order_id}}'"
        )

    def for_function(fn: Callable[..., Any]) -> Callable[..., str]:
        signature = inspect.signature(fn)
        missing = fields - set(signature.parameters)
        if missing:
            raise ConfigurationError(
                f"key template {template!r} names {sorted(missing)}, which "
                f"{fn.__qualname__}{signature} does not take"
            )

        def key_of(*args: Any, **kwargs: Any) -> str:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return template.format(**bound.arguments)

        return key_of

    return for_function


__all__ = ["OnceLock", "ScheduledLock", "key_template", "locked", "scheduled", "scheduled_lock"]
