"""The one place a lock's life is reported: Lock objects call these hooks, observers listen.

Observers (metrics, traces; see :mod:`dblock.observability`) are process-wide. Logging is
always there and quiet at the default level (grants and releases at DEBUG, losses and failed
renewals at WARNING). When no observer is registered and DEBUG is off, an acquire costs one
attribute test and one ``isEnabledFor`` (a cached dict lookup) more than without hooks.

Every primitive (Lock, read/write holds, semaphores, once, scheduled) is a Lock, and the async
client runs that same Lock code in greenlets, so these hooks serve all of them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Literal, NamedTuple, Protocol

from ._errors import DBLockError

log = logging.getLogger("dblock")

Outcome = Literal["granted", "busy", "timeout", "error", "cancelled"]


class LockEvent(NamedTuple):  # a tuple: made on every acquire, and cheapest to make
    """Who, what and where: the fields every hook gets. ``owner`` and ``token`` are those of
    the hold (None for an acquire that was not granted); ``reentry`` marks a re-entrant
    acquisition of a hold the owner already had (no new hold)."""

    backend: str
    key: str
    kind: str
    owner: str | None = None
    token: int | None = None
    reentry: bool = False


class Observer(Protocol):
    """What an observer implements (a hook it leaves out is not called). Hooks run on the
    thread (or greenlet) of the event and must be quick; an exception is logged, not raised.
    Every time is in seconds."""

    def acquiring(self, event: LockEvent) -> None:
        """An acquire call began (it may wait); :meth:`acquired` reports its end."""

    def acquired(
        self, event: LockEvent, outcome: Outcome, wait: float, error: BaseException | None
    ) -> None:
        """An acquire ended: ``wait`` is its whole duration, the wait included."""

    def released(self, event: LockEvent, held: float, lost: bool) -> None:
        """The hold ended in the store (last release of a re-entrant hold)."""

    def lost(self, event: LockEvent) -> None:
        """The lease was found lost (once per hold)."""

    def renewal_failed(self, event: LockEvent, error: BaseException) -> None:
        """A background renewal failed; it is retried until the lease may have ended."""


class Hold(Protocol):
    """What the hooks read of a hold (dblock._engine.Hold; named here, not imported, as the
    engine reports through this module)."""

    key: str
    owner: str
    token: int
    count: int
    spec: Any
    handle: object | None
    granted_at: float
    loss_reported: bool


class Lock(Protocol):
    """What the hooks read of a lock object (dblock.Lock)."""

    _spec: Any
    _core: Any
    _timeout: float | None

    def _current(self) -> Any: ...


HOOKS = ("acquiring", "acquired", "released", "lost", "renewal_failed")


class _Hub:
    """The registered observers, and each hook's bound methods, as tuples replaced whole
    (readers take no lock)."""

    observers: tuple[Observer, ...] = ()
    hooks: dict[str, tuple[Callable[..., None], ...]] = dict.fromkeys(HOOKS, ())
    #: the hooks called on every acquire and release, as attributes (read on the hot path)
    acquiring: tuple[Callable[..., None], ...] = ()
    acquired: tuple[Callable[..., None], ...] = ()
    released: tuple[Callable[..., None], ...] = ()

    def active(self) -> bool:
        return bool(self.observers) or log.isEnabledFor(logging.DEBUG)

    def set(self, observers: tuple[Observer, ...]) -> None:
        # an observer may leave out the hooks it has no use for
        self.hooks = {
            hook: tuple(m for o in observers if (m := getattr(o, hook, None)) is not None)
            for hook in HOOKS
        }
        self.acquiring = self.hooks["acquiring"]
        self.acquired = self.hooks["acquired"]
        self.released = self.hooks["released"]
        self.observers = observers


HUB = _Hub()


def add(observer: Observer) -> None:
    if observer not in HUB.observers:
        HUB.set((*HUB.observers, observer))


def remove(observer: Observer) -> None:
    HUB.set(tuple(o for o in HUB.observers if o is not observer))


def _event(lock: Lock, hold: Hold | None = None, *, reentry: bool = False) -> LockEvent:
    spec = lock._spec
    name = lock._core.store.name
    # tuple.__new__ directly: a NamedTuple's own __new__ is Python code, and this runs up to
    # three times per acquire and release
    if hold is None:
        return _new(LockEvent, (name, spec.key, spec.kind, None, None, False))
    return _new(LockEvent, (name, spec.key, spec.kind, hold.owner, hold.token, reentry))


_new = tuple.__new__


def _report(hook: str, *args: object) -> None:
    """Call ``hook`` on every observer; an observer's bug must not fail the lock."""
    _call(HUB.hooks[hook], args)


def _call(methods: tuple[Callable[..., None], ...], args: tuple[object, ...]) -> None:
    for method in methods:
        try:
            method(*args)
        except Exception:
            log.exception("dblock observer hook %r failed", method)


def acquire(
    lock: Lock,
    acquire: Callable[[bool, float | None], Hold | None],
    blocking: bool,
    timeout: float | None,
) -> bool:
    """Run ``acquire`` (the hold had, or None) and report it (the caller checked
    :meth:`_Hub.active`)."""
    if HUB.acquiring:  # the event is made only for an observer that takes it
        _call(HUB.acquiring, (_event(lock),))
    started = time.monotonic()
    try:
        hold = acquire(blocking, timeout)
    except BaseException as exc:
        # asyncio's CancelledError, KeyboardInterrupt: not the store's failure
        outcome: Outcome = "error" if isinstance(exc, (DBLockError, Exception)) else "cancelled"
        _acquired(lock, None, outcome, time.monotonic() - started, exc)
        raise
    if hold is not None:
        outcome = "granted"
    else:
        no_wait = not blocking or timeout == 0 or (timeout is None and lock._timeout == 0)
        outcome = "busy" if no_wait else "timeout"
    _acquired(lock, hold, outcome, time.monotonic() - started, None)
    return hold is not None


def _acquired(
    lock: Lock,
    hold: Hold | None,
    outcome: Outcome,
    wait: float,
    error: BaseException | None,
) -> None:
    event = _event(lock) if hold is None else _event(lock, hold, reentry=hold.count > 1)
    _call(HUB.acquired, (event, outcome, wait, error))
    if outcome in ("granted", "error") and log.isEnabledFor(logging.DEBUG):
        if outcome == "granted":
            message = "granted lock %r (token %s) after %.3f s"
            log.debug(message, event.key, event.token, wait, extra=_fields(event, wait=wait))
        else:
            log.debug("acquiring lock %r failed: %s", event.key, error, extra=_fields(event))


def released(lock: Lock, hold: Hold, lost: bool) -> None:
    """The last release of ``hold`` ended it in the store."""
    if lost:
        found_lost(lock, hold)
    if not HUB.active():
        return
    event = _event(lock, hold)
    held = time.monotonic() - hold.granted_at
    _call(HUB.released, (event, held, lost))
    if log.isEnabledFor(logging.DEBUG):
        message = "released lock %r (token %d) after %.3f s"
        log.debug(message, event.key, hold.token, held, extra=_fields(event, held=held))


def found_lost(lock: Lock, hold: Hold) -> None:
    """The lease of ``hold`` is gone: logged and counted once per hold."""
    if hold.loss_reported:
        return
    hold.loss_reported = True
    event = _event(lock, hold)
    what = "session hold" if event.kind == "session" else "lease"
    log.warning(
        "lost the %s of lock %r (token %d)", what, event.key, hold.token, extra=_fields(event)
    )
    _report("lost", event)


def renewal_failed(hold: Hold, error: BaseException) -> None:
    """A background renewal of ``hold`` failed (it is retried while the lease may last)."""
    core = getattr(hold.handle, "_core", None)  # the Lock that took it
    backend = core.store.name if core is not None else "?"
    event = LockEvent(backend, hold.key, hold.spec.kind, hold.owner, hold.token)
    log.warning("renewing %r failed, retrying: %s", hold.key, error, extra=_fields(event))
    _report("renewal_failed", event, error)


def _fields(event: LockEvent, **more: float) -> dict[str, object]:
    """The structured fields of a log record: ``record.key``, ``.owner``, ``.token``,
    ``.kind``, ``.backend`` (and ``.wait`` / ``.held`` in seconds where they apply)."""
    fields: dict[str, object] = {
        "key": event.key,
        "kind": event.kind,
        "backend": event.backend,
        "owner": event.owner,
        "token": event.token,
    }
    fields.update(more)
    return fields
