"""etcd backend: the store contract as etcd transactions, leases and watches.

Keys of one lock table share the prefix ``dblock/<table>/``; those of one lock key ``K``
share ``dblock/<table>/K\\0`` (a key never contains NUL), followed by:

- ``l``: the exclusive hold (lock, write, once, scheduled), attached to a lease of its own;
- ``s/<owner>``: a shared hold (read, semaphore permit), with a lease of its own;
- ``q/<kind>/<owner>``: a wait-queue entry, with a lease of its own; its create revision is
  its place in the queue;
- ``o`` and ``n``: a once-record's state (``processing``, ``failed``, ``succeeded``) and note,
  plain keys without a lease, so a success survives everything.

Time is the cluster's: a hold lasts as long as its lease, which the leader grants and
expires; dblock never computes an expiry (``info`` shows the lease's remaining TTL as the
cluster reports it). Leases are whole seconds, never shorter than the ttl asked for.
Renewing is a keep-alive of the hold's lease; a release or ``force_release`` revokes it, so
a lease that is alive is a hold that is held.

The fencing token is the hold key's create revision: the cluster's revision counter, which
only grows, through leader changes (it is part of the replicated log), restarts (it is on
disk) and compactions (they drop old revisions, never the counter). A key deleted and made
again gets a new, larger one.

Each decision is one transaction whose compares are the conditions (``create_revision ==
0``: free; a compare on a key range: no shared hold, nobody queued ahead). Shared holds,
which count their peers, read the key's range and commit only if nothing in it changed.

Waiters watch the key's range for deletions (a release, an expiry, a queue entry leaving):
no polling. The async client runs each call on a worker thread.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any

from pyetcd import etcdrpc

from .._errors import BackendError
from .._types import Kind, LockInfo
from .._url import DatabaseURL
from ._contract import FairQueue, OnceRecords, SharedHolds, Store, Subscription, Wakeups
from ._etcd_rpc import (
    Req,
    Rpc,
    created,
    delete,
    empty,
    get,
    lease_seconds,
    none_created_before,
    options,
    put,
    unchanged_since,
)
from ._etcd_watch import EtcdSubscription
from .sql.schema import MissingTable

Kvs = list[Any]  # a name for the class whose method `list` shadows the builtin
#: tries of an optimistic read-then-commit (shared holds) before it reports "busy"
_OPTIMISTIC_TRIES = 20
#: keys whose busy revision is remembered for a waiter's watch, at most
_BUSY_KEYS = 4096


def _value(owner: str, kind: str) -> bytes:
    return json.dumps({"o": owner, "k": kind, "a": time.time()}).encode()


def _now() -> bytes:
    return repr(time.time()).encode()


def _ended(at: float | None, granted: int) -> bytes:
    """A key's record: when its last hold ended (None: its lease, ``granted`` s, ends it)."""
    return json.dumps({"t": at, "a": time.time(), "g": granted}).encode()


def _decode(kv: Any) -> dict[str, Any]:
    try:
        found = json.loads(kv.value)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _kvs(reply: Any, index: int) -> Kvs:
    return list(reply.responses[index].response_range.kvs)


class EtcdBackend(Store, FairQueue, SharedHolds, OnceRecords, Wakeups):
    """Locks in etcd, under the key prefix of one table."""

    name = dialect = "etcd"
    poll_cap = 1.0

    def __init__(self, url: DatabaseURL, schema: str | None, table: str) -> None:
        self.table = f"{schema}.{table}" if schema else table
        self.safe_url = url.safe
        self.rpc = Rpc(options(url), url.safe, self.table, url.secrets)
        self.prefix = f"dblock/{self.table}/".encode()
        self._marker = f"dblock/{self.table}\0".encode()
        #: token -> (lease, granted TTL, monotonic time of the acquire) of this client's holds
        self._holds: dict[int, tuple[int, int, float]] = {}
        #: (key, owner) -> (kind, lease, create revision) of this client's queue entries
        self._entries: dict[tuple[str, str], tuple[str, int, int]] = {}
        self._mutex = threading.Lock()
        self._subs: set[EtcdSubscription] = set()
        #: key -> the revision at which this client last found it busy: a watch from there
        #: on hears every release since that try
        self._busy_at: dict[str, int] = {}

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name == "rt" and "rpc" in self.__dict__:
            self.rpc.rt = value  # the async client's runtime: calls go to a worker thread

    # -- keys -------------------------------------------------------------------------------
    def _base(self, key: str) -> bytes:
        return self.prefix + key.encode() + b"\0"

    def _parts(self, key: str) -> tuple[bytes, bytes, bytes, bytes]:
        """(hold, once-record, shared holds' prefix, queue prefix) of ``key``."""
        base = self._base(key)
        return base + b"l", base + b"o", base + b"s/", base + b"q/"

    def _read(self, what: str, key: str) -> tuple[int, Kvs]:
        """Every key of ``key``: (the revision read at, its keys)."""
        reply = self.rpc.txn(what, [], [get(self._base(key), whole_prefix=True)], key=key)
        return int(reply.header.revision), _kvs(reply, 0)

    # -- schema (a marker key: etcd has no tables) --------------------------------------------
    def ensure_schema(self, create: bool) -> None:
        if create:
            self.rpc.txn(
                "creating the lock table",
                [created(self._marker, 0)],
                [put(self._marker, b"1")],
            )
            return
        reply = self.rpc.txn("checking the lock table", [], [get(self._marker)])
        if not _kvs(reply, 0):
            raise MissingTable(
                f"the lock table {self.table} does not exist in {self.safe_url}; it is "
                "created by connect(create_schema=True) and by the dblock commands that "
                "take locks (run, once); etcd has no `dblock schema` to apply"
            )

    # -- taking the exclusive hold ------------------------------------------------------------
    def _take(
        self,
        key: str,
        owner: str,
        ttl: float,
        kind: str,
        *,
        compare: list[Any],
        also: list[Any],
    ) -> int | None:
        """Put the hold key (and ``also``) if ``compare`` holds and it is free; its token.

        A live hold of ``owner`` itself (a retry after a lost reply) is ended and taken again,
        so the token still grows."""
        hold = self._parts(key)[0]
        sent = time.monotonic()
        lease, granted = self.rpc.grant("acquire", ttl, key)
        conds = [created(hold, 0), *compare]
        record = self._base(key) + b"r"
        ops = [put(hold, _value(owner, kind), lease), put(record, _ended(None, granted)), *also]
        for attempt in range(2):
            reply = self.rpc.txn("acquire", conds, ops, [get(hold)], key=key)
            if reply.succeeded:
                token = int(reply.header.revision)
                with self._mutex:
                    self._holds[token] = (lease, granted, sent)
                return token
            self._saw(key, int(reply.header.revision))
            mine = [kv for kv in _kvs(reply, 0) if _decode(kv).get("o") == owner]
            if attempt or not mine:
                break
            old = mine[0]
            self.rpc.txn("acquire", [created(hold, old.create_revision)], [delete(hold)], key=key)
            self._forget(int(old.create_revision))
            with contextlib.suppress(BackendError):
                self.rpc.revoke("acquire", int(old.lease), key)
        with contextlib.suppress(BackendError):
            self.rpc.revoke("acquire", lease, key)
        return None

    def _saw(self, key: str, revision: int) -> None:
        with self._mutex:
            if len(self._busy_at) >= _BUSY_KEYS:  # tries that never waited: forget them
                self._busy_at.clear()
            self._busy_at[key] = revision

    def _exclusive(self, key: str) -> list[Any]:
        """No once-record and no shared hold."""
        _, once, shared, _ = self._parts(key)
        return [created(once, 0), empty(shared)]

    def _forget(self, token: int) -> tuple[int, int, float] | None:
        with self._mutex:
            return self._holds.pop(token, None)

    # -- Store ------------------------------------------------------------------------------
    def acquire(self, key: str, owner: str, ttl: float, kind: str) -> int | None:
        return self._take(key, owner, ttl, kind, compare=self._exclusive(key), also=[])

    def _lease_of(self, what: str, hold: bytes, token: int, key: str) -> tuple[int, int] | None:
        """(lease, granted TTL) of this client's hold ``token`` at key ``hold``, or None."""
        with self._mutex:
            known = self._holds.get(token)
        if known is not None:
            return known[0], known[1]
        reply = self.rpc.txn(what, [], [get(hold)], key=key)
        for kv in _kvs(reply, 0):
            if int(kv.create_revision) == token and kv.lease:
                return int(kv.lease), 0
        return None

    def _renew(self, hold: bytes, key: str, token: int, ttl: float) -> bool:
        found = self._lease_of("renew", hold, token, key)
        if found is None:
            return False
        lease, granted = found
        if granted == lease_seconds(ttl):
            return self.rpc.keepalive("renew", lease, key) > 0
        # another ttl: the hold moves to a new lease (its create revision, its token, stays)
        new, new_granted = self.rpc.grant("renew", ttl, key)
        reply = self.rpc.txn(
            "renew",
            [created(hold, token)],
            [put(hold, b"", new, keep_value=True)],
            key=key,
        )
        if not reply.succeeded:
            self.rpc.revoke("renew", new, key)
            return False
        with self._mutex:
            start = self._holds.get(token, (0, 0, time.monotonic()))[2]
            self._holds[token] = (new, new_granted, start)
        with contextlib.suppress(BackendError):
            self.rpc.revoke("renew", lease, key)
        return True

    def renew(self, key: str, owner: str, token: int, ttl: float) -> bool:
        return self._renew(self._parts(key)[0], key, token, ttl)

    def _end(self, hold: bytes, key: str, token: int) -> bool:
        """End the hold ``token`` at key ``hold``; an exclusive one leaves its record, with
        the time it ended, for ``purge``. (Its lease, now without keys, runs out by itself.)"""
        self._forget(token)
        ops = [delete(hold)]
        if hold.endswith(b"\0l"):
            ops.append(put(hold[:-1] + b"r", _ended(time.time(), 0)))
        return bool(self.rpc.txn("release", [created(hold, token)], ops, key=key).succeeded)

    def release(self, key: str, owner: str, token: int) -> bool:
        return self._end(self._parts(key)[0], key, token)

    def _infos(self, kvs: Kvs) -> list[LockInfo]:
        """The live holds among ``kvs``, with their leases' TTL as the cluster reports it."""
        found = []
        for kv in kvs:
            lock_key, _, part = bytes(kv.key)[len(self.prefix) :].partition(b"\0")
            if part != b"l" and not part.startswith(b"s/"):
                continue
            remaining, _granted = self.rpc.time_to_live("info", int(kv.lease))
            if remaining < 0:
                continue  # expired; its keys go at the leader's next expiry pass
            data = _decode(kv)
            start = float(data.get("a", 0))
            # the cluster's remaining TTL is whole seconds: counted from a time on the hold's
            # own second grid, two reads of one hold show the same expiry
            now = time.time()
            now = min(now, start + (now - start) // 1)
            acquired = datetime.fromtimestamp(start, tz=timezone.utc)
            now_at = datetime.fromtimestamp(now, tz=timezone.utc)
            kind: Kind = data.get("k", "lock")
            owner = data.get("o") or part[2:].decode()
            found.append(
                LockInfo(
                    lock_key.decode(),
                    owner,
                    int(kv.create_revision),
                    acquired,
                    now_at + timedelta(seconds=remaining),
                    kind,
                )
            )
        return sorted(found, key=lambda i: (i.key, i.acquired_at))

    def info(self, key: str) -> LockInfo | None:
        found = self._infos(self._read("info", key)[1])
        return found[0] if found else None

    def list(self, prefix: str) -> list[LockInfo]:
        reply = self.rpc.txn("list", [], [get(self.prefix + prefix.encode(), whole_prefix=True)])
        return self._infos(_kvs(reply, 0))

    def force_release(self, key: str) -> bool:
        freed = False
        for kv in self._read("force_release", key)[1]:
            part = bytes(kv.key)[len(self._base(key)) :]
            if kv.lease and (part == b"l" or part.startswith(b"s/")):
                freed = self.rpc.revoke("force_release", int(kv.lease), key) or freed
        return freed

    def purge(self, older_than: float, include_once: bool) -> int:
        """Delete the records (``r``) of keys not held now whose last hold ended more than
        ``older_than`` s ago, and with ``include_once`` finished once-records (``o``, ``n``,
        ``t``). Times are the ending clients' clocks; a hold its lease ended counts as ended
        at its start plus its lease."""
        reply = self.rpc.txn("purge", [], [get(self.prefix, whole_prefix=True)])
        keys: dict[bytes, dict[bytes, Any]] = {}
        for kv in _kvs(reply, 0):
            base, _, part = bytes(kv.key).rpartition(b"\0")
            keys.setdefault(base + b"\0", {})[part] = kv
        limit = time.time() - older_than
        count = 0
        for base, parts in keys.items():
            if b"l" in parts:
                continue
            doomed: list[Any] = []
            record = parts.get(b"r")
            if record is not None:
                data = _decode(record)
                ended = data.get("t")
                if ended is None:
                    ended = float(data.get("a", 0)) + float(data.get("g", 0))
                if float(ended) <= limit:
                    doomed.append(record)
            once = parts.get(b"o")
            if include_once and once is not None and bytes(once.value) in (b"succeeded", b"failed"):
                finished = parts.get(b"t")
                if finished is None or float(finished.value or 0) <= limit:
                    doomed += [once, *(parts[p] for p in (b"n", b"t") if p in parts)]
            if not doomed:
                continue
            same = [
                etcdrpc.Compare(
                    key=kv.key,
                    target=etcdrpc.Compare.MOD,
                    result=etcdrpc.Compare.EQUAL,
                    mod_revision=kv.mod_revision,
                )
                for kv in doomed
            ]
            done = self.rpc.txn(
                "purge", [*same, created(base + b"l", 0)], [delete(kv.key) for kv in doomed]
            )
            if done.succeeded:
                count += int(record in doomed) + int(once is not None and once in doomed)
        return count

    def close(self) -> None:
        with self._mutex:
            subs, self._subs = list(self._subs), set()
        for sub in subs:
            sub.close()
        self.rpc.close()

    # -- FairQueue --------------------------------------------------------------------------
    def _entry_key(self, key: str, kind: str, owner: str) -> bytes:
        return self._parts(key)[3] + kind.encode() + b"/" + owner.encode()

    def _drop_entry(self, key: str, owner: str) -> None:
        with self._mutex:
            self._entries.pop((key, owner), None)

    def acquire_fair(self, key: str, owner: str, ttl: float, queued: bool) -> int | None:
        line = self._parts(key)[3] + b"lock/"
        with self._mutex:
            mine = self._entries.get((key, owner)) if queued else None
        ahead = empty(line) if mine is None else none_created_before(line, mine[2])
        also = [delete(self._entry_key(key, "lock", owner))]
        token = self._take(
            key, owner, ttl, "lock", compare=[*self._exclusive(key), ahead], also=also
        )
        if token is not None:
            self._drop_entry(key, owner)
        return token

    def _ahead(self, kvs: Kvs, key: str, owner: str) -> int:
        line = self._parts(key)[3] + b"lock/"
        entries = {
            bytes(kv.key)[len(line) :].decode(): int(kv.create_revision)
            for kv in kvs
            if bytes(kv.key).startswith(line)
        }
        mine = entries.get(owner)
        return sum(1 for o, rev in entries.items() if o != owner and (mine is None or rev < mine))

    def probe(self, key: str, owner: str) -> tuple[bool, int]:
        hold, _, shared, _ = self._parts(key)
        _, kvs = self._read("probe", key)
        free = not any(bytes(kv.key) == hold or bytes(kv.key).startswith(shared) for kv in kvs)
        return free, self._ahead(kvs, key, owner)

    def enqueue(
        self, key: str, owner: str, kind: str, ttl: float, lease: float | None = None
    ) -> None:
        with self._mutex:
            known = self._entries.get((key, owner))
        if (
            known is not None
            and known[0] == kind
            and self.rpc.keepalive("queueing", known[1], key) > 0
        ):
            return
        entry = self._entry_key(key, kind, owner)
        new, _ = self.rpc.grant("queueing", ttl, key)
        reply = self.rpc.txn(
            "queueing", [created(entry, 0)], [put(entry, b"", new)], [get(entry)], key=key
        )
        if reply.succeeded:
            rev = int(reply.header.revision)
        else:  # ours, made before: it keeps its place under the new lease
            rev = int(_kvs(reply, 0)[0].create_revision) if _kvs(reply, 0) else 0
            moved = self.rpc.txn(
                "queueing", [created(entry, rev)], [put(entry, b"", new, keep_value=True)], key=key
            )
            if not moved.succeeded:
                self.rpc.revoke("queueing", new, key)
                self.enqueue(key, owner, kind, ttl, lease)
                return
        with self._mutex:
            self._entries[key, owner] = (kind, new, rev)

    def requeue(self, key: str, owner: str, kind: str, ttl: float) -> bool:
        with self._mutex:
            known = self._entries.get((key, owner))
        if known is None:
            return False
        if self.rpc.keepalive("queueing", known[1], key) > 0:
            return True
        self._drop_entry(key, owner)
        return False

    def dequeue(self, key: str, owner: str) -> None:
        with self._mutex:
            known = self._entries.pop((key, owner), None)
        if known is not None:
            self.rpc.revoke("leaving the queue", known[1], key)
            return
        ops = [delete(self._entry_key(key, k, owner)) for k in ("lock", "write")]
        self.rpc.txn("leaving the queue", [], ops, key=key)

    # -- SharedHolds ------------------------------------------------------------------------
    def acquire_shared(
        self, key: str, owner: str, ttl: float, kind: str, permits: int | None
    ) -> int | None:
        hold, _, shared, line = self._parts(key)
        mine = shared + owner.encode()
        lease: tuple[int, int] | None = None
        sent = time.monotonic()
        try:
            for _ in range(_OPTIMISTIC_TRIES):
                rev, kvs = self._read("acquire", key)
                self._saw(key, rev)
                peers = 0
                for kv in kvs:
                    k = bytes(kv.key)
                    if k == hold:
                        return None  # a writer, a plain lock, a once or scheduled run
                    if k.startswith(line) and k[len(line) :].split(b"/")[0] in (b"write", b"lock"):
                        return None  # a writer or a plain lock waits: it goes first
                    if k.startswith(shared) and k != mine:
                        if _decode(kv).get("k") != kind:
                            return None
                        peers += 1
                    if k == mine:  # ours (a retry after a lost reply): taken again below
                        self.rpc.txn("acquire", [created(mine, kv.create_revision)], [delete(mine)])
                        self._forget(int(kv.create_revision))
                        with contextlib.suppress(BackendError):
                            self.rpc.revoke("acquire", int(kv.lease), key)
                if permits is not None and peers >= permits:
                    return None
                if lease is None:
                    lease = self.rpc.grant("acquire", ttl, key)
                reply = self.rpc.txn(
                    "acquire",
                    [unchanged_since(self._base(key), rev), created(mine, 0)],
                    [put(mine, _value(owner, kind), lease[0])],
                    key=key,
                )
                if reply.succeeded:
                    token = int(reply.header.revision)
                    with self._mutex:
                        self._holds[token] = (lease[0], lease[1], sent)
                    lease = None
                    return token
            return None
        finally:
            if lease is not None:
                with contextlib.suppress(BackendError):
                    self.rpc.revoke("acquire", lease[0], key)

    def release_shared(self, key: str, owner: str, token: int) -> bool:
        return self._end(self._parts(key)[2] + owner.encode(), key, token)

    def renew_shared(self, key: str, owner: str, token: int, ttl: float) -> bool:
        return self._renew(self._parts(key)[2] + owner.encode(), key, token, ttl)

    def acquire_write(self, key: str, owner: str, ttl: float) -> int | None:
        also = [delete(self._entry_key(key, "write", owner))]
        token = self._take(key, owner, ttl, "write", compare=self._exclusive(key), also=also)
        if token is not None:
            self._drop_entry(key, owner)
        return token

    # -- OnceRecords ------------------------------------------------------------------------
    def claim_once(self, key: str, owner: str, ttl: float, note: str | None) -> int | None:
        hold, once, shared, _ = self._parts(key)
        notes = self._base(key) + b"n"
        done = etcdrpc.Compare(
            key=once, target=etcdrpc.Compare.VALUE, result=etcdrpc.Compare.EQUAL, value=b"succeeded"
        )
        sent = time.monotonic()
        lease, granted = self.rpc.grant("once", ttl, key)
        claim = [
            put(hold, _value(owner, "once"), lease),
            put(once, b"processing"),
            put(notes, note.encode()) if note is not None else delete(notes),
        ]
        # succeeded: never again; failed, or processing with its lease gone: claimable
        inner = etcdrpc.TxnRequest(compare=[done], success=[], failure=claim)
        for attempt in range(2):
            reply = self.rpc.txn(
                "once",
                [created(hold, 0), empty(shared)],
                [Req(request_txn=inner)],
                [get(hold)],
                key=key,
            )
            if reply.succeeded and not reply.responses[0].response_txn.succeeded:
                token = int(reply.header.revision)
                with self._mutex:
                    self._holds[token] = (lease, granted, sent)
                return token
            mine = (
                []
                if reply.succeeded
                else [kv for kv in _kvs(reply, 0) if _decode(kv).get("o") == owner]
            )
            if attempt or not mine:
                break
            self.rpc.txn("once", [created(hold, mine[0].create_revision)], [delete(hold)], key=key)
            self._forget(int(mine[0].create_revision))
        with contextlib.suppress(BackendError):
            self.rpc.revoke("once", lease, key)
        return None

    def once_state(self, key: str) -> tuple[str, str | None, bool] | None:
        hold, once, _, _ = self._parts(key)
        reply = self.rpc.txn("state", [], [get(hold), get(once)], key=key)
        holds, records = _kvs(reply, 0), _kvs(reply, 1)
        if records:
            return "once", bytes(records[0].value).decode(), bool(holds)
        if holds:
            return str(_decode(holds[0]).get("k", "lock")), None, True
        return None

    def finish_once(self, key: str, owner: str, token: int, state: str) -> bool:
        hold, once, _, _ = self._parts(key)
        reply = self.rpc.txn(
            "recording the once outcome",
            [created(hold, token)],
            [delete(hold), put(once, state.encode()), put(self._base(key) + b"t", _now())],
            key=key,
        )
        known = self._forget(token)
        if known is not None:
            with contextlib.suppress(BackendError):
                self.rpc.revoke("recording the once outcome", known[0], key)
        return bool(reply.succeeded)

    def finish_scheduled(self, key: str, owner: str, token: int, at_least: float) -> bool:
        hold = self._parts(key)[0]
        with self._mutex:
            known = self._holds.get(token)
        # the time run so far, on this client's monotonic clock from before the acquire was
        # sent: the hold is kept at least as long as asked (leases round up to seconds)
        started = known[2] if known is not None else time.monotonic()
        left = at_least - (time.monotonic() - started)
        if left <= 0:
            return self._end(hold, key, token)
        return self._renew(hold, key, token, left)

    # -- Wakeups ----------------------------------------------------------------------------
    def subscribe(self, key: str, owner: str, queue: str | None = None) -> Subscription:
        with self._mutex:
            since = self._busy_at.pop(key, None)
        sub = EtcdSubscription(self, key, owner if queue == "lock" else None, since)
        with self._mutex:
            self._subs.add(sub)
        return sub

    def _unsubscribed(self, sub: EtcdSubscription) -> None:
        with self._mutex:
            self._subs.discard(sub)
