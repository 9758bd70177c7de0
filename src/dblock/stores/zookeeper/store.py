"""ZooKeeper backend (kazoo): Apache Curator's lock recipes under the store contract.

Layout under ``/<chroot>/<table>``: one persistent node per key, ``k/<key, %-encoded>``,
whose children are the key's contenders, ephemeral sequential nodes named after their kind
and a random part, never reused (``lock-<12 hex>-<seq>``; kinds ``lock-``, ``write-``,
``read-``, ``sem-``, ``once-``; ``sched-`` nodes are persistent, so
that ``at_least`` outlives the process). Their data (JSON) holds the owner, the kind, the
lease in ms (``t``), whether the node holds (``h``; a fair waiter's queue entry does not yet)
and, for semaphores, the permits. The key node's child ``record`` is its ``once`` record
(P/F/S), changed only by a versioned ``set``. ``clock`` is a node written to read the server's time.

What a lock's holder proclaims (LeaderValues) is the persistent node ``v/<key, %-encoded>``:
its data is the value and the token of the hold that wrote it, counted only while that
token holds (a later hold has a larger czxid). It is not the hold node's data: a write there
would move the node's mtime (its lease) and version, which the holder's renewals and
release check against the version they last wrote.

Who holds (as in Curator's ``LockInternals``): contenders are ordered by their sequence
number; an exclusive node (lock, write, once, scheduled) holds when no live node is below
it; a read node when no live exclusive node is below it; a semaphore node when no live
non-semaphore node and fewer than ``permits`` semaphore nodes are below it. A waiter watches
only the node that blocks it (its predecessor), never polls.

Leases are on the server's clock: a node expires at its ``mtime`` (set by the server at each
write) plus its lease, or at ``u`` (scheduled's ``at_least``). A live node with an ephemeral
owner also ends with its holder's session. An expired node is deleted by the next contender
that sees it, with a versioned delete (a renewal in between keeps it). "Now" on the server
is the ``mtime`` of a write the operation makes anyway (its own node), or of ``clock``.

Fencing token = the hold node's ``czxid``: the zxid of the transaction that created it, which
the ensemble's leader assigns in strictly increasing order (the epoch in the high 32 bits
grows with every leader election; it is persisted in the transaction log, so it survives
restarts). Nodes are granted in sequence order, so a later grant has a larger czxid.

Every operation runs on kazoo's connection; for the async client, on a worker thread
(``rt.offload``), with waits on the loop (see docs/stores/zookeeper.md).
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Literal, TypeVar
from urllib.parse import quote, unquote

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    OperationTimeoutError,
    RolledBackError,
    RuntimeInconsistency,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState, ZnodeStat
from kazoo.retry import KazooRetry

from ... import _forksafe
from ..._contract import (
    FairManyKeys,
    FairQueue,
    LeaderPush,
    LeaderValues,
    Leading,
    LossPush,
    OnceRecords,
    QueueJoin,
    SharedHolds,
    Store,
    Subscription,
    Wakeups,
)
from ..._errors import BackendError, ConfigurationError
from ..._types import LockInfo
from ..._url import MAX_URL_TIMEOUT, DatabaseURL, url_number
from .handler import PollHandler
from .security import HELP, KazooLog, refused, security, stop_behind
from .security import PARAMS as SECURITY_PARAMS

T = TypeVar("T")
log = logging.getLogger("dblock")
PREFIX = {
    "lock": "lock-",
    "write": "write-",
    "read": "read-",
    "semaphore": "sem-",
    "once": "once-",
    "scheduled": "sched-",
}
EXCLUSIVE = frozenset({"lock", "write", "once", "scheduled"})
#: a waiter whose entry was written at most this long ago (s) takes its turn without a write
#: (``_turn``): well inside the engine's refresh of the entry (every 3 s)
TURN_AGE = 1.0
STATE = {"processing": "P", "failed": "F", "succeeded": "S"}
#: the child of a key node that holds its once-record (seen in the children list, so a
#: plain lock's try needs no extra read to know the key has none)
RECORD = "record"
STATE_NAME = {v: k for k, v in STATE.items()}
_PARAMS = ("session_timeout", "connect_timeout")
#: seconds to reach a server of the ensemble (kazoo tries them in turn until then)
CONNECT_TIMEOUT = 5.0
#: a request waits for its answer at most this many session timeouts (an operation retries a
#: lost connection for as long), then fails: the ensemble is out of reach
ANSWER_BOUND = 1.5
#: the longest pause between two reconnection attempts (s)
RECONNECT_MAX_PAUSE = 1.0
_TRANSIENT = (
    ConnectionLoss,
    ConnectionClosedError,
    OperationTimeoutError,
    SessionExpiredError,
    KazooTimeoutError,
)
#: the other operations' results in a multi that one operation failed
_ROLLED = RolledBackError | RuntimeInconsistency


@dataclass
class Node:
    """One contender of a key, as last read or written."""

    path: str
    data: dict[str, Any]
    stat: ZnodeStat
    key: str = ""
    #: local monotonic time at which our last write of it was sent (None: not written by us)
    sent: float | None = None
    #: a live node below blocks it: it is a queue entry, whose lease is the queue's (``q``)
    waiting: bool = False

    def surely_live(self) -> bool:
        """Its lease cannot have ended yet: the server wrote it after ``sent``, so less time
        has passed on its clock than here (a margin covers clock rates)."""
        if self.sent is None or "u" in self.data:
            return False
        left = int(self.data.get("t", 0)) / 1000 - (time.monotonic() - self.sent)
        return left > 0.05 + 0.01 * int(self.data.get("t", 0)) / 1000

    @property
    def seq(self) -> int:
        return int(self.path[-10:])

    @property
    def kind(self) -> str:
        return str(self.data.get("k", "lock"))

    @property
    def owner(self) -> str:
        return str(self.data.get("o", ""))

    @property
    def token(self) -> int:
        return int(self.stat.czxid)

    @property
    def expires(self) -> int:
        """The lease's end, server ms."""
        return self.lease_end(waiting=self.waiting)

    def lease_end(self, *, waiting: bool) -> int:
        """The lease's end (server ms) if it waits (``q``) or holds (``t``)."""
        if "u" in self.data:
            return int(self.data["u"])
        lease = self.data["q"] if waiting and "q" in self.data else self.data.get("t", 0)
        return int(self.stat.mtime) + int(lease)


@dataclass
class Look:
    """A key's contenders, and the server's time they were judged at."""

    now: int
    live: list[Node] = field(default_factory=list)
    #: the key's once-record: a key that has one is taken only by once()
    record: dict[str, Any] = field(default_factory=dict)
    #: the node whose read set the waiter's watch (see ``_look``'s ``watch``)
    watched: str | None = None

    def blocker(self, me: Node) -> Node | None:
        """The live node that keeps ``me`` from holding (its predecessor), or None."""
        below = [n for n in self.live if n.seq < me.seq]
        if me.kind in EXCLUSIVE:
            return below[-1] if below else None
        if me.kind == "read":
            return next((n for n in reversed(below) if n.kind != "read"), None)
        others = [n for n in below if n.kind != "semaphore"]
        if others:
            return others[-1]
        sems = [n for n in below if n.kind == "semaphore"]
        permits = int(me.data.get("p", 1))
        return sems[-permits] if len(sems) >= permits else None

    def kept_from(self, me: Node) -> bool:
        """The key's once-record keeps ``me`` (not a once claim) from it, whatever holds."""
        return bool(self.record) and me.kind != "once"

    def holders(self) -> list[Node]:
        return [
            n
            for n in self.live
            if n.data.get("h") and self.blocker(n) is None and not self.kept_from(n)
        ]


@dataclass
class Below:
    """What lies below a many-waiter's entries (``_below_many``)."""

    #: the server's time they were judged at (a lower bound of it, for an estimate)
    now: int
    #: each key's live nodes below its entry, ascending
    live: dict[str, list[Node]]
    #: the keys with a once-record (which keeps a lock from them)
    kept: list[str]
    #: the nodes read with the subscription's watch
    watched: set[str]

    def split(self, owner: str) -> tuple[list[Node], dict[str, Node]]:
        """``owner``'s own lock nodes below its entries (left by a try whose reply was lost:
        replaced), and on each key where another's live node is below, the nearest one."""
        own: list[Node] = []
        blockers: dict[str, Node] = {}
        for key, nodes in self.live.items():
            for n in nodes:
                if n.owner == owner and n.kind == "lock":
                    own.append(n)
                else:
                    blockers[key] = n  # ascending: the last is the nearest
        return own, blockers


@dataclass
class Waits:
    """A many-waiter's entries, one per key, made by one multi."""

    keys: tuple[str, ...]
    #: the random part of their names, which they share: a retry after a lost reply, or a
    #: waiter leaving after an interrupted ``enqueue_many``, finds them by it
    tag: str
    #: each key's entry, as last written (empty while the multi's outcome is unknown)
    nodes: dict[str, Node] = field(default_factory=dict)
    #: the owner's earlier entries, which the multi deletes (else ``dequeue_many`` does)
    stale: list[str] = field(default_factory=list)


def _sole(
    below: list[str], blocker: Node | Literal[False] | None, record: dict[str, Any]
) -> str | None:
    """The blocker's path if it is the only node below the waiter's and a plain lock's,
    with no once-record: once it goes, nothing is below (nodes below only go, and a lock's
    holder never makes a record), so the waiter holds without reading the children again."""
    if blocker and below == [blocker.path] and blocker.kind == "lock" and not record:
        return blocker.path
    return None


def _failure(result: object) -> BaseException | None:
    """A multi's result for one operation, if it is what failed the multi."""
    if isinstance(result, BaseException) and not isinstance(result, _ROLLED):
        return result
    return None


def _seq(name: str) -> int:
    return int(name[-10:])


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _made(mtime: int) -> ZnodeStat:
    """The stat of a node a multi just made at the server's time ``mtime`` (a multi's create
    answers with the path alone): version 0; its czxid, the token, is read when it holds."""
    return ZnodeStat(0, 0, mtime, mtime, 0, 0, 0, 0, 0, 0, 0)


def _when(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


def _encode(key: str) -> str:
    # a node name may not contain '/', be '.' or '..': %-encode all but a safe set
    return quote(key, safe="-_~:@!$&'()*+,;=").replace(".", "%2E")


def _data(owner: str, kind: str, ttl: float, **extra: int) -> dict[str, Any]:
    return {"o": owner, "k": kind, "t": _ms(ttl), **extra}


def _dump(data: dict[str, Any]) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()


def _load(raw: bytes) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class _BlockerWatch(Subscription):
    """Wakes when a node that blocks the waiter changes or goes, or at its lease's end."""

    live = True
    targeted = True
    latched = True

    def __init__(self, store: ZookeeperStore, owner: str) -> None:
        self._store = store
        self.owner = owner
        self.event = store.rt.event()
        #: local monotonic time at which a blocker's lease ends (wake to take it over)
        self.until: float | None = None
        #: woken by ``until``: the next try reads the server's time (a write) to judge it
        self.due = False
        self.closed = False

    def fire(self, _event: object = None) -> None:
        self.event.set()

    def watches(self, path: str) -> bool:
        """``path`` is a node that blocks the waiter now (others' events are stale)."""
        raise NotImplementedError

    def went(self, path: str, deleted: bool) -> None:
        """A watched node went (or its watch ended otherwise): before the wake-up."""

    def blocker_changed(self, event: Any) -> None:
        """A watch on a blocking node fired: it went (wake), or its data changed (a
        renewal: watch on)."""
        path = getattr(event, "path", None)
        if self.closed or path is None or not self.watches(path):
            return
        if getattr(event, "type", None) != "CHANGED":
            self.went(path, getattr(event, "type", None) == "DELETED")
            self.fire()
            return
        with contextlib.suppress(Exception):  # the client closed: nothing to watch
            result = self._store._client().exists_async(path, watch=self.blocker_changed)
            result.rawlink(lambda r: self.fire() if r.exception or r.value is None else None)

    def wait(self, timeout: float) -> bool:
        if self.until is not None:
            timeout = max(0.0, min(timeout, self.until - time.monotonic()))
        woken = self.event.wait(timeout)
        self.event.clear()
        self.due = self.until is not None and time.monotonic() >= self.until
        return woken or self.due


class ZkSubscription(_BlockerWatch):
    """A waiter for one key: watches the one node that blocks it (its predecessor)."""

    def __init__(self, store: ZookeeperStore, key: str, owner: str) -> None:
        super().__init__(store, owner)
        self.key = key
        #: the node that blocks the waiter, whose watch wakes it
        self.watching: str | None = None
        #: the blocker, when it was the only node below the waiter's and a plain lock's (it
        #: never makes a once-record): its deletion leaves nothing below, so the waiter is
        #: at the head without reading the children again (nodes below only go)
        self.sole: str | None = None
        #: ``sole`` went: the next try knows nothing is below
        self.at_head = False

    def watches(self, path: str) -> bool:
        return path == self.watching

    def went(self, path: str, deleted: bool) -> None:
        self.at_head = deleted and path == self.sole

    def took_head(self) -> bool:
        """Whether ``sole`` went since the waiter last looked (told once). Not when a lease's
        end woke it (``due``): that try reads the server's time and looks."""
        head, self.at_head = self.at_head and not self.due, False
        return head

    def close(self) -> None:
        self.closed = True
        self._store._subs.pop((self.key, self.owner), None)


class ZkManySubscription(_BlockerWatch):
    """A waiter for several keys (``subscribe_many``): watches, on each key where something
    blocks its entry, the nearest such node below the entry; never granted a hold."""

    def __init__(self, store: ZookeeperStore, owner: str) -> None:
        super().__init__(store, owner)
        #: the nodes that block the waiter's entries (one per blocked key)
        self.watching: set[str] = set()

    def watches(self, path: str) -> bool:
        return path in self.watching

    def close(self) -> None:
        self.closed = True
        if self._store._many_subs.get(self.owner) is self:
            del self._store._many_subs[self.owner]


class LeaderWatch:
    """An observer's watches of one key (LeaderPush): the key node's children (a node made or
    deleted: a grant, a release, a force-release, an expired node cleared away) and the value
    node (made, written, deleted: a proclaim). ZooKeeper's watches fire once: each event calls
    ``heard`` and sets its watch again, from kazoo's thread, with asynchronous calls only. A
    key node not made yet is watched for its creation, then for its children. kazoo drops
    every watch when its connection drops (telling each with an event of type NONE): they
    are set again once it is back (``state_changed``)."""

    def __init__(self, store: ZookeeperStore, key: str, heard: Callable[[], None]) -> None:
        self._store = store
        self._kpath = store._kpath(key)
        self._vpath = store._vpath(key)
        self._heard = heard
        self.stopped = False

    def arm(self, zk: KazooClient) -> None:
        """Set both watches (kazoo keeps one of each per callable: setting one twice is one)."""
        self._watch_children(zk)
        zk.exists_async(self._vpath, watch=self._value_fired)

    def _watch_children(self, zk: KazooClient) -> None:
        zk.get_children_async(self._kpath, watch=self._children_fired).rawlink(
            lambda result: self._children_read(zk, result)
        )

    def _children_read(self, zk: KazooClient, result: Any) -> None:
        if self.stopped or result.successful() or not isinstance(result.exception, NoNodeError):
            return  # watching; or the connection dropped (set again once it is back)
        # no key node yet: its creation is watched (or, made meanwhile, its children)
        zk.exists_async(self._kpath, watch=self._children_fired).rawlink(
            lambda found: self._exists_read(zk, found)
        )

    def _exists_read(self, zk: KazooClient, result: Any) -> None:
        if not self.stopped and result.successful() and result.value is not None:
            self._watch_children(zk)

    def _fired(self, event: Any) -> KazooClient | None:
        """Tell the observer; the client to set the watch again with (None once stopped or
        closed, or when kazoo dropped the watch with the connection)."""
        if self.stopped:
            return None
        self._tell()
        return None if getattr(event, "type", None) == "NONE" else self._store._zk

    def _children_fired(self, event: Any) -> None:
        zk = self._fired(event)
        if zk is not None:
            with contextlib.suppress(Exception):  # closed meanwhile: nothing to watch
                self._watch_children(zk)

    def _value_fired(self, event: Any) -> None:
        zk = self._fired(event)
        if zk is not None:
            with contextlib.suppress(Exception):
                zk.exists_async(self._vpath, watch=self._value_fired)

    def state_changed(self, state: str) -> None:
        """kazoo's connection thread: back (the watches were dropped: set them again, and
        look, something may have changed meanwhile), or dropped (look: the read fails, and
        the observer retries until it is back)."""
        if self.stopped:
            return
        zk = self._store._zk
        if state == KazooState.CONNECTED and zk is not None:
            with contextlib.suppress(Exception):
                self.arm(zk)
        self._tell()

    def _tell(self) -> None:
        try:
            self._heard()
        except Exception:  # an observer's failure must not stop kazoo's thread
            log.exception("dblock leader watch of %r failed", self._kpath)

    def stop(self) -> None:
        """Stop telling (ZooKeeper cannot take a watch back: it fires once more, unheard)."""
        self.stopped = True
        self._store._leader_watches.discard(self)


class ZookeeperStore(
    Store,
    FairQueue,
    SharedHolds,
    OnceRecords,
    Wakeups,
    QueueJoin,
    LossPush,
    FairManyKeys,
    LeaderValues,
    LeaderPush,
):
    """Locks in a ZooKeeper ensemble, under ``/<chroot>/<table>``."""

    name = dialect = "zookeeper"
    #: acquire_many's largest multi (per key a create, a set and maybe a delete: paths of
    #: up to ~3 KB for a 255-character key %-encoded, data, ACLs; ~10 KB) stays well under
    #: the server's request limit (``jute.maxbuffer``, 1 MB by default)
    max_keys = 64

    def __init__(self, url: DatabaseURL, schema: str | None, table: str) -> None:
        self.table = f"{schema}.{table}" if schema else table
        self.safe_url = url.safe
        unknown = sorted(set(url.query) - set(_PARAMS) - SECURITY_PARAMS)
        if unknown:
            raise ConfigurationError(
                f"unknown ZooKeeper URL parameter(s) {unknown} in {url.safe!r}; supported: "
                f"session_timeout (s, the session the holds live in), connect_timeout (s), {HELP}"
            )
        self.security = security(url)
        self._secrets = url.secrets
        self._log = KazooLog(url.secrets)

        def number(name: str, default: float, lo: float) -> float:
            return url_number(
                url.query.get(name),
                name,
                default,
                safe=url.safe,
                minimum=lo,
                maximum=MAX_URL_TIMEOUT,
            )

        self.session_timeout = number("session_timeout", 10.0, 1.0)
        self.connect_timeout = number("connect_timeout", CONNECT_TIMEOUT, 0.001)
        self.hosts = url.host or ""
        chroot = f"/{url.database}" if url.database else ""
        self.base = f"{chroot}/{_encode(self.table)}"
        self.keys = f"{self.base}/k"
        self.clock = f"{self.base}/clock"
        self.values = f"{self.base}/v"
        self._zk: KazooClient | None = None
        self._pid = _forksafe.pid()
        self._lock = _forksafe.lock()
        self._closed = False
        #: this client's own nodes: (key, owner, token) -> node; (key, owner) -> latest
        self._mine: dict[tuple[str, str, int], Node] = {}
        self._latest: dict[tuple[str, str], Node] = {}
        #: queue entries of fair waiters: (key, owner) -> node
        self._queued: dict[tuple[str, str], Node] = {}
        #: turns taken without a write (``_turn``), until their waiter takes or leaves them
        self._turns: dict[tuple[str, str], Node] = {}
        self._subs: dict[tuple[str, str], ZkSubscription] = {}
        #: many-waiters' entries (``enqueue_many``) and subscriptions, by owner
        self._waits: dict[str, Waits] = {}
        self._many_subs: dict[str, ZkManySubscription] = {}
        self._losses: dict[str, Callable[[], None]] = {}
        #: observers' watches of keys' holds and values (LeaderPush)
        self._leader_watches: set[LeaderWatch] = set()

    # -- connection, errors ---------------------------------------------------------------
    def _client(self) -> KazooClient:
        with self._lock:
            if self._closed:
                raise BackendError(f"the ZooKeeper client of {self.safe_url} is closed")
            if self._pid != _forksafe.pid():
                # Forked: the parent's session and threads are not ours. Forget them without
                # closing, as closing would end the parent's session (and its holds).
                self._zk, self._pid = None, _forksafe.pid()
                self._queued.clear()
                self._turns.clear()
                self._subs.clear()
                self._waits.clear()
                self._many_subs.clear()
                self._losses.clear()
                self._leader_watches.clear()
            if self._zk is None:
                handler = PollHandler(answer_bound=ANSWER_BOUND * self.session_timeout)
                zk = KazooClient(
                    hosts=self.hosts,
                    timeout=self.session_timeout,
                    handler=handler,
                    # kazoo's default doubles its pause between reconnections up to an hour:
                    # after a 40 s outage it came back 20 s after the ensemble did
                    connection_retry=KazooRetry(
                        max_tries=-1, max_delay=RECONNECT_MAX_PAUSE, sleep_func=handler.sleep_func
                    ),
                    logger=self._log,
                    **self.security.kazoo,
                )
                try:
                    # not zk.start(): at its timeout it waits for kazoo's connection thread,
                    # which a server that accepts and never answers keeps for a whole session
                    # timeout; stop_behind lets that thread end on its own
                    zk.start_async().wait(self.connect_timeout)
                except BaseException:
                    stop_behind(zk)
                    raise
                if not zk.connected:
                    stop_behind(zk)
                    timeout = KazooTimeoutError("Connection time-out")
                    raise self._unreached(timeout) from timeout
                zk.add_listener(self._state_changed)
                self._zk = zk
            return self._zk

    def _unreached(self, exc: BaseException) -> ConfigurationError | BackendError:
        """The one error for a connection that did not come up: kazoo's last attempt's
        failure says why (a TLS failure is a setting to fix, not an outage to wait out)."""
        last = self._log.last or str(exc)
        where = f"ZooKeeper at {self.safe_url} within {self.connect_timeout:g} s"
        if self._log.tls_failed:
            return ConfigurationError(
                f"TLS with {where} failed: {last}; check ca=, certfile= and keyfile= "
                "(and that the port is the ensemble's secureClientPort)"
            )
        return BackendError(f"could not connect to {where}: {last}; check that it runs")

    def _state_changed(self, state: str) -> None:
        """SUSPENDED: nothing yet (the session may live on); LOST: every hold of the session
        is gone, tell the holders; a reconnect: waiters look again (a watch may be lost)."""
        if state == KazooState.LOST:
            for heard in list(self._losses.values()):
                heard()
        for sub in [*self._subs.values(), *self._many_subs.values()]:
            sub.fire()
        for watch in list(self._leader_watches):
            watch.state_changed(state)

    def _run(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(zk, *args)`` (on a worker thread for the async client), its errors wrapped.

        A lost connection (a leader election, a server gone) is retried while the session
        may still live: kazoo reconnects to another server meanwhile. Each operation is safe
        to repeat (see _write; a sequential node left by a lost reply is found by its owner's
        next try, or ends with its lease)."""

        def attempt() -> T:
            return fn(self._client(), *args)

        deadline = time.monotonic() + ANSWER_BOUND * self.session_timeout
        pause = 0.05
        while True:
            try:
                return self.rt.offload(attempt) if self.offloads else attempt()
            except _TRANSIENT as exc:
                if time.monotonic() + pause > deadline:
                    self._end_unreachable_session()
                    raise self._failed(what, exc) from exc
            except NoAuthError as exc:
                where = f"{self.safe_url} (table {self.table})"
                raise refused(exc, what, where, self.security, self._secrets) from exc
            except (KazooException, KazooTimeoutError) as exc:
                raise self._failed(what, exc) from exc
            self.rt.sleep(pause)
            pause = min(1.0, pause * 2)

    def _end_unreachable_session(self) -> None:
        """A request outlived its bound and the ensemble is still out of reach: end this
        client's session here, as Curator reports a session lost after its timeout without a
        connection. Requests kazoo still queues for it are then never sent (an acquire sent on
        reconnection would create a node nobody waits for), and every hold of the session is
        reported lost; the next operation opens a new session."""
        with self._lock:
            zk = self._zk
            if zk is None or zk.connected or self._pid != _forksafe.pid():
                return
            self._zk = None
            zk.remove_listener(self._state_changed)  # its stop would report LOST as well
        stop_behind(zk)
        log.debug("dblock: ZooKeeper session given up after its requests' bound")
        self._state_changed(KazooState.LOST)

    def _failed(self, what: str, exc: BaseException) -> BackendError:
        return BackendError(
            f"ZooKeeper at {self.safe_url} failed during {what} (table {self.table}): "
            f"{type(exc).__name__} {exc}; check that the ensemble is reachable"
        )

    def close(self) -> None:
        with self._lock:
            self._closed = True
            zk, self._zk = self._zk, None
        if zk is not None and self._pid == _forksafe.pid():
            with contextlib.suppress(Exception):
                zk.stop()
                zk.close()

    # -- helpers (run inside _run) ----------------------------------------------------------
    def _kpath(self, key: str) -> str:
        return f"{self.keys}/{_encode(key)}"

    def _now(self, zk: KazooClient) -> int:
        """The server's time (ms): the mtime of a write to the clock node."""
        try:
            return int(zk.set(self.clock, b"").mtime)
        except NoNodeError:
            zk.ensure_path(self.clock)
            return int(zk.set(self.clock, b"").mtime)

    def _look(
        self,
        zk: KazooClient,
        key: str,
        now: int | None,
        below: int | None = None,
        *,
        estimate: bool = False,
        nearest: bool = False,
        watch: ZkSubscription | None = None,
        names: Sequence[str] | None = None,
    ) -> Look:
        """Read the key's contenders (only those whose sequence number is under ``below``, if
        given: all that can block that node); delete the expired ones (versioned).

        ``nearest`` (an exclusive node's try, ``below`` given): only what blocks it, the
        nearest live node below, is read (Curator's way: one read, not one per waiter ahead);
        ``live`` then holds that node alone. ``watch``: the waiter whose watch that read sets
        (as Curator's, it saves a separate ``exists``). ``names``: the key's children, if
        just read."""
        kpath = self._kpath(key)
        names = self._children(zk, kpath) if names is None else names
        record = self._record(zk, key)[0] if RECORD in names else {}
        names = [n for n in names if n != RECORD]
        if below is not None:
            names = [n for n in names if int(n[-10:]) < below]
            if nearest and now is not None:
                paths = [f"{kpath}/{n}" for n in sorted(names, key=lambda n: n[-10:])]
                clock = [now]
                found = self._nearest(zk, key, paths, clock, estimate=estimate, sub=watch)
                if watch is not None:
                    watch.sole, watch.at_head = _sole(paths, found, record), False
                if found is not False:
                    look = Look(
                        clock[0], record=record, watched=paths[-1] if watch and paths else None
                    )
                    look.live.extend([found] if found is not None else [])
                    return look
        pending = [(f"{kpath}/{n}", zk.get_async(f"{kpath}/{n}")) for n in names]
        nodes: list[Node] = []
        for path, result in pending:
            try:
                raw, stat = result.get()
            except NoNodeError:
                continue
            nodes.append(Node(path, _load(raw), stat, key))
        nodes.sort(key=lambda n: n.seq)
        if now is None:
            now = self._now(zk) if nodes else 0
        elif estimate:  # ``now`` is a lower bound: so is every mtime read
            now = max([now, *(int(n.stat.mtime) for n in nodes)])
        return self._judge(zk, Look(now, record=record), nodes)

    @staticmethod
    def _judge(zk: KazooClient, look: Look, nodes: list[Node]) -> Look:
        """``look`` with the live ones of ``nodes`` (ascending), the expired deleted."""
        for n in nodes:
            # blocked now means it never held (nodes below it only go): a queue entry
            n.waiting = look.blocker(n) is not None
            if n.expires <= look.now:
                with contextlib.suppress(NoNodeError, BadVersionError):
                    zk.delete(n.path, version=n.stat.version)
                    continue  # deleted: it no longer blocks anyone
                if not zk.exists(n.path):
                    continue
            look.live.append(n)
        return look

    @staticmethod
    def _children(zk: KazooClient, kpath: str) -> list[str]:
        """The children of ``kpath`` ([] if it does not exist)."""
        try:
            names: list[str] = zk.get_children(kpath)
        except NoNodeError:
            return []
        return names

    def _nearest(
        self,
        zk: KazooClient,
        key: str,
        paths: list[str],
        now: list[int],
        *,
        estimate: bool,
        sub: ZkSubscription | None = None,
    ) -> Node | Literal[False] | None:
        """The live node nearest the end of ``paths`` (ascending), deleting expired ones met
        on the way; False where that cannot be judged from exclusive nodes alone.

        A node's lease is ``t`` once it holds and ``q`` while it waits: when those disagree
        about whether it has ended, the live node below it (if any) says which applies."""
        for i in range(len(paths) - 1, -1, -1):
            watch = None
            if sub is not None and i == len(paths) - 1:  # most likely the blocker: watch it
                sub.watching, watch = paths[i], sub.blocker_changed
            try:
                raw, stat = zk.get(paths[i], watch=watch)
            except NoNodeError:
                continue
            n = Node(paths[i], _load(raw), stat, key)
            if estimate:  # ``now`` is a lower bound: so is every mtime read
                now[0] = max(now[0], int(stat.mtime))
            held_end, queued_end = n.lease_end(waiting=False), n.lease_end(waiting=True)
            if (held_end > now[0]) == (queued_end > now[0]):
                n.waiting = queued_end < held_end  # either way; wake at the earlier end
                alive = held_end > now[0]
            elif n.kind not in EXCLUSIVE:
                return False
            else:
                below = self._nearest(zk, key, paths[:i], now, estimate=estimate, sub=None)
                if below is False:
                    return False
                n.waiting = below is not None
                alive = n.expires > now[0]
            if alive:
                return n
            if sub is not None and sub.watching == n.path:
                sub.watching = None  # our delete's event wakes nobody
            with contextlib.suppress(NoNodeError, BadVersionError):
                zk.delete(n.path, version=n.stat.version)
                continue  # deleted: it no longer blocks anyone
            if zk.exists(n.path):
                return n  # written meanwhile (renewed): live
        return None

    def _create(
        self, zk: KazooClient, key: str, data: dict[str, Any]
    ) -> tuple[Node, Sequence[str] | None]:
        """A new contender of ``key`` (data: owner ``o``, kind ``k``, lease ``t``, ...), and
        the key's children read right behind the create, in the same round trip: a session's
        requests are answered in the order sent, so the list holds the new node (None if it
        could not be read that way; ``_look`` then reads it)."""
        kind = str(data["k"])
        kpath = self._kpath(key)
        sent = time.monotonic()
        created = zk.create_async(
            # a random part, as Curator's protected mode has: a purge may delete the key node
            # and its sequence restarts with the next, so a sequence number alone would name
            # a later contender's node, and a stale release or renewal would hit it
            f"{kpath}/{PREFIX[kind]}{secrets.token_hex(6)}-",
            _dump(data),
            ephemeral=kind != "scheduled",
            sequence=True,
            makepath=True,
            include_data=True,
        )
        listed = zk.get_children_async(kpath)
        path, stat = created.get()
        # read without raising: a raised error would keep, in its traceback, the frames of
        # this call and its callers (a lock's hold among their locals) in a cycle with the
        # result that keeps it, which only the cycle collector frees, and a key node made by
        # this create (after the read) is the common case
        listed.wait()
        names: Sequence[str] | None = None
        if listed.successful():
            names = listed.value
        elif not isinstance(listed.exception, NoNodeError):
            listed.get()  # raises it
        if names is not None and path.rsplit("/", 1)[1] not in names:
            names = None  # not read behind the create (never expected): read again
        return Node(path, data, stat, key, sent), names

    def _arm(self, zk: KazooClient, key: str, owner: str, look: Look, me: Node | None) -> None:
        """Point the waiter's subscription at what blocks it now: a watch on that node alone
        (its deletion wakes the waiter; a change of its data, a renewal, only moves the
        watch), and a wake-up at its lease's end."""
        sub = self._subs.get((key, owner))
        if sub is None:
            return
        if me is not None:
            blocker = look.blocker(me)
        else:
            blocker = next(iter(look.holders() or look.live), None)
        if blocker is None:
            sub.until = None
            sub.watching = None
            if me is not None and not look.kept_from(me):
                sub.fire()  # nothing blocks it now: try again at once
            else:
                zk.get_children_async(self._kpath(key), watch=sub.fire)
            return
        until = time.monotonic() + max(0, blocker.expires - look.now) / 1000 + 0.01
        path = blocker.path
        if sub.due or sub.until is None or path != sub.watching:
            sub.until = until
        else:
            # ``look.now`` was an estimate (an earlier mtime), which puts the lease's end
            # later than it is: a waiter that looked again before its wake-up (the engine's
            # own recheck) must not push that wake-up back each time
            sub.until = min(sub.until, until)
        if look.watched == path == sub.watching:
            return  # the look's read of it set the watch
        sub.watching = path
        if zk.exists(path, watch=sub.blocker_changed) is None:
            sub.fire()  # gone since we looked (its watch would wait for a re-creation)

    def _take(self, zk: KazooClient, me: Node, look: Look) -> int | None:
        """``me`` holds if nothing blocks it; else it leaves (a try that failed)."""
        if look.blocker(me) is None and not look.kept_from(me):
            self._remember(me)
            return me.token
        with contextlib.suppress(NoNodeError):
            zk.delete(me.path)
        self._arm(zk, me.key, me.owner, look, None)
        return None

    def _remember(self, node: Node) -> None:
        self._mine[(node.key, node.owner, node.token)] = node
        self._latest[(node.key, node.owner)] = node

    def _forget(self, node: Node) -> None:
        self._mine.pop((node.key, node.owner, node.token), None)
        if self._latest.get((node.key, node.owner)) is node:
            del self._latest[(node.key, node.owner)]
        self._losses.pop(node.path, None)

    def _own(self, zk: KazooClient, key: str, owner: str, token: int) -> Node | None:
        node = self._mine.get((key, owner, token))
        if node is not None:
            return node
        kpath = self._kpath(key)
        for name in self._children(zk, kpath):
            if name == RECORD:
                continue
            with contextlib.suppress(NoNodeError):
                raw, stat = zk.get(f"{kpath}/{name}")
                found = Node(f"{kpath}/{name}", _load(raw), stat, key)
                if found.owner == owner and found.token == token and found.data.get("h"):
                    return found
        return None

    def _write(self, zk: KazooClient, node: Node, data: dict[str, Any]) -> Node | None:
        """Write our node's data (versioned); the new node, or None if it had expired or
        was gone (then it is deleted: it was ours)."""
        sent = time.monotonic()
        try:
            stat = zk.set(node.path, _dump(data), version=node.stat.version)
        except BadVersionError:
            stat = self._written(zk, node, data)  # a retry, after a reply was lost?
            if stat is None:
                self._forget(node)
                return None
        except NoNodeError:
            self._forget(node)
            return None
        if node.expires <= stat.mtime:
            with contextlib.suppress(NoNodeError, BadVersionError):
                zk.delete(node.path, version=stat.version)
            self._forget(node)
            return None
        return replace(node, data=data, stat=stat, sent=sent)

    def _record(self, zk: KazooClient, key: str) -> tuple[dict[str, Any], int]:
        """The key's once-record and its version (-1: it has none)."""
        try:
            raw, stat = zk.get(f"{self._kpath(key)}/{RECORD}")
        except NoNodeError:
            return {}, -1
        return _load(raw), int(stat.version)

    @staticmethod
    def _written(zk: KazooClient, node: Node, data: dict[str, Any]) -> ZnodeStat | None:
        """The node's stat if it holds ``data`` one version on (our write whose reply was
        lost); None if someone else's write came between."""
        try:
            raw, stat = zk.get(node.path)
        except NoNodeError:
            return None
        if stat.version == node.stat.version + 1 and _load(raw) == data:
            return stat
        return None

    # -- Store --------------------------------------------------------------------------------
    def ensure_schema(self, create: bool) -> None:
        def ensure(zk: KazooClient) -> None:
            if create:
                zk.ensure_path(self.keys)
                zk.ensure_path(self.clock)
                if self.security.identity:
                    # a table whose ACL shuts this identity out (a wrong password) says so
                    # here, not at the first lock; exists() above needs no permission
                    zk.get_acls(self.keys)
            elif zk.exists(self.keys) is None:
                raise ConfigurationError(
                    f"the lock table {self.table} ({self.base}) does not exist in "
                    f"{self.safe_url}; it is created by connect(create_schema=True) and by the "
                    "dblock commands that take locks (run, once); ZooKeeper has no "
                    "`dblock schema` to apply"
                )

        self._run("creating the lock table", ensure)

    def acquire(self, key: str, owner: str, ttl: float, kind: str) -> int | None:
        tries = 0

        def go(zk: KazooClient) -> int | None:
            nonlocal tries
            tries += 1
            me, names = self._create(zk, key, _data(owner, kind, ttl, h=1))
            # a retry reads every node below: ours from a try whose reply was lost among them
            nearest = tries == 1 and kind in EXCLUSIVE
            look = self._look(zk, key, me.stat.ctime, me.seq, nearest=nearest, names=names)
            for n in list(look.live):  # our own earlier grant (a reply lost before a retry)
                if n.seq < me.seq and n.owner == owner and n.kind == kind and n.data.get("h"):
                    with contextlib.suppress(NoNodeError, BadVersionError):
                        zk.delete(n.path, version=n.stat.version)
                        look.live.remove(n)
            return self._take(zk, me, look)

        return self._run("acquire", go)

    def renew(self, key: str, owner: str, token: int, ttl: float) -> bool:
        def go(zk: KazooClient) -> bool:
            node = self._own(zk, key, owner, token)
            if node is None:
                return False
            data = {k: v for k, v in node.data.items() if k != "u"}
            renewed = self._write(zk, node, {**data, "t": _ms(ttl)})
            if renewed is not None:
                self._remember(renewed)
            return renewed is not None

        return self._run("renew", go)

    def release(self, key: str, owner: str, token: int) -> bool:
        self._turns.pop((key, owner), None)

        def go(zk: KazooClient) -> bool:
            node = self._own(zk, key, owner, token)
            if node is None:
                return False
            self._forget(node)
            if node.surely_live():  # no need to read the server's time: just delete it
                try:
                    zk.delete(node.path, version=node.stat.version)
                except (NoNodeError, BadVersionError):
                    return False
                return True
            tx = zk.transaction()
            tx.set_data(node.path, _dump(node.data), version=node.stat.version)
            tx.delete(node.path, version=node.stat.version + 1)
            stat, _ = tx.commit()
            if isinstance(stat, Exception):
                return False
            return bool(node.expires > stat.mtime)

        return self._run("release", go)

    def info(self, key: str) -> LockInfo | None:
        found = self._run("info", lambda zk: self._infos(zk, key))
        return found[0] if found else None

    def _infos(self, zk: KazooClient, key: str) -> list[LockInfo]:
        return [self._info(n) for n in self._look(zk, key, None).holders()]

    @staticmethod
    def _info(n: Node) -> LockInfo:
        start = _when(int(n.data.get("a", n.stat.ctime)))
        return LockInfo(n.key, n.owner, n.token, start, _when(n.expires), n.kind)  # type: ignore[arg-type]

    def list_holds(self, prefix: str) -> list[LockInfo]:
        def go(zk: KazooClient) -> list[LockInfo]:
            names = self._children(zk, self.keys)
            keys = sorted(k for k in map(unquote, names) if k.startswith(prefix))
            return [info for k in keys for info in self._infos(zk, k)]

        return self._run("list", go)

    def force_release(self, key: str) -> bool:
        def go(zk: KazooClient) -> bool:
            freed = False
            for n in self._look(zk, key, None).holders():
                with contextlib.suppress(NoNodeError):
                    zk.delete(n.path)
                    freed = True
            return freed

        return self._run("force_release", go)

    def purge(self, older_than: float, include_once: bool) -> int:
        def go(zk: KazooClient) -> int:
            try:
                names = zk.get_children(self.keys)
            except NoNodeError:
                return 0
            now = self._now(zk)
            self._purge_values(zk, now)
            gone = 0
            for name in names:
                kpath = f"{self.keys}/{name}"
                look = self._look(zk, unquote(name), now - _ms(older_than))
                if look.live:
                    continue
                with contextlib.suppress(NoNodeError):
                    record, version = self._record(zk, unquote(name))
                    if version >= 0:
                        if not include_once or record.get("s") == "P":
                            continue
                        stat = zk.exists(f"{kpath}/{RECORD}")
                        if stat is None or stat.mtime > now - _ms(older_than):
                            continue
                        zk.delete(f"{kpath}/{RECORD}", version=version)
                    stat = zk.exists(kpath)
                    if stat is None or max(stat.mtime, stat.ctime) > now - _ms(older_than):
                        if version >= 0:
                            gone += 1  # its record went; the key node is left for later
                        continue
                    with contextlib.suppress(NotEmptyError, BadVersionError):
                        zk.delete(kpath, version=stat.version)
                        gone += 1
            return gone

        return self._run("purge", go)

    # -- FairQueue ------------------------------------------------------------------------------
    def acquire_fair(self, key: str, owner: str, ttl: float, queued: bool) -> int | None:
        entry = self._queued.get((key, owner)) if queued else None
        if entry is None:
            return self.acquire(key, owner, ttl, "lock")
        return self._promote(entry, ttl)

    def _promote(self, entry: Node, ttl: float) -> int | None:
        """A queued waiter's try: refresh its entry (reading the server's time), and take
        the hold if nothing blocks it."""

        def go(zk: KazooClient) -> int | None:
            sub = self._subs.get((entry.key, entry.owner))
            # the server's time: read by a write only when a blocker's lease may have ended;
            # else the latest mtime seen, which is earlier (nobody looks expired too soon)
            now = self._now(zk) if sub is not None and sub.due else int(entry.stat.mtime)
            nearest = entry.kind in EXCLUSIVE
            if sub is not None and sub.took_head():
                look = Look(now)  # its only blocker went: nothing is below it
            else:
                look = self._look(
                    zk, entry.key, now, entry.seq, estimate=True, nearest=nearest, watch=sub
                )
            if look.blocker(entry) is not None or look.kept_from(entry):
                self._arm(zk, entry.key, entry.owner, look, entry)
                return None
            if sub is not None and self._turn(entry, sub):
                return None  # the waiter takes it from its subscription
            held = self._write(zk, entry, {**entry.data, "h": 1, "t": _ms(ttl), "a": look.now})
            self._queued.pop((entry.key, entry.owner), None)
            if held is None:
                return None
            held = replace(held, waiting=False)
            self._remember(held)
            return held.token

        return self._run("acquire", go)

    def _turn(self, entry: Node, sub: ZkSubscription) -> bool:
        """Take a waiter's turn without a write, where its entry holds by itself (``h``,
        never refreshed) and was written moments ago: nothing blocks it, so it holds, on a
        lease that runs from that write on the server's clock. The engine takes it as a lock
        handed over (``granted``), with the node's whole lease (``granted_lease``), counted
        from its own send of that write. Else the waiter writes its node to start a lease."""
        if not entry.data.get("h") or entry.sent is None:
            return False
        lease = int(entry.data.get("t", 0)) / 1000
        if time.monotonic() - entry.sent > min(TURN_AGE, lease / 4):
            return False
        held = replace(entry, waiting=False)
        self._remember(held)
        self._queued.pop((entry.key, entry.owner), None)
        self._turns[(entry.key, entry.owner)] = held
        sub.granted_lease = lease  # from the entry's write
        sub.granted = held.token
        sub.fire()
        return True

    def probe(self, key: str, owner: str) -> tuple[bool, int]:
        def go(zk: KazooClient) -> tuple[bool, int]:
            look = self._look(zk, key, None)
            entry = self._queued.get((key, owner))
            seq = entry.seq if entry is not None else 1 << 62
            holders = look.holders()
            ahead = sum(1 for n in look.live if n.seq < seq and n not in holders)
            return not holders, ahead

        return self._run("probe", go)

    def enqueue(
        self, key: str, owner: str, kind: str, ttl: float, lease: float | None = None
    ) -> None:
        def go(zk: KazooClient) -> None:
            old = self._queued.get((key, owner))
            if old is not None and self._write(zk, old, old.data) is not None:
                return
            entry, names = self._create(zk, key, _data(owner, kind, ttl))
            self._queued[(key, owner)] = entry
            entry.waiting = True
            sub = self._subs.get((key, owner))
            nearest = kind in EXCLUSIVE
            look = self._look(
                zk, key, entry.stat.ctime, entry.seq, nearest=nearest, watch=sub, names=names
            )
            self._arm(zk, key, owner, look, entry)

        self._run("enqueue", go)

    def requeue(self, key: str, owner: str, kind: str, ttl: float) -> bool:
        def go(zk: KazooClient) -> bool:
            old = self._queued.get((key, owner))
            data = None if old is None else {k: v for k, v in old.data.items() if k != "h"}
            fresh = None if old is None or data is None else self._write(zk, old, data)
            if fresh is None:
                self._queued.pop((key, owner), None)
                return False
            fresh.data["t"] = _ms(ttl)
            self._queued[(key, owner)] = fresh
            return True

        return self._run("requeue", go)

    def dequeue(self, key: str, owner: str) -> None:
        # an entry, or a turn taken for a waiter that left before it took it
        entry = self._queued.pop((key, owner), None) or self._turns.pop((key, owner), None)
        if entry is None:
            return
        self._forget(entry)

        def go(zk: KazooClient) -> None:
            with contextlib.suppress(NoNodeError, BadVersionError):
                zk.delete(entry.path, version=entry.stat.version)

        self._run("leaving the queue", go)

    # -- QueueJoin ------------------------------------------------------------------------------
    def joining(self) -> bool:
        return True  # a waiter's watch is set by the same call that queues it

    def acquire_or_enqueue(self, key: str, owner: str, ttl: float, queue_ttl: float) -> int | None:
        """Curator's way: the node made to try is the queue entry when the try fails (it
        holds by itself once unblocked, until its first refresh makes it a plain entry)."""

        def go(zk: KazooClient) -> int | None:
            # ``q``: its lease while it waits (refreshed by its waiter), however short ``t``
            me, names = self._create(zk, key, _data(owner, "lock", ttl, h=1, q=_ms(queue_ttl)))
            sub = self._subs.get((key, owner))
            look = self._look(zk, key, me.stat.ctime, me.seq, nearest=True, watch=sub, names=names)
            if look.blocker(me) is None and not look.kept_from(me):
                self._remember(me)
                return me.token
            me.waiting = True
            self._queued[(key, owner)] = me
            self._arm(zk, key, owner, look, me)
            return None

        return self._run("acquire", go)

    # -- SharedHolds ----------------------------------------------------------------------------
    def acquire_shared(
        self, key: str, owner: str, ttl: float, kind: str, permits: int | None
    ) -> int | None:
        data = _data(owner, kind, ttl, h=1)
        if permits is not None:
            data["p"] = permits
        return self._run("acquire", lambda zk: self._take_new(zk, *self._create(zk, key, data)))

    def _take_new(self, zk: KazooClient, me: Node, names: Sequence[str] | None) -> int | None:
        nearest = me.kind in EXCLUSIVE
        look = self._look(zk, me.key, me.stat.ctime, me.seq, nearest=nearest, names=names)
        return self._take(zk, me, look)

    def release_shared(self, key: str, owner: str, token: int) -> bool:
        return self.release(key, owner, token)

    def renew_shared(self, key: str, owner: str, token: int, ttl: float) -> bool:
        return self.renew(key, owner, token, ttl)

    def acquire_write(self, key: str, owner: str, ttl: float) -> int | None:
        entry = self._queued.get((key, owner))
        if entry is not None:
            return self._promote(entry, ttl)
        return self.acquire(key, owner, ttl, "write")

    # -- OnceRecords ----------------------------------------------------------------------------
    def claim_once(self, key: str, owner: str, ttl: float, note: str | None) -> int | None:
        def go(zk: KazooClient) -> int | None:
            old, version = self._record(zk, key)
            if old.get("s") == "S":
                return None
            me, names = self._create(zk, key, _data(owner, "once", ttl, h=1))
            token = self._take_new(zk, me, names)
            if token is None:
                return None
            record = _dump({"s": "P", "o": owner, "n": note})
            try:
                if version < 0:
                    zk.create(f"{self._kpath(key)}/{RECORD}", record)
                else:
                    zk.set(f"{self._kpath(key)}/{RECORD}", record, version=version)
            except (BadVersionError, NodeExistsError):  # it changed since we read it
                self._forget(me)
                with contextlib.suppress(NoNodeError):
                    zk.delete(me.path)
                return None
            return token

        return self._run("claim_once", go)

    def once_state(self, key: str) -> tuple[str, str | None, bool] | None:
        def go(zk: KazooClient) -> tuple[str, str | None, bool] | None:
            look = self._look(zk, key, None)
            record, holders = look.record, look.holders()
            if record.get("s") in STATE_NAME:
                return "once", STATE_NAME[record["s"]], bool(holders)
            if holders:
                return holders[0].kind, None, True
            return None

        return self._run("state", go)

    def finish_once(self, key: str, owner: str, token: int, state: str) -> bool:
        def go(zk: KazooClient) -> bool:
            node = self._own(zk, key, owner, token)
            if node is None:
                return False
            live = self._write(zk, node, node.data)
            self._forget(node)
            if live is None:
                return False
            record, version = self._record(zk, key)
            tx = zk.transaction()
            tx.delete(live.path, version=live.stat.version)
            tx.set_data(
                f"{self._kpath(key)}/{RECORD}",
                _dump({**record, "s": STATE[state]}),
                version=version,
            )
            results = tx.commit()
            return not any(isinstance(r, Exception) for r in results)

        return self._run("recording the once outcome", go)

    def finish_scheduled(self, key: str, owner: str, token: int, at_least: float) -> bool:
        def go(zk: KazooClient) -> bool:
            node = self._own(zk, key, owner, token)
            if node is None:
                return False
            until = int(node.stat.ctime) + _ms(at_least)
            kept = self._write(zk, node, {**node.data, "u": until})
            self._forget(node)
            if kept is None:
                return False
            if kept.stat.mtime >= until:
                with contextlib.suppress(NoNodeError, BadVersionError):
                    zk.delete(kept.path, version=kept.stat.version)
            return True

        return self._run("release", go)

    # -- Wakeups, LossPush ----------------------------------------------------------------------
    def subscribe(self, key: str, owner: str, queue: str | None = None) -> Subscription:
        sub = ZkSubscription(self, key, owner)
        self._subs[(key, owner)] = sub

        def go(zk: KazooClient) -> None:
            # any change of the key's contenders wakes it once; each later try (or the
            # waiter's queue entry, once made) points it at what blocks the waiter
            zk.get_children_async(self._kpath(key), watch=sub.fire)

        if queue is None:
            self._run("subscribe", go)
        return sub

    def watch(self, key: str, owner: str, heard: Callable[[], None]) -> Callable[[], None]:
        node = self._latest.get((key, owner))
        if node is None:
            return lambda: None
        path = node.path
        self._losses[path] = heard

        def fired(event: Any) -> None:
            if getattr(event, "type", None) == "DELETED" and path in self._losses:
                self._losses.pop(path)()
            elif path in self._losses:  # a renewal: watch on
                with contextlib.suppress(Exception):
                    self._client().exists_async(path, watch=fired)

        def go(zk: KazooClient) -> None:
            if zk.exists(path, watch=fired) is None and path in self._losses:
                self._losses.pop(path)()

        self._run("watch", go)

        def stop() -> None:
            self._losses.pop(path, None)

        return stop

    # -- LeaderPush -------------------------------------------------------------------------
    def watch_leader(self, key: str, heard: Callable[[], None]) -> Callable[[], None]:
        """Watches on the key node's children (a grant by a new node, a release, an expired
        node deleted, a force-release) and on the value node (a proclaim), re-armed at each
        event: see :class:`LeaderWatch`."""
        watch = LeaderWatch(self, key, heard)
        self._leader_watches.add(watch)
        try:
            self._run("watching the leader", watch.arm)
        except BaseException:
            watch.stop()
            raise
        return watch.stop

    # -- LeaderValues -----------------------------------------------------------------------
    def _vpath(self, key: str) -> str:
        return f"{self.values}/{_encode(key)}"

    def proclaim(self, key: str, owner: str, token: int, value: str | None) -> bool:
        """One multi: the hold node checked at the version last seen (so it is that node, the
        token's), the clock node written (its mtime is the server's time of the multi) and
        the value node written. A hold whose lease had ended by then gets its value taken
        back (a versioned delete). A hold this client does not hold is read first, as is one
        renewed meanwhile; a value node not made yet costs a second multi."""
        data = _dump({"t": token, "v": value})
        vpath = self._vpath(key)

        def go(zk: KazooClient) -> bool:
            node = self._own(zk, key, owner, token)
            make = False
            for _ in range(4):
                if node is None:
                    return False
                tx = zk.transaction()
                tx.check(node.path, node.stat.version)
                tx.set_data(self.clock, b"")
                if make:
                    tx.create(vpath, data)
                else:
                    tx.set_data(vpath, data)
                checked, clock, written = tx.commit()
                if isinstance(checked, (NoNodeError, BadVersionError)):  # gone, or renewed
                    node = self._reread(zk, node)
                elif isinstance(written, NoNodeError) and make:
                    zk.ensure_path(self.values)  # a table made before values were
                elif isinstance(written, (NoNodeError, NodeExistsError)):
                    make = not make
                else:
                    for failed in filter(None, map(_failure, (checked, clock, written))):
                        raise failed
                    if node.expires > clock.mtime:
                        return True
                    version = 0 if make else int(written.version)
                    with contextlib.suppress(NoNodeError, BadVersionError):
                        zk.delete(vpath, version=version)  # its hold had ended: not its value
                    return False
            return False

        return self._run("proclaiming", go)

    def _reread(self, zk: KazooClient, node: Node) -> Node | None:
        """``node`` as it is now, if it is still a hold (renewed since it was read)."""
        try:
            raw, stat = zk.get(node.path)
        except NoNodeError:
            return None
        found = Node(node.path, _load(raw), stat, node.key)
        return found if found.data.get("h") and found.owner == node.owner else None

    def leader(self, key: str) -> Leading | None:
        """The key's contenders read as ``info`` reads them (its children, their data, and
        the server's time by a write to the clock node: ZooKeeper has no read of a lease's
        end), with the value node read in the first round trip."""

        def go(zk: KazooClient) -> Leading | None:
            read = zk.get_async(self._vpath(key))
            look = self._look(zk, key, None)
            read.wait()  # not read.get(): see _create
            data = _load(read.value[0]) if read.successful() else {}
            if not read.successful() and not isinstance(read.exception, NoNodeError):
                read.get()  # raises it
            for n in look.holders():
                if n.kind == "lock":
                    if data.get("t") != n.token:  # none, or an earlier hold's
                        return Leading(self._info(n), False, None)
                    return Leading(self._info(n), True, data.get("v"))
            return None

        return self._run("reading the leader", go)

    def _purge_values(self, zk: KazooClient, now: int) -> None:
        """Delete the value nodes whose hold is not live at ``now`` (server ms): each read
        first and deleted at the version read, so a value proclaimed meanwhile stays."""
        for name in self._children(zk, self.values):
            vpath = f"{self.values}/{name}"
            try:
                raw, stat = zk.get(vpath)
            except NoNodeError:
                continue
            token = _load(raw).get("t")
            if any(n.token == token for n in self._look(zk, unquote(name), now).live):
                continue
            with contextlib.suppress(NoNodeError, BadVersionError):
                zk.delete(vpath, version=stat.version)

    # -- ManyKeys -------------------------------------------------------------------------------
    def acquire_many(self, keys: Sequence[str], owner: str, ttl: float) -> dict[str, int] | None:
        """Two multis. The first makes every key's node as a queue entry (no ``h``: it holds
        nothing yet, but blocks whatever comes after it) and writes ``clock`` (the server's
        time). Nodes of a key are judged in sequence order and nodes below only go, so if no
        live node is below our entry of each key (read between the two), none will be; the
        second multi then sets ``h`` on every entry at once (versioned: an entry deleted as
        expired meanwhile fails it whole). Nobody sees some keys held and not the others."""
        hold = _data(owner, "lock", ttl, h=1)
        entry = {k: v for k, v in hold.items() if k != "h"}

        def go(zk: KazooClient) -> dict[str, int] | None:
            now, paths = self._enter_many(zk, keys, entry)
            below = self._below_many(zk, keys, paths, now)
            own, blockers = below.split(owner) if below is not None else ([], {})
            if below is None or blockers or below.kept:
                self._drop(zk, paths)
                return None
            tx = zk.transaction()
            for path in paths:
                tx.set_data(path, _dump(hold), version=0)
            for n in own:  # its earlier grant or entry (a retry after a lost reply)
                tx.delete(n.path, version=n.stat.version)
            sent = time.monotonic()
            results = tx.commit()
            if any(isinstance(r, Exception) for r in results):
                self._drop(zk, paths)
                return None
            for n in own:
                self._forget(n)
            tokens = {}
            for key, path, stat in zip(keys, paths, results, strict=False):
                node = Node(path, dict(hold), stat, key, sent)
                self._remember(node)
                tokens[key] = node.token
            return tokens

        return self._run("acquire_many", go)

    def _enter_many(
        self,
        zk: KazooClient,
        keys: Sequence[str],
        data: dict[str, Any],
        tag: str | None = None,
        replaced: Sequence[str] = (),
    ) -> tuple[int, list[str]]:
        """One multi: ``clock`` written (its mtime, the server's time, is returned), an entry
        of each key made (named with ``tag``, else each with a random part) and the nodes
        ``replaced`` deleted; missing key nodes (a purge) are made, replaced nodes gone
        already are left out, and it is sent again."""
        replaced = list(replaced)
        while True:
            tx = zk.transaction()
            tx.set_data(self.clock, b"")
            for key in keys:
                name = f"{PREFIX['lock']}{tag or secrets.token_hex(6)}-"
                tx.create(f"{self._kpath(key)}/{name}", _dump(data), ephemeral=True, sequence=True)
            for path in replaced:
                tx.delete(path)
            results = tx.commit()
            failed = [i for i, r in enumerate(results) if isinstance(r, Exception)]
            if not failed:
                return int(results[0].mtime), [str(r) for r in results[1 : len(keys) + 1]]
            gone = set()
            for i in failed:
                if isinstance(results[i], NoNodeError) and i > len(keys):
                    gone.add(replaced[i - len(keys) - 1])
                elif isinstance(results[i], NoNodeError):
                    zk.ensure_path(self.clock if i == 0 else self._kpath(keys[i - 1]))
                elif not isinstance(results[i], RolledBackError | RuntimeInconsistency):
                    raise results[i]
            replaced = [p for p in replaced if p not in gone]

    def _below_many(
        self,
        zk: KazooClient,
        keys: Sequence[str],
        paths: Sequence[str],
        now: int,
        *,
        estimate: bool = False,
        sub: ZkManySubscription | None = None,
    ) -> Below | None:
        """The live nodes below each key's entry (``paths``), the expired deleted: all keys
        read in two pipelined round trips (the children, then the nodes below); None if an
        entry is gone. ``estimate``: ``now`` is a lower bound of the server's time, and so is
        every mtime read. ``sub``: the nearest node below each entry, what most likely blocks
        it, is read with its watch (Curator's way: no separate ``exists``)."""
        listed = [zk.get_children_async(self._kpath(key)) for key in keys]
        below: list[list[str]] = []
        kept = []
        for key, path, result in zip(keys, paths, listed, strict=True):
            try:
                names = result.get()
            except NoNodeError:
                return None
            if path.rsplit("/", 1)[1] not in names:
                return None
            if RECORD in names:
                kept.append(key)
            kpath, seq = self._kpath(key), _seq(path)
            ahead = (f"{kpath}/{n}" for n in names if n != RECORD and _seq(n) < seq)
            below.append(sorted(ahead, key=_seq))
        top = {names[-1] for names in below if names} if sub is not None else set()
        watch = None
        if sub is not None:
            sub.watching, watch = set(top), sub.blocker_changed  # before a wake-up can come
        read = [[(p, zk.get_async(p, watch=watch if p in top else None)) for p in b] for b in below]
        nodes: list[list[Node]] = []
        for key, pending in zip(keys, read, strict=True):
            found = []
            for path, got in pending:
                with contextlib.suppress(NoNodeError):
                    raw, stat = got.get()
                    found.append(Node(path, _load(raw), stat, key))
            nodes.append(found)
        if estimate:
            now = max([now, *(int(n.stat.mtime) for found in nodes for n in found)])
        live = {
            key: self._judge(zk, Look(now), found).live
            for key, found in zip(keys, nodes, strict=True)
        }
        return Below(now, live, kept, top)

    @staticmethod
    def _drop(zk: KazooClient, paths: list[str]) -> None:
        """Delete our entries of a try that failed (pipelined; those gone already are)."""
        for result in [zk.delete_async(path) for path in paths]:
            with contextlib.suppress(NoNodeError):
                result.get()

    def _each(
        self,
        zk: KazooClient,
        tokens: Mapping[str, int],
        owner: str,
        ops: Callable[[Any, Node], None],
        redone: Callable[[KazooClient, Node], ZnodeStat | None] | None = None,
    ) -> tuple[list[tuple[Node, ZnodeStat, float | None]], bool]:
        """One multi of ``ops`` over each live node of ``owner`` (key: token); a node gone
        fails it, so it is sent again without those: (node, its set's stat, when the multi
        was sent) for each, and whether all were there. ``redone``: the stat of a node whose
        version had moved on if it is our own write (a reply lost before a retry)."""
        nodes = [self._own(zk, key, owner, token) for key, token in sorted(tokens.items())]
        complete = all(n is not None for n in nodes)
        live = [n for n in nodes if n is not None]
        done: list[tuple[Node, ZnodeStat, float | None]] = []
        while live:
            tx = zk.transaction()
            for n in live:
                ops(tx, n)
            sent = time.monotonic()
            results = tx.commit()
            per = len(results) // len(live)
            bad = {
                i // per: r
                for i, r in enumerate(results)
                if isinstance(r, Exception)
                and not isinstance(r, RolledBackError | RuntimeInconsistency)
            }
            if not bad:
                return done + [(n, results[i * per], sent) for i, n in enumerate(live)], complete
            for i, error in bad.items():
                stat = (
                    redone(zk, live[i]) if redone and isinstance(error, BadVersionError) else None
                )
                if stat is None:
                    self._forget(live[i])
                    complete = False
                else:
                    done.append((live[i], stat, None))  # written by a try whose reply was lost
            live = [n for i, n in enumerate(live) if i not in bad]
        return done, complete

    def renew_many(self, tokens: Mapping[str, int], owner: str, ttl: float) -> bool:
        def write(tx: Any, n: Node) -> None:
            tx.set_data(n.path, _dump(renewed(n)), version=n.stat.version)

        def renewed(n: Node) -> dict[str, Any]:
            return {**{k: v for k, v in n.data.items() if k != "u"}, "t": _ms(ttl)}

        def redone(zk: KazooClient, n: Node) -> ZnodeStat | None:
            return self._written(zk, n, renewed(n))

        def go(zk: KazooClient) -> bool:
            done, complete = self._each(zk, tokens, owner, write, redone)
            for n, stat, sent in done:
                if n.expires <= stat.mtime:  # it had ended before this write: not renewed
                    with contextlib.suppress(NoNodeError, BadVersionError):
                        zk.delete(n.path, version=stat.version)
                    self._forget(n)
                    complete = False
                else:
                    self._remember(replace(n, data=renewed(n), stat=stat, sent=sent))
            return complete

        return self._run("renew_many", go)

    def release_many(self, tokens: Mapping[str, int], owner: str) -> bool:
        def end(tx: Any, n: Node) -> None:
            # the set's mtime is the server's time at the delete: was its lease still on?
            tx.set_data(n.path, _dump(n.data), version=n.stat.version)
            tx.delete(n.path, version=n.stat.version + 1)

        def go(zk: KazooClient) -> bool:
            for key in tokens:
                self._turns.pop((key, owner), None)
            done, complete = self._each(zk, tokens, owner, end)
            for n, stat, _ in done:
                self._forget(n)
                complete = complete and n.expires > stat.mtime
            return complete

        return self._run("release_many", go)

    # -- FairManyKeys ---------------------------------------------------------------------------
    def enqueue_many(self, keys: Sequence[str], owner: str, ttl: float) -> None:
        """One multi, as ``acquire_many``'s first: ``clock``, an entry of each key (a plain
        lock waiter's: no ``h``, so it never holds by itself) and the owner's earlier entries
        deleted. Sequential nodes made by one multi come after every earlier multi's in each
        parent, and a key's queue is in sequence order: the entries hold one place of an order
        common to all keys. A retry after a lost reply finds them by their shared ``tag``."""
        old = self._waits.get(owner)
        stale = [] if old is None else [*old.stale, *(n.path for n in old.nodes.values())]
        waits = self._waits[owner] = Waits(tuple(keys), secrets.token_hex(6), stale=stale)
        data = _data(owner, "lock", ttl)
        tries = 0

        def go(zk: KazooClient) -> None:
            nonlocal tries
            tries += 1
            if old is not None and not old.nodes and tries == 1:  # its multi's outcome unknown
                waits.stale += self._tagged(zk, old.keys, old.tag).values()
            sent = time.monotonic()
            found = self._tagged(zk, keys, waits.tag) if tries > 1 else {}
            if len(found) == len(keys):  # made by the try whose reply was lost: all of them
                stats = [zk.exists_async(found[key]) for key in keys]
                made = [(found[k], s.get()) for k, s in zip(keys, stats, strict=True)]
            else:
                now, paths = self._enter_many(zk, keys, data, waits.tag, waits.stale)
                made = [(path, _made(now)) for path in paths]
            waits.nodes = {
                key: Node(path, dict(data), stat, key, sent, waiting=True)
                for key, (path, stat) in zip(keys, made, strict=True)
                if stat is not None
            }
            waits.stale = []

        self._run("enqueue_many", go)

    def _tagged(self, zk: KazooClient, keys: Sequence[str], tag: str) -> dict[str, str]:
        """The paths of the entries named with ``tag`` among the keys' children, by key."""
        listed = [zk.get_children_async(self._kpath(key)) for key in keys]
        found = {}
        for key, result in zip(keys, listed, strict=True):
            with contextlib.suppress(NoNodeError):
                for name in result.get():
                    if name.startswith(f"{PREFIX['lock']}{tag}-"):
                        found[key] = f"{self._kpath(key)}/{name}"
        return found

    def requeue_many(self, keys: Sequence[str], owner: str, ttl: float) -> bool:
        """One multi of versioned sets (a gone entry fails it whole); False too if an entry's
        lease had ended before it (the caller enqueues afresh, which replaces them all)."""
        waits = self._waits.get(owner)
        if waits is None or any(key not in waits.nodes for key in keys):
            return False
        entries = [waits.nodes[key] for key in keys]
        data = _data(owner, "lock", ttl)

        def go(zk: KazooClient) -> bool:
            tx = zk.transaction()
            for n in entries:
                tx.set_data(n.path, _dump(data), version=n.stat.version)
            sent: float | None = time.monotonic()
            results = tx.commit()
            if any(isinstance(r, Exception) for r in results):
                if not any(isinstance(r, BadVersionError) for r in results):
                    return False
                results = [self._written(zk, n, data) for n in entries]  # a lost reply's?
                if any(stat is None for stat in results):
                    return False
                sent = None
            for n, stat in zip(entries, results, strict=True):
                waits.nodes[n.key] = replace(n, data=dict(data), stat=stat, sent=sent)
            return all(n.expires > stat.mtime for n, stat in zip(entries, results, strict=True))

        return self._run("requeue_many", go)

    def dequeue_many(self, keys: Sequence[str], owner: str) -> None:
        """One multi of deletes (sent again without those gone already). An entry turned into
        a hold by a try whose reply never came is deleted too: its waiter does not know it."""
        waits = self._waits.get(owner)
        if waits is None:
            return

        def go(zk: KazooClient) -> None:
            paths = [*waits.stale, *(waits.nodes[k].path for k in keys if k in waits.nodes)]
            if not waits.nodes:  # the multi that makes them may have run (an interruption)
                paths += self._tagged(zk, keys, waits.tag).values()
            while paths:
                tx = zk.transaction()
                for path in paths:
                    tx.delete(path)
                results = tx.commit()
                for r in results:
                    if isinstance(r, Exception) and not isinstance(r, NoNodeError | _ROLLED):
                        raise r
                gone = {
                    p for p, r in zip(paths, results, strict=True) if isinstance(r, NoNodeError)
                }
                if not gone:
                    return
                paths = [p for p in paths if p not in gone]

        self._run("leaving the queues", go)
        for key in keys:
            waits.nodes.pop(key, None)
        waits.stale = []
        if not waits.nodes and self._waits.get(owner) is waits:
            del self._waits[owner]

    def acquire_many_in_turn(
        self, keys: Sequence[str], owner: str, ttl: float
    ) -> dict[str, int] | None:
        """``acquire_many``'s reads over the owner's entries, then one multi turns every entry
        into a hold in place (versioned sets: an entry deleted as expired meanwhile fails it
        whole) and deletes the owner's own nodes below them. Nodes below an entry only go,
        so what was read free stays free; the token is the entry's czxid, above every
        earlier grant of the key (a key's nodes are granted in sequence order). Without
        entries (none made, or one lost) it is ``acquire_many``."""
        waits = self._waits.get(owner)
        if waits is None or any(key not in waits.nodes for key in keys):
            tokens = self.acquire_many(keys, owner, ttl)  # replaces its own nodes
            if tokens is not None:
                self._waits.pop(owner, None)
            return tokens
        entries = [waits.nodes[key] for key in keys]
        sub = self._many_subs.get(owner)
        hold = _data(owner, "lock", ttl, h=1)

        def go(zk: KazooClient) -> dict[str, int] | None:
            # the server's time: read by a write only when a blocker's lease may have ended;
            # else the latest mtime seen, which is earlier (nobody looks expired too soon)
            due = sub is None or sub.due
            now = self._now(zk) if due else max(int(n.stat.mtime) for n in entries)
            paths = [n.path for n in entries]
            below = self._below_many(zk, keys, paths, now, estimate=not due, sub=sub)
            if below is None:
                return None  # an entry is gone: requeue_many says so, enqueue_many remakes it
            own, blockers = below.split(owner)
            if blockers or below.kept:
                self._arm_many(zk, sub, below, blockers)
                return None
            data = {**hold, "a": below.now}
            tx = zk.transaction()
            for n in entries:
                tx.set_data(n.path, _dump(data), version=n.stat.version)
            for n in own:
                tx.delete(n.path, version=n.stat.version)
            sent: float | None = time.monotonic()
            results = tx.commit()
            held = [(data, stat) for stat in results[: len(entries)]]
            if any(isinstance(r, Exception) for r in results):
                found = None
                if any(isinstance(r, BadVersionError) for r in results[: len(entries)]):
                    found = self._promoted(zk, entries, owner)  # by a try whose reply was lost?
                if found is None:
                    return None
                held, sent = found, None
            for n in own:
                self._forget(n)
            if self._waits.get(owner) is waits:
                del self._waits[owner]
            if sub is not None:
                sub.watching, sub.until = set(), None
            tokens = {}
            for n, (d, stat) in zip(entries, held, strict=True):
                node = Node(n.path, d, stat, n.key, sent)
                self._remember(node)
                tokens[n.key] = node.token
            return tokens

        return self._run("acquire_many", go)

    @staticmethod
    def _promoted(
        zk: KazooClient, entries: list[Node], owner: str
    ) -> list[tuple[dict[str, Any], ZnodeStat]] | None:
        """The entries' data and stat if each holds, written once more since (by the owner's
        try whose reply was lost: nobody else writes them); else None."""
        reads = [zk.get_async(n.path) for n in entries]
        found = []
        for n, result in zip(entries, reads, strict=True):
            try:
                raw, stat = result.get()
            except NoNodeError:
                return None
            data = _load(raw)
            if stat.version != n.stat.version + 1 or not data.get("h") or data.get("o") != owner:
                return None
            found.append((data, stat))
        return found

    def _arm_many(
        self,
        zk: KazooClient,
        sub: ZkManySubscription | None,
        below: Below,
        blockers: dict[str, Node],
    ) -> None:
        """Point the many-waiter's subscription at what blocks it now: on each key, the
        nearest live node below its entry (a watch: its deletion wakes the waiter, a renewal
        only moves the watch), and a wake-up at the first of their leases' ends; on a key a
        once-record keeps it from, any change of the key's children."""
        if sub is None:
            return
        sub.watching = {b.path for b in blockers.values()}
        ends = [max(0, b.expires - below.now) for b in blockers.values()]
        sub.until = time.monotonic() + min(ends) / 1000 + 0.01 if ends else None
        pending = [
            zk.exists_async(path, watch=sub.blocker_changed)
            for path in sub.watching - below.watched
        ]
        for key in below.kept:
            if key not in blockers:
                zk.get_children_async(self._kpath(key), watch=sub.fire)
        if [r for r in pending if r.get() is None]:
            sub.fire()  # gone since it was read (its watch would wait for a re-creation)

    def subscribe_many(self, keys: Sequence[str], owner: str) -> Subscription:
        """No request: each of the waiter's tries (``acquire_many_in_turn``), which reads
        every key anyway, points it at what blocks it then. Before its first try it watches
        nothing, and that try reads what it would have been told."""
        sub = ZkManySubscription(self, owner)
        self._many_subs[owner] = sub
        return sub
