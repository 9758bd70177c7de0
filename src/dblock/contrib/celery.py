"""Celery tasks that run under a dblock lock: "this task must not run twice at once".

>>> from dblock.contrib.celery import LockedTask
>>> app.conf.dblock_url = "postgresql://app@db/app"
>>> @app.task(base=LockedTask, dblock_busy="retry", dblock_ttl=60)
... def settle(order_id, dblock_token=None):
...     ledger.write(order_id, fence=dblock_token)

Each call holds the lock of its key while the body runs (renewed in the background). The key
is ``celery:<task name>:<the call's arguments as JSON>`` (hashed when longer than a key may
be), or what ``dblock_key`` gives: a template formatted with the arguments, as
``client.locked`` takes (``"settle:{order_id}"``), or a function of the arguments. When another
worker holds the key, ``dblock_busy`` says what to do:

- ``"skip"``: return :func:`skipped`'s marker without running the body (and log it);
- ``"retry"``: Celery's ``self.retry(countdown=dblock_countdown)``, so the task runs later
  (bounded by the task's ``max_retries``, as any retry);
- ``"wait"``: wait for the lock, at most ``dblock_timeout`` s, then fail with ``LockTimeout``.

``dblock_once=True`` runs the body under ``client.once(key)`` instead: it succeeds at most once
per key, a failed run may run again (a later call, or Celery's retry after the failure), and a
duplicate that finds the key done returns the ``"done"`` marker; one that finds it in progress
is handled by ``dblock_busy`` (``"skip"`` or ``"retry"``).

A body that declares a ``dblock_token`` parameter receives the hold's fencing token there.
The client is ``dblock_client`` if the task has one, else one per app and process made from
``app.conf.dblock_url`` (else ``DBLOCK_URL``, else the embedded default) and
``app.conf.dblock_table``, opened at the first call (in the worker's process, after any fork).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any, Final, Literal, TypedDict

import dblock

try:
    from celery import Celery, Task, signals
except ImportError as exc:  # pragma: no cover - depends on the extras installed
    raise dblock.ConfigurationError(
        "dblock.contrib.celery needs Celery: pip install 'dblock[celery]'"
    ) from exc

from dblock._patterns import key_template
from dblock.tools import MAX_TTL, check_key, check_seconds

log = logging.getLogger("dblock.contrib.celery")

Busy = Literal["skip", "retry", "wait"]
_BUSY: Final = ("skip", "retry", "wait")
#: the body's parameter that receives the fencing token (never part of the key)
TOKEN_PARAMETER: Final = "dblock_token"  # noqa: S105  (a parameter name, not a secret)
_PREFIX: Final = "celery:"


class Skipped(TypedDict):
    """What a call that did not run returns: ``reason`` is "busy" (another worker holds the
    key), "in_progress" (a once-task being run elsewhere) or "done" (a once-task that already
    succeeded). Plain JSON, so any result backend stores it."""

    dblock: Literal["skipped"]
    key: str
    reason: Literal["busy", "in_progress", "done"]


def skipped(result: object) -> bool:
    """Whether a task's result is the marker of a call that did not run its body."""
    return isinstance(result, dict) and result.get("dblock") == "skipped"


class LockedTask(Task):  # type: ignore[misc]  # celery ships no type information
    """Base class for tasks that run under a dblock lock; options as task options
    (``@app.task(base=LockedTask, dblock_busy="wait", dblock_timeout=30)``)."""

    #: None (the call's arguments), a template such as "order:{order_id}", or a function
    #: taking the task's arguments and returning the key
    dblock_key: str | Callable[..., str] | None = None
    dblock_busy: Busy = "skip"
    dblock_ttl: float = 60.0
    #: "wait": how long to wait for the lock; None waits forever
    dblock_timeout: float | None = 60.0
    #: "retry": how many seconds later the task runs again
    dblock_countdown: float = 5.0
    dblock_once: bool = False
    dblock_client: dblock.Client | None = None

    #: (task name, call arguments) -> key, made from the options when the task is defined
    _dblock_keys: Callable[..., str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "run" in cls.__dict__:  # a task's class (@app.task makes one): check its options
            cls._dblock_keys = staticmethod(_check_options(cls))

    def dblock_key_for(self, *args: Any, **kwargs: Any) -> str:
        """The lock key of a call with these arguments (e.g. for ``client.state(...)``)."""
        if TOKEN_PARAMETER in kwargs:
            raise TypeError(f"{self.name}: {TOKEN_PARAMETER} is given by dblock, not the caller")
        return self._dblock_keys(self.name, *args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = self.dblock_key_for(*args, **kwargs)
        client = self.dblock_client or _app_client(self.app)
        if self.dblock_once:
            return self._run_once(client, key, args, kwargs)
        lock = client.lock(key, ttl=self.dblock_ttl, auto_renew=True, reentrant=False)
        if not lock.acquire(blocking=False):
            if self.dblock_busy != "wait":
                return self._busy(key, "busy")
            log.info("%s: %r is held elsewhere; waiting for it", self.name, key)
            if not lock.acquire(timeout=self.dblock_timeout):
                raise dblock.LockTimeout(
                    f"{self.name}: {key!r} was still held elsewhere after "
                    f"{self.dblock_timeout:g} s (table {client.table})",
                    key=key,
                )
        try:
            return self._body(lock.token, args, kwargs)
        finally:
            lock.release()

    def _run_once(
        self, client: dblock.Client, key: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        note = f"celery task {self.name} {self.request.id or ''}".rstrip()
        once = client.once(key, ttl=self.dblock_ttl, note=note)
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(once)  # its exit records succeeded or failed
            except dblock.AlreadyDone:
                log.info("%s: %r has already succeeded; not run again", self.name, key)
                return Skipped(dblock="skipped", key=key, reason="done")
            except dblock.InProgress:
                return self._busy(key, "in_progress")
            return self._body(once.token, args, kwargs)

    def _busy(self, key: str, reason: Literal["busy", "in_progress"]) -> Skipped:
        """The key is held (or being processed) elsewhere: skip, or retry later."""
        if self.dblock_busy == "retry":
            log.info(
                "%s: %r is held elsewhere; retrying in %g s", self.name, key, self.dblock_countdown
            )
            raise self.retry(countdown=self.dblock_countdown)
        log.info("%s: %r is held elsewhere; skipped", self.name, key)
        return Skipped(dblock="skipped", key=key, reason=reason)

    def _body(self, token: int | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if _takes_token(self.run):
            kwargs = {**kwargs, TOKEN_PARAMETER: token}
        return super().__call__(*args, **kwargs)


def _check_options(cls: type[LockedTask]) -> Callable[..., str]:
    """The task's options, checked when the task is defined; gives (its name, a call's
    arguments) -> the call's key."""
    name = cls.__dict__.get("name") or cls.__name__
    if cls.dblock_busy not in _BUSY:
        raise dblock.ConfigurationError(
            f"task {name}: dblock_busy must be one of {', '.join(_BUSY)}, got {cls.dblock_busy!r}"
        )
    if cls.dblock_once and cls.dblock_busy == "wait":
        raise dblock.ConfigurationError(
            f"task {name}: a once-task cannot wait for a run in progress (it may succeed); "
            "use dblock_busy='skip' or 'retry'"
        )
    check_seconds(cls.dblock_ttl, "dblock_ttl")
    check_seconds(cls.dblock_countdown, "dblock_countdown", allow_zero=True)
    if cls.dblock_timeout is not None:
        check_seconds(cls.dblock_timeout, "dblock_timeout", allow_zero=True, maximum=MAX_TTL)
    signature = _arguments_signature(cls.__dict__["run"])
    key = cls.dblock_key
    if key is None:
        return functools.partial(_default_key, signature)
    if isinstance(key, str):
        key_of = key_template(key, cls.dblock_ttl)(_with_signature(name, signature))
        return lambda _name, *args, **kwargs: key_of(*args, **kwargs)
    if callable(key):
        return lambda _name, *args, **kwargs: check_key(key(*args, **kwargs))
    raise TypeError(
        f"task {name}: dblock_key must be None, a template str or a function, not "
        f"{type(key).__name__}"
    )


def _arguments_signature(run: Any) -> inspect.Signature:
    """The signature the caller's arguments bind to: without ``self`` (a bound task) and
    without the token parameter."""
    if isinstance(run, staticmethod):
        parameters = list(inspect.signature(run.__func__).parameters.values())
    else:  # @app.task(bind=True): run is a function of (self, ...)
        parameters = list(inspect.signature(run).parameters.values())[1:]
    return inspect.Signature([p for p in parameters if p.name != TOKEN_PARAMETER])


def _with_signature(name: str, signature: inspect.Signature) -> Callable[..., Any]:
    """A stand-in function with ``signature``, for key_template to bind arguments to."""

    def stand_in(*args: Any, **kwargs: Any) -> None:
        return None

    stand_in.__signature__ = signature  # type: ignore[attr-defined]
    stand_in.__qualname__ = name
    return stand_in


def _default_key(signature: inspect.Signature, name: str, *args: Any, **kwargs: Any) -> str:
    """``celery:<name>:<arguments as JSON>``: positional or keyword, the same call gives the
    same key. Longer than a key may be: the arguments (then the name) as a SHA-256 digest."""
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    arguments = json.dumps(bound.arguments, sort_keys=True, default=repr, ensure_ascii=False)
    key = f"{_PREFIX}{name}:{arguments}"
    if len(key) > 255:
        digest = hashlib.sha256(arguments.encode("utf-8", "surrogatepass")).hexdigest()
        key = f"{_PREFIX}{name}:sha256:{digest}"
    if len(key) > 255:
        key = f"{_PREFIX}sha256:{hashlib.sha256(key.encode('utf-8')).hexdigest()}"
    return key


@functools.cache
def _takes_token_cached(run: Callable[..., Any]) -> bool:
    return TOKEN_PARAMETER in inspect.signature(run).parameters


def _takes_token(run: Callable[..., Any]) -> bool:
    return _takes_token_cached(getattr(run, "__func__", run))


_clients: weakref.WeakKeyDictionary[Celery, dblock.Client] = weakref.WeakKeyDictionary()
_clients_guard = threading.Lock()


def _app_client(app: Celery) -> dblock.Client:
    """The app's client in this process, opened at first use from the app's configuration."""
    with _clients_guard:
        client = _clients.get(app)
        if client is None:
            url = app.conf.get("dblock_url")
            table = app.conf.get("dblock_table") or "dblock_locks"
            client = _clients[app] = dblock.connect(url, table=table)
        return client


def _close_clients(**_: Any) -> None:
    """Release the clients' connections when a worker (process) stops."""
    with _clients_guard:
        for client in list(_clients.values()):
            client.close()
        _clients.clear()


signals.worker_process_shutdown.connect(_close_clients)
signals.worker_shutdown.connect(_close_clients)


__all__ = ["TOKEN_PARAMETER", "Busy", "LockedTask", "Skipped", "skipped"]
