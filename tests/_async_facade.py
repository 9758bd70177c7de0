"""A blocking facade over :class:`dblock.AsyncClient`, with the blocking client's surface.

The contract suite drives this facade in its ``[async]`` runs, so that every behaviour it
checks on the blocking client is checked, unchanged, on the async one. How it maps:

* one event loop runs on a background thread, shared by every facade of the process;
* each thread that calls a facade gets its own long-lived task on that loop (a *caller*),
  which runs that thread's calls in order: the async owner (the task) is the test's thread,
  so re-entrancy and ownership mean what the test means. A thread that ends ends its task;
  a new thread is a new task even if Python reuses the dead thread's id;
* attributes that depend on the owner (``held``, ``token``, ``owner``, ``lease_end``) are
  read in the caller's task too;
* functions given to ``locked``/``scheduled`` are sync: the async decorator gets an
  ``async def`` that hands the call back to the calling thread and, meanwhile, keeps serving
  that thread's calls in the same task (a body that uses the client is still the same owner);
* ``on_lost`` (a plain function) is called on the loop's thread with the facade's lock;
* exceptions are the async client's own objects, re-raised in the calling thread.

Closing a facade closes its client on the loop and ends its callers; :func:`shutdown` (after
each test) ends what is left, stops the loop's thread and reports tasks still running.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import contextvars
import functools
import queue
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import dblock

T = TypeVar("T")
#: how long closing waits for the loop (a loop frozen by a blocking driver must not hang
#: the test's teardown after pytest-timeout fired)
CLOSE_WAIT = 30.0
_CALLER: contextvars.ContextVar[_Caller] = contextvars.ContextVar("dblock_test_caller")


class _Loop:
    """The event loop on its background thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="dblock-test-loop", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Awaitable[T], wait: float | None = None) -> T:
        """Run ``coro`` in a task of its own and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(wait)  # type: ignore[arg-type]

    def on_loop(self) -> bool:
        return threading.current_thread() is self.thread

    def stop(self) -> list[str]:
        """Cancel what still runs, stop the loop and its thread; the tasks that were left."""
        try:
            left = self.submit(_cancel_all(), CLOSE_WAIT)
            self.submit(self.loop.shutdown_default_executor(), CLOSE_WAIT)
        except Exception as exc:
            left = [f"the loop did not answer: {exc!r}"]
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(CLOSE_WAIT)
        if self.thread.is_alive():
            return [*left, "the loop's thread did not stop"]
        self.loop.close()
        return left


async def _cancel_all() -> list[str]:
    """Cancel every task but this one; the ones that were not the facade's own callers."""
    current = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not current]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=5)
    return [repr(t) for t in tasks if t not in _CALLER_TASKS]


#: the tasks of callers (they run until their facade closes or their thread ends)
_CALLER_TASKS: weakref.WeakSet[asyncio.Task[None]] = weakref.WeakSet()


class _Process:
    """The process's loop (started by the first facade) and its facades still open."""

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.loop: _Loop | None = None
        self.open: set[Client] = set()

    def the_loop(self) -> _Loop:
        with self.mutex:
            if self.loop is None:
                self.loop = _Loop()
            return self.loop

    def shutdown(self) -> list[str]:
        with self.mutex:
            loop, self.loop = self.loop, None
            still_open = list(self.open)
        if loop is None:
            return []
        left = [f"{c!r} was not closed" for c in still_open]
        for client in still_open:
            try:
                client.close()
            except Exception as exc:
                left.append(f"closing {client!r} failed: {exc!r}")
        return left + loop.stop()


_PROCESS = _Process()


def shutdown() -> list[str]:
    """Close the facades still open, stop the loop's thread; what was left running (tasks
    that outlived their clients, facades nobody closed)."""
    return _PROCESS.shutdown()


atexit.register(shutdown)  # a worker process's loop ends with it


# -- a thread's task ------------------------------------------------------------------------
_Reply = queue.SimpleQueue[tuple[str, Any]]


class _Caller:
    """The task that runs one thread's calls, in order: that thread's owner on the loop."""

    def __init__(self, loop: _Loop) -> None:
        self.loop = loop
        self.inbox: asyncio.Queue[tuple[str, Any] | None] = asyncio.Queue()
        self.replies: list[_Reply] = []  # the calls being served, innermost last
        self.task = asyncio.get_running_loop().create_task(self._serve(), name="caller")
        _CALLER_TASKS.add(self.task)

    @classmethod
    async def start(cls, loop: _Loop) -> _Caller:
        return cls(loop)

    # -- the calling thread's side ----------------------------------------------------------
    def call(self, make: Callable[[], Awaitable[T]], wait: float | None = None) -> T:
        """Run ``make()`` in this caller's task; serve the bodies it hands back meanwhile."""
        reply: _Reply = queue.SimpleQueue()
        self._post(("call", (make, reply)))
        while True:
            kind, value = reply.get(timeout=wait)
            if kind == "ok":
                return value  # type: ignore[no-any-return]
            if kind == "error":
                raise value
            fn, args, kwargs = value  # "body": a decorated function's own code
            try:
                outcome = ("ok", fn(*args, **kwargs))
            except BaseException as exc:
                outcome = ("error", exc)
            self._post(("done", outcome))

    def _post(self, item: tuple[str, Any] | None) -> None:
        self.loop.loop.call_soon_threadsafe(self.inbox.put_nowait, item)

    def stop(self) -> None:
        """End the task once it is idle (from any thread; nothing if the loop is gone)."""
        if not self.loop.loop.is_closed():
            with contextlib.suppress(RuntimeError):  # closed meanwhile
                self._post(None)

    # -- the task's side --------------------------------------------------------------------
    async def _serve(self) -> None:
        _CALLER.set(self)
        while (item := await self.inbox.get()) is not None:
            await self._handle(item)

    async def _handle(self, item: tuple[str, Any]) -> None:
        kind, (make, reply) = item
        assert kind == "call", item
        self.replies.append(reply)
        try:
            value = await make()
        except BaseException as exc:
            reply.put(("error", exc))
            if isinstance(exc, asyncio.CancelledError):
                raise  # the caller is being ended (shutdown); the thread's next call makes one
        else:
            reply.put(("ok", value))
        finally:
            self.replies.pop()

    async def body(self, fn: Callable[..., T], args: Any, kwargs: Any) -> T:
        """Run ``fn`` in the calling thread; its calls meanwhile are served in this task."""
        self.replies[-1].put(("body", (fn, args, kwargs)))
        while True:
            item = await self.inbox.get()
            if item is None:  # stopped while a body runs: the thread died in it
                raise RuntimeError("the calling thread went away during a decorated call")
            kind, value = item
            if kind == "done":
                outcome, result = value
                if outcome == "error":
                    raise result
                return result  # type: ignore[no-any-return]
            await self._handle(item)


class _Seat:
    """What a thread's local storage keeps: when the thread ends, its caller stops."""

    def __init__(self, caller: _Caller) -> None:
        self.caller = caller
        weakref.finalize(self, caller.stop)


def _in_calling_thread(fn: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    """``fn`` as an ``async def`` for the async decorators: it runs in the calling thread."""

    @functools.wraps(fn)
    async def body(*args: Any, **kwargs: Any) -> T:
        return await _CALLER.get().body(fn, args, kwargs)

    return body


# -- the blocking surface -------------------------------------------------------------------
class Client:
    """``dblock.Client``'s surface over an :class:`dblock.AsyncClient` (see the module)."""

    def __init__(self, open_client: Callable[[], Awaitable[Any]]) -> None:
        self._loop = _PROCESS.the_loop()
        self._async = self._loop.submit(open_client())
        self._local = threading.local()
        self._callers: set[_Caller] = set()
        self._closed = False
        with _PROCESS.mutex:
            _PROCESS.open.add(self)

    # -- plumbing ---------------------------------------------------------------------------
    def _caller(self) -> _Caller:
        seat: _Seat | None = getattr(self._local, "seat", None)
        if seat is None or seat.caller.task.done():
            seat = _Seat(self._loop.submit(_Caller.start(self._loop)))
            self._local.seat = seat
            self._callers.add(seat.caller)
        return seat.caller

    def _call(self, make: Callable[[], Awaitable[T]], wait: float | None = None) -> T:
        if self._loop.on_loop():
            raise RuntimeError("the test facade was called on its own event loop's thread")
        return self._caller().call(make, wait)

    @property
    def _store(self) -> Any:  # tests/_internals.store_of
        return self._async._sync._store

    def run_green(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, blocking-style code of the client's (its store's operations), run
        as the async client runs it: in a greenlet of this thread's task."""
        from dblock._green import spawn

        return self._call(lambda: spawn(fn, *args))

    @property
    def async_client(self) -> Any:
        """The :class:`dblock.AsyncClient` behind the facade."""
        return self._async

    def __getattr__(self, name: str) -> Any:
        if name in ("url", "table", "dialect"):  # plain attributes: no I/O, no owner
            return getattr(self._async, name)
        raise AttributeError(name)

    # -- locks ------------------------------------------------------------------------------
    def lock(
        self, key: str, *, on_lost: Callable[[Lock], object] | None = None, **options: Any
    ) -> Lock:
        return Lock(self, lambda lost: self._async.lock(key, **options, on_lost=lost), on_lost)

    def lock_many(
        self, keys: Any, *, on_lost: Callable[[Lock], object] | None = None, **options: Any
    ) -> Lock:
        return Lock(
            self, lambda lost: self._async.lock_many(keys, **options, on_lost=lost), on_lost
        )

    def rwlock(self, key: str, *, ttl: float = 30.0, timeout: float | None = None) -> RWLock:
        return RWLock(self, self._async.rwlock(key, ttl=ttl, timeout=timeout))

    def election(
        self, name: str, *, on_lost: Callable[[Term], object] | None = None, **options: Any
    ) -> Election:
        return Election(self, name, on_lost, options)

    def semaphore(
        self, key: str, permits: int, *, ttl: float = 30.0, timeout: float | None = None
    ) -> Lock:
        made = self._async.semaphore(key, permits, ttl=ttl, timeout=timeout)
        return Lock(self, lambda _lost: made, None)

    # -- patterns ---------------------------------------------------------------------------
    def once(
        self, key: str, *, ttl: float = 30.0, note: str | None = None, auto_renew: bool = True
    ) -> Lock:
        made = self._async.once(key, ttl=ttl, note=note, auto_renew=auto_renew)
        return Lock(self, lambda _lost: made, None)

    def state(self, key: str) -> str | None:
        return self._call(lambda: self._async.state(key))

    def scheduled(
        self, name: str, at_most: float, at_least: float = 0.0
    ) -> Callable[[Callable[..., T]], Callable[..., T | None]]:
        return self._decorator(self._async.scheduled(name, at_most, at_least))

    def locked(
        self, template: str, **options: Any
    ) -> Callable[[Callable[..., T]], Callable[..., T]]:
        return self._decorator(self._async.locked(template, **options))

    def _decorator(self, decorate_async: Callable[..., Any]) -> Callable[..., Any]:
        """A sync decorator from the async client's one (which wants an ``async def``)."""

        def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
            run_async = decorate_async(_in_calling_thread(fn))

            @functools.wraps(fn)
            def run(*args: Any, **kwargs: Any) -> Any:
                return self._call(lambda: run_async(*args, **kwargs))

            return run

        return decorate

    # -- inspection and maintenance ---------------------------------------------------------
    def info(self, key: str) -> dblock.LockInfo | None:
        return self._call(lambda: self._async.info(key))

    def list(self, prefix: str = "") -> list[dblock.LockInfo]:
        return self._call(lambda: self._async.list(prefix))

    def force_release(self, key: str) -> bool:
        return self._call(lambda: self._async.force_release(key))

    def purge(self, older_than: float = 0.0, *, include_once: bool = False) -> int:
        return self._call(lambda: self._async.purge(older_than, include_once=include_once))

    # -- lifecycle --------------------------------------------------------------------------
    def close(self) -> None:
        """Close the async client on its loop and end this facade's callers. Idempotent.
        The loop keeps running (a closed client is still called, as in the async API) until
        :func:`shutdown`."""
        if self._closed:
            return
        self._closed = True
        try:
            self._call(self._async.close, CLOSE_WAIT)
        finally:
            for caller in list(self._callers):
                caller.stop()
            self._local = threading.local()
            with _PROCESS.mutex:
                _PROCESS.open.discard(self)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<async facade of {self._async!r}>"


class Lock:
    """``dblock.Lock``'s surface over an ``AsyncLock`` (also semaphores and once)."""

    def __init__(
        self,
        client: Client,
        make: Callable[[Callable[[Any], object] | None], Any],
        on_lost: Callable[[Lock], object] | None,
    ) -> None:
        if on_lost is not None and not callable(on_lost):
            raise TypeError("on_lost must be a callable taking the lock")
        self._client = client
        self._on_lost = on_lost
        self._async = make(None if on_lost is None else self._lost)

    def _lost(self, _async_lock: object) -> object:
        assert self._on_lost is not None
        return self._on_lost(self)  # the user's callback gets the lock it was given with

    def _read(self, name: str) -> Any:
        async def read() -> Any:  # in the caller's task: these are per owner
            return getattr(self._async, name)

        return self._client._call(read)

    def __getattr__(self, name: str) -> Any:
        if name in ("held", "token", "tokens", "owner", "lease_end"):  # per owner: in its task
            return self._read(name)
        if name in ("key", "keys", "ttl", "permits"):
            return getattr(self._async, name)
        raise AttributeError(name)

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        return self._client._call(lambda: self._async.acquire(blocking, timeout))

    def release(self) -> None:
        self._client._call(self._async.release)

    def renew(self, ttl: float | None = None) -> None:
        self._client._call(lambda: self._async.renew(ttl))

    def locked(self) -> bool:
        return self._client._call(self._async.locked)

    def __enter__(self) -> Lock:
        self._client._call(self._async.__aenter__)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._client._call(lambda: self._async.__aexit__(*exc_info))

    def __repr__(self) -> str:
        return f"<async facade of {self._async!r}>"


class RWLock:
    """``dblock.RWLock``'s surface over an ``AsyncRWLock``."""

    def __init__(self, client: Client, rwlock: Any) -> None:
        self._client = client
        self._async = rwlock
        self.key: str = rwlock.key

    def read_lock(self, *, on_lost: Callable[[Lock], object] | None = None, **kw: Any) -> Lock:
        return Lock(self._client, lambda lost: self._async.read_lock(on_lost=lost, **kw), on_lost)

    def write_lock(self, *, on_lost: Callable[[Lock], object] | None = None, **kw: Any) -> Lock:
        return Lock(self._client, lambda lost: self._async.write_lock(on_lost=lost, **kw), on_lost)


class _LostView:
    """A term's ``lost`` (an ``asyncio.Event``) as a ``threading.Event`` reads."""

    def __init__(self, event: asyncio.Event) -> None:
        self._event = event

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._event.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True


class Term:
    """``dblock.Term``'s surface over an ``AsyncTerm``."""

    def __init__(self, client: Client, term: Any) -> None:
        self._client = client
        self._async = term
        self.lost = _LostView(term.lost)

    def __getattr__(self, name: str) -> Any:
        if name in ("name", "token", "value", "leading", "lease_end"):
            return getattr(self._async, name)
        raise AttributeError(name)

    def proclaim(self, value: str | None) -> None:
        self._client._call(lambda: self._async.proclaim(value))

    def resign(self) -> None:
        self._client._call(self._async.resign)

    def __enter__(self) -> Term:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.resign()


class Election:
    """``dblock.Election``'s surface over an ``AsyncElection``."""

    def __init__(
        self,
        client: Client,
        name: str,
        on_lost: Callable[[Term], object] | None,
        options: dict[str, Any],
    ) -> None:
        if on_lost is not None and not callable(on_lost):
            raise TypeError("on_lost must be a callable taking the term")
        self._client = client
        self._on_lost = on_lost
        self._terms: dict[int, Term] = {}
        self._async = client._async.election(
            name, on_lost=None if on_lost is None else self._lost, **options
        )
        self.name: str = self._async.name

    def _lost(self, term: Any) -> object:
        assert self._on_lost is not None
        return self._on_lost(self._wrap(term))

    def _wrap(self, term: Any) -> Term:
        wrapped = self._terms.get(id(term))
        if wrapped is None:
            wrapped = self._terms[id(term)] = Term(self._client, term)
        return wrapped

    def campaign(self, value: str | None = None, timeout: float | None = None) -> Term:
        async def start() -> Any:
            return await self._async.campaign(value, timeout)

        return self._wrap(self._client._call(start))

    def leader(self) -> dblock.LeaderInfo | None:
        return self._client._call(self._async.leader)  # type: ignore[no-any-return]

    def observe(self) -> Iterator[dblock.LeaderInfo | None]:
        changes = self._async.observe()
        try:
            while True:
                yield self._client._call(changes.__anext__)
        finally:
            self._client._call(changes.aclose)


def connect(url: str | None = None, **options: Any) -> Client:
    """``dblock.connect``'s twin: a facade over ``await dblock.connect_async(url, ...)``."""
    return Client(lambda: dblock.connect_async(url, **options))
