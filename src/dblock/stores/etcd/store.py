"""etcd backend: the store contract as etcd transactions, leases and watches.

Keys of one lock table share the prefix ``dblock/<table>/``; those of one lock key ``K``
share ``dblock/<table>/K\\0`` (a key never contains NUL), followed by:

- ``l``: the exclusive hold (lock, write, once, scheduled), attached to a lease of its own;
- ``s/<owner>``: a shared hold (read, semaphore permit), with a lease of its own;
- ``q/<kind>/<owner>``: a wait-queue entry, with a lease of its own; its create revision is
  its place in the queue;
- ``o`` and ``n``: a once-record's state (``processing``, ``failed``, ``succeeded``) and note,
  plain keys without a lease, so a success survives everything;
- ``v``: the value the exclusive hold's holder proclaimed (LeaderValues) and its token, on
  the hold's lease, so it ends with the hold; counted only while that token holds.

Time is the cluster's: a hold lasts as long as its lease, which the leader grants and
expires; dblock never computes an expiry (``info`` shows the lease's remaining TTL as the
cluster reports it). Leases are whole seconds, never shorter than the ttl asked for.
Renewing is a keep-alive of the hold's lease; a release or ``force_release`` revokes it, so
a lease that is alive is a hold that is held (but for ``acquire_many``'s holds, which share
one lease: ``force_release`` deletes one of them alone).

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
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from pyetcd import etcdrpc

from ..._bounded import remember
from ..._contract import (
    FairManyKeys,
    FairQueue,
    LeaderPush,
    LeaderValues,
    Leading,
    OnceRecords,
    SharedHolds,
    Store,
    Subscription,
    Wakeups,
)
from ..._errors import BackendError
from ..._runtime import Runtime
from ..._types import Kind, LockInfo
from ..._url import DatabaseURL
from .._schema import MissingTable
from .rpc import (
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
from .watch import EtcdLeaderWatch, EtcdManySubscription, EtcdSubscription

Kvs = list[Any]  # a name for the class whose method `list` shadows the builtin
#: tries of an optimistic read-then-commit (shared holds) before it reports "busy"
_OPTIMISTIC_TRIES = 20
#: past states of a key read to find a release whose reply was lost, at most
_HISTORY_STEPS = 8
#: tokens remembered as unsure (an ending call failed), at most
_UNSURE_KEPT = 4096
#: keys remembered for waiters' watches (a busy revision; a queue joined far back), at most,
#: per memory
_BUSY_KEYS = 4096


def _value(owner: str, kind: str) -> bytes:
    return json.dumps({"o": owner, "k": kind, "a": time.time()}).encode()


def _now() -> bytes:
    return repr(time.time()).encode()


def _ended(at: float | None, granted: int, token: int | None = None) -> bytes:
    """A key's record: when its last hold ended (None: its lease, ``granted`` s, ends it),
    and the token of the hold its holder released."""
    found: dict[str, Any] = {"t": at, "a": time.time(), "g": granted}
    if token is not None:
        found["x"] = token
    return json.dumps(found).encode()


def _decode(kv: Any) -> dict[str, Any]:
    try:
        found = json.loads(kv.value)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _kvs(reply: Any, index: int) -> Kvs:
    return list(reply.responses[index].response_range.kvs)


def _on_lease(key: bytes, lease: int) -> Any:
    """``key`` is attached to ``lease``."""
    return etcdrpc.Compare(
        key=key, target=etcdrpc.Compare.LEASE, result=etcdrpc.Compare.EQUAL, lease=lease
    )


def _carry_value(value: bytes, token: int, lease: int) -> Any:
    """A nested transaction that moves the value key of the hold ``token`` to ``lease`` (the
    hold's new one), if that hold wrote it: a value written before the hold was created (its
    mod revision, at most the token) is an earlier hold's, left to end with its lease."""
    written = etcdrpc.Compare(
        key=value, target=etcdrpc.Compare.MOD, result=etcdrpc.Compare.GREATER, mod_revision=token
    )
    move = put(value, b"", lease, keep_value=True)
    return Req(request_txn=etcdrpc.TxnRequest(compare=[written], success=[move]))


class EtcdStore(
    Store,
    FairQueue,
    SharedHolds,
    OnceRecords,
    Wakeups,
    FairManyKeys,
    LeaderValues,
    LeaderPush,
):
    """Locks in etcd, under the key prefix of one table."""

    name = dialect = "etcd"
    poll_cap = 1.0
    #: acquire_many's transaction compares 4 things per key (hold, once-record, shared
    #: holds, lock queue), and writes (hold, record, queue entry) or reads at most 3: 32
    #: keys keep it within etcd's default --max-txn-ops, 128
    max_keys = 32

    def __init__(self, url: DatabaseURL, schema: str | None, table: str) -> None:
        self.table = f"{schema}.{table}" if schema else table
        self.safe_url = url.safe
        self.rpc = Rpc(options(url), url.safe, self.table, url.secrets)
        self.prefix = f"dblock/{self.table}/".encode()
        self._marker = f"dblock/{self.table}\0".encode()
        #: token -> (lease, granted TTL, monotonic time of the acquire) of this client's holds
        self._holds: dict[int, tuple[int, int, float]] = {}
        #: token -> owner of this client's exclusive holds: an exclusive hold's key does not
        #: name its owner, so release and renew check it here (a token is no secret)
        self._owners: dict[int, str] = {}
        #: tokens whose ending call failed with its outcome unknown (a copy may have been
        #: applied): the caller's next try must recognise that copy's effect (oldest first)
        self._unsure: dict[int, None] = {}
        #: (key, owner) -> (kind, lease, create revision) of this client's queue entries
        self._entries: dict[tuple[str, str], tuple[str, int, int]] = {}
        self._mutex = threading.Lock()
        self._subs: set[EtcdSubscription | EtcdManySubscription] = set()
        #: key -> the revision at which this client last found it busy: a watch from there
        #: on hears every release since that try
        self._busy_at: dict[str, int] = {}
        #: keys at which this client's last queued waiter joined far back (watch.NEAR): its
        #: next waiter there makes its watch after its first look, not before
        self._far_keys: dict[str, None] = {}
        #: tokens of acquire_many's holds: their lease is shared, so it being alive does not
        #: say that one of them is (force_release deletes such a hold alone)
        self._many: dict[int, None] = {}
        #: owner -> (keys, lease, granted TTL, create revision) of this client's many-entries
        self._queued_many: dict[str, tuple[tuple[str, ...], int, int, int]] = {}
        #: observers' watches (LeaderPush)
        self._leader_watches: set[EtcdLeaderWatch] = set()

    def use_runtime(self, runtime: Runtime) -> None:
        super().use_runtime(runtime)
        self.rpc.rt = runtime  # the async client's runtime: calls go to a worker thread

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

        A hold on the lease granted here is this call's own, put by a copy of the transaction
        whose reply was lost: it is the grant. Another live hold of ``owner`` (an earlier
        acquire whose outcome its caller never learnt) is ended and taken again, so the token
        still grows."""
        hold = self._parts(key)[0]
        sent = time.monotonic()
        lease, granted = self.rpc.grant("acquire", ttl, key)
        conds = [created(hold, 0), *compare]
        record = self._base(key) + b"r"
        ops = [put(hold, _value(owner, kind), lease), put(record, _ended(None, granted)), *also]
        for attempt in range(2):
            reply = self.rpc.txn("acquire", conds, ops, [get(hold)], key=key)
            held = [] if reply.succeeded else _kvs(reply, 0)
            own = [kv for kv in held if kv.lease == lease]  # a copy's whose reply was lost
            if reply.succeeded or own:
                token = int(own[0].create_revision) if own else int(reply.header.revision)
                with self._mutex:
                    self._holds[token] = (lease, granted, sent)
                    self._owners[token] = owner
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
            remember(self._busy_at, key, revision, _BUSY_KEYS)

    def _joined_far(self, key: str, far: bool) -> None:
        """This client's waiter joined ``key``'s queue far back (True) or near the head."""
        with self._mutex:
            if far:
                remember(self._far_keys, key, None, _BUSY_KEYS)
            else:
                self._far_keys.pop(key, None)

    def _far_back(self, key: str) -> bool:
        """Whether this client's last waiter at ``key`` joined its queue far back."""
        with self._mutex:
            return key in self._far_keys

    def _exclusive(self, key: str) -> list[Any]:
        """No once-record and no shared hold."""
        _, once, shared, _ = self._parts(key)
        return [created(once, 0), empty(shared)]

    def _forget(self, token: int) -> tuple[int, int, float] | None:
        with self._mutex:
            self._owners.pop(token, None)
            return self._holds.pop(token, None)

    def _others(self, token: int, owner: str) -> bool:
        """True if ``token`` is this client's exclusive hold of another owner."""
        with self._mutex:
            return self._owners.get(token, owner) != owner

    def _ending(
        self, what: str, token: int, compare: list[Any], ops: list[Any], key: str
    ) -> tuple[bool, bool, tuple[int, int, float] | None]:
        """Send the transaction that ends hold ``token``: (it succeeded, a copy of it may
        have been applied before (sent twice, or a call of the caller's that failed), what
        this client knew of the hold). A failure leaves the hold known (the caller's hold
        stays its own until an ending call answers) and marks the token unsure."""
        try:
            reply, resent = self.rpc.txn_sent(what, compare, ops, key=key)
        except BackendError:
            with self._mutex:
                self._unsure[token] = None
                while len(self._unsure) > _UNSURE_KEPT:
                    del self._unsure[next(iter(self._unsure))]
            raise
        with self._mutex:
            earlier = self._unsure.pop(token, 0) is None
        return bool(reply.succeeded), resent or earlier, self._forget(token)

    # -- Store ------------------------------------------------------------------------------
    def acquire(self, key: str, owner: str, ttl: float, kind: str) -> int | None:
        return self._take(key, owner, ttl, kind, compare=self._exclusive(key), also=[])

    def _lease_of(
        self, what: str, hold: bytes, token: int, key: str, owner: str | None = None
    ) -> tuple[int, int] | None:
        """(lease, granted TTL) of this client's hold ``token`` at key ``hold``, or None (also
        if a hold this client does not know is not ``owner``'s)."""
        with self._mutex:
            known = self._holds.get(token)
        if known is not None:
            return known[0], known[1]
        reply = self.rpc.txn(what, [], [get(hold)], key=key)
        for kv in _kvs(reply, 0):
            mine = owner is None or _decode(kv).get("o") in (None, owner)
            if int(kv.create_revision) == token and kv.lease and mine:
                return int(kv.lease), 0
        return None

    def _renew(
        self, hold: bytes, key: str, token: int, ttl: float, owner: str | None = None
    ) -> bool:
        found = self._lease_of("renew", hold, token, key, owner)
        if found is None:
            return False
        lease, granted = found
        if granted == lease_seconds(ttl):
            if self.rpc.keepalive("renew", lease, key) <= 0:
                return False
            if token not in self._many:
                return True
            held = _kvs(self.rpc.txn("renew", [], [get(hold)], key=key), 0)
            return any(int(kv.create_revision) == token for kv in held)
        # another ttl: the hold moves to a new lease (its create revision, its token, stays)
        new, new_granted = self.rpc.grant("renew", ttl, key)
        moves = [put(hold, b"", new, keep_value=True)]
        if hold.endswith(b"\0l"):
            moves.append(_carry_value(hold[:-1] + b"v", token, new))
        reply = self.rpc.txn("renew", [created(hold, token)], moves, key=key)
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
        if self._others(token, owner):
            return False
        return self._renew(self._parts(key)[0], key, token, ttl, owner)

    def _end(self, hold: bytes, key: str, token: int) -> bool:
        """End the hold ``token`` at key ``hold``; an exclusive one leaves its record, with
        the time it ended and the token, for ``purge``. (Its lease, now without keys, runs
        out by itself.)"""
        record = hold[:-1] + b"r" if hold.endswith(b"\0l") else None
        ops = [delete(hold)]
        if record is not None:
            ops += [put(record, _ended(time.time(), 0, token)), delete(hold[:-1] + b"v")]
        done, resent, known = self._ending("release", token, [created(hold, token)], ops, key)
        if done:
            return True
        return resent and self._released(hold, record, token, known, key)

    def _released(
        self,
        hold: bytes,
        record: bytes | None,
        token: int,
        known: tuple[int, int, float] | None,
        key: str,
    ) -> bool:
        """Whether a copy of the release of ``token`` whose reply was lost ended the hold.

        Only the holder's release ends a hold while its lease lives (an expiry and
        ``force_release`` end the lease). An exclusive release also wrote the record naming
        the token: an acquire since then overwrote it, so the record is read as it was just
        before each later hold's acquire, going back until the token's."""
        shared = token in self._many
        if (
            known is not None
            and not shared
            and self.rpc.time_to_live("release", known[0], key)[0] >= 0
        ):
            return True
        if record is None:
            return False
        at = 0
        for _ in range(_HISTORY_STEPS):
            try:
                reply = self.rpc.txn("release", [], [get(record, at), get(hold, at)], key=key)
            except BackendError as exc:
                if "compacted" not in str(exc):
                    raise
                return False  # that revision is gone: nothing says it was released
            recs, held = _kvs(reply, 0), _kvs(reply, 1)
            named = _decode(recs[0]).get("x") if recs else None
            if not held and named == token:
                return True
            if held:
                before = int(held[0].create_revision)
            else:
                before = int(named or (recs[0].mod_revision if recs else 0))
            if before <= token:
                return False
            at = before - 1
        return False

    def release(self, key: str, owner: str, token: int) -> bool:
        hold = self._parts(key)[0]
        if self._others(token, owner) or not self._owned(hold, key, token, owner):
            return False
        return self._end(hold, key, token)

    def _owned(self, hold: bytes, key: str, token: int, owner: str) -> bool:
        """Whether hold ``token`` may be ``owner``'s: this client's own holds are known; one
        it does not know is read first (a rare path: one more round trip)."""
        with self._mutex:
            if token in self._owners:
                return True
        reply = self.rpc.txn("release", [], [get(hold)], key=key)
        return not any(
            int(kv.create_revision) == token and _decode(kv).get("o") not in (None, owner)
            for kv in _kvs(reply, 0)
        )

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

    def list_holds(self, prefix: str) -> list[LockInfo]:
        reply = self.rpc.txn("list", [], [get(self.prefix + prefix.encode(), whole_prefix=True)])
        return self._infos(_kvs(reply, 0))

    def force_release(self, key: str) -> bool:
        freed = False
        for kv in self._read("force_release", key)[1]:
            part = bytes(kv.key)[len(self._base(key)) :]
            if kv.lease and part == b"l" and "m" in _decode(kv):
                # acquire_many's hold shares its lease with the other keys: end this one alone
                done = self.rpc.txn(
                    "force_release", [created(bytes(kv.key), kv.create_revision)], [delete(kv.key)]
                )
                freed = bool(done.succeeded) or freed
            elif kv.lease and (part == b"l" or part.startswith(b"s/")):
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
        mine = self._parts(key)[2] + owner.encode()
        lease: tuple[int, int] | None = None
        sent = time.monotonic()
        try:
            for _ in range(_OPTIMISTIC_TRIES):
                rev, kvs = self._read("acquire", key)
                self._saw(key, rev)
                token = self._adopt(kvs, mine, lease, sent)
                if token is not None:
                    lease = None
                    return token
                peers = self._peers(kvs, key, kind, mine)
                if peers is None or (permits is not None and peers >= permits):
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

    def _peers(self, kvs: Kvs, key: str, kind: str, mine: bytes) -> int | None:
        """The shared holds of ``kind`` among ``kvs`` other than ``mine``; None: none may be
        taken now. A hold at ``mine`` (an earlier acquire's, its outcome unknown) is ended,
        to be taken again."""
        hold, _, shared, line = self._parts(key)
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
            if k == mine:
                self.rpc.txn("acquire", [created(mine, kv.create_revision)], [delete(mine)])
                self._forget(int(kv.create_revision))
                with contextlib.suppress(BackendError):
                    self.rpc.revoke("acquire", int(kv.lease), key)
        return peers

    def _adopt(
        self, kvs: Kvs, mine: bytes, lease: tuple[int, int] | None, sent: float
    ) -> int | None:
        """The token of the shared hold ``mine`` on ``lease``, granted to this call: put by a
        copy of its transaction whose reply was lost."""
        if lease is None:
            return None
        for kv in kvs:
            if bytes(kv.key) == mine and kv.lease == lease[0]:
                token = int(kv.create_revision)
                with self._mutex:
                    self._holds[token] = (lease[0], lease[1], sent)
                return token
        return None

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
            mine = (
                []
                if reply.succeeded
                else [kv for kv in _kvs(reply, 0) if _decode(kv).get("o") == owner]
            )
            own = [kv for kv in mine if int(kv.lease) == lease]  # a copy's, its reply lost
            if own or (reply.succeeded and not reply.responses[0].response_txn.succeeded):
                token = int(own[0].create_revision) if own else int(reply.header.revision)
                with self._mutex:
                    self._holds[token] = (lease, granted, sent)
                    self._owners[token] = owner
                return token
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
        done, resent, known = self._ending(
            "recording the once outcome",
            token,
            [created(hold, token)],
            [delete(hold), put(once, state.encode()), put(self._base(key) + b"t", _now())],
            key,
        )
        if not done and resent and known is not None:
            # a copy whose reply was lost recorded it if the lease is still alive: only the
            # holder deletes a hold whose lease is alive
            done = self.rpc.time_to_live("recording the once outcome", known[0], key)[0] >= 0
        if known is not None:
            with contextlib.suppress(BackendError):
                self.rpc.revoke("recording the once outcome", known[0], key)
        return done

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

    def _unsubscribed(self, sub: EtcdSubscription | EtcdManySubscription) -> None:
        with self._mutex:
            self._subs.discard(sub)

    # -- ManyKeys ---------------------------------------------------------------------------
    def acquire_many(self, keys: Sequence[str], owner: str, ttl: float) -> dict[str, int] | None:
        return self._take_many(keys, owner, ttl, None)

    def _queue_clear(self, key: str, place: int | None) -> Any:
        """Nobody in ``key``'s lock queue ahead of the entry created at revision ``place``
        (None: nobody in it at all, as for a newcomer)."""
        line = self._parts(key)[3] + b"lock/"
        return empty(line) if place is None else none_created_before(line, place)

    def _take_many(
        self,
        keys: Sequence[str],
        owner: str,
        ttl: float,
        places: dict[str, int | None] | None,
    ) -> dict[str, int] | None:
        """One lease, and one transaction whose compares are every key's conditions and
        whose puts put every hold on that lease: they are taken, and end, together. The
        holds' value names the lease, so a copy whose reply was lost is recognised.

        ``places``: None for a newcomer (nobody may be queued); else, a waiter with
        entries: key -> the create revision of ``owner``'s entry (None: it has none there),
        and the same transaction deletes them. A failed try's reply reads the queues, so
        entries other than those believed (one gone, or a copy of ``enqueue_many`` whose
        reply was lost) correct the compares for one more try."""
        first = keys[0]
        queued = places is not None
        sent = time.monotonic()
        lease, granted = self.rpc.grant("acquire", ttl, first)
        value = json.dumps({"o": owner, "k": "lock", "a": time.time(), "m": lease}).encode()
        ops: list[Any] = []
        reads = [get(self._parts(key)[0]) for key in keys]
        for key in keys:
            hold, line = self._parts(key)[0], self._parts(key)[3] + b"lock/"
            ops += [put(hold, value, lease), put(self._base(key) + b"r", _ended(None, granted))]
            if queued:
                ops.append(delete(line + owner.encode()))
                reads.append(get(line, whole_prefix=True))
        ended_mine = False
        for _ in range(3):
            conds: list[Any] = []
            for key in keys:
                # as acquire_fair: the key free, and nobody queued ahead (for a newcomer: at all)
                hold = self._parts(key)[0]
                place = places.get(key) if places is not None else None
                conds += [created(hold, 0), *self._exclusive(key), self._queue_clear(key, place)]
            reply = self.rpc.txn("acquire", conds, ops, reads, key=first)
            held = {} if reply.succeeded else {k: _kvs(reply, i) for i, k in enumerate(keys)}
            own = [kv for kvs in held.values() for kv in kvs if _decode(kv).get("m") == lease]
            if reply.succeeded or own:
                token = int(own[0].create_revision) if own else int(reply.header.revision)
                with self._mutex:
                    self._holds[token] = (lease, granted, sent)
                    self._owners[token] = owner
                    self._many[token] = None
                    while len(self._many) > _UNSURE_KEPT:  # never released: forget the oldest
                        del self._many[next(iter(self._many))]
                return dict.fromkeys(keys, token)
            for key in keys:
                self._saw(key, int(reply.header.revision))
            again = False
            mine = [kv for kvs in held.values() for kv in kvs if _decode(kv).get("o") == owner]
            if mine and not ended_mine:
                # owner's earlier holds (an acquire whose outcome its caller never learnt):
                # ended and taken again, so the tokens still grow
                self._end_mine(mine, first)
                ended_mine = again = True
            if places is not None:
                seen = self._places(reply, keys, owner)
                again = again or seen != places
                places = seen
            if not again:
                break
        with contextlib.suppress(BackendError):
            self.rpc.revoke("acquire", lease, first)
        return None

    def _end_mine(self, mine: Kvs, first: str) -> None:
        self.rpc.txn(
            "acquire",
            [created(bytes(kv.key), kv.create_revision) for kv in mine],
            [delete(bytes(kv.key)) for kv in mine],
            key=first,
        )
        for old in {int(kv.lease) for kv in mine}:
            with contextlib.suppress(BackendError):
                self.rpc.revoke("acquire", old, first)
        for kv in mine:
            self._forget(int(kv.create_revision))

    def _places(self, reply: Any, keys: Sequence[str], owner: str) -> dict[str, int | None]:
        """key -> the create revision of ``owner``'s lock queue entry (None: none), from a
        failed ``_take_many``'s reads of the queues (after the holds')."""
        found: dict[str, int | None] = {}
        for i, key in enumerate(keys):
            entry = self._entry_key(key, "lock", owner)
            revs = [int(kv.create_revision) for kv in _kvs(reply, len(keys) + i) if kv.key == entry]
            found[key] = revs[0] if revs else None
        return found

    def _own(self, what: str, tokens: Mapping[str, int], owner: str) -> dict[str, Any]:
        """key -> the hold of ``tokens`` that is live and ``owner``'s, read in one Range."""
        keys = sorted(tokens)
        reads = [get(self._parts(key)[0]) for key in keys]
        reply = self.rpc.txn(what, [], reads, key=keys[0] if keys else None)
        found = {}
        for i, key in enumerate(keys):
            for kv in _kvs(reply, i):
                if int(kv.create_revision) == tokens[key] and _decode(kv).get("o") == owner:
                    found[key] = kv
        return found

    def renew_many(self, tokens: Mapping[str, int], owner: str, ttl: float) -> bool:
        """One keep-alive of the holds' shared lease (another ttl: one new lease, every hold
        moved to it in one transaction), after a Range that finds every hold."""
        live = self._own("renew", tokens, owner)
        by_lease: dict[int, list[str]] = {}
        for key, kv in live.items():
            by_lease.setdefault(int(kv.lease), []).append(key)
        ok = len(live) == len(tokens)
        for lease, keys in by_lease.items():
            with self._mutex:
                known = self._holds.get(tokens[keys[0]])
            if known is not None and known[0] == lease and known[1] == lease_seconds(ttl):
                ok = self.rpc.keepalive("renew", lease, keys[0]) > 0 and ok
                continue
            new, new_granted = self.rpc.grant("renew", ttl, keys[0])
            moves = [
                Req(
                    request_txn=etcdrpc.TxnRequest(
                        compare=[created(self._parts(k)[0], tokens[k])],
                        success=[
                            put(self._parts(k)[0], b"", new, keep_value=True),
                            _carry_value(self._base(k) + b"v", tokens[k], new),
                        ],
                    )
                )
                for k in keys
            ]
            reply = self.rpc.txn("renew", [], moves, key=keys[0])
            moved = [r.response_txn.succeeded for r in reply.responses]
            ok = all(moved) and ok
            if not any(moved):
                self.rpc.revoke("renew", new, keys[0])
                continue
            with self._mutex:
                for k in keys:
                    start = self._holds.get(tokens[k], (0, 0, time.monotonic()))[2]
                    self._holds[tokens[k]] = (new, new_granted, start)
            with contextlib.suppress(BackendError):
                self.rpc.revoke("renew", lease, keys[0])
        return ok

    def release_many(self, tokens: Mapping[str, int], owner: str) -> bool:
        """One transaction that ends each hold of ``owner`` as ``release`` does, each key in a
        nested transaction of its own so a gone hold does not keep the others. Holds another
        client granted are read first (one Range), and their lease is revoked after."""
        keys = sorted(tokens)
        if not keys:
            return True
        with self._mutex:
            granted_here = all(self._owners.get(t) == owner for t in tokens.values())
        # holds this client granted to owner are ended by their tokens (create revisions) as
        # release ends one, without reading them first, and their lease runs out by itself;
        # others are read first, and only owner's live ones ended (their lease revoked)
        live: dict[str, Any] = (
            dict.fromkeys(keys) if granted_here else self._own("release", tokens, owner)
        )
        with self._mutex:
            earlier = {t for t in set(tokens.values()) if self._unsure.pop(t, 0) is None}
        ended = set(live)
        if live:
            steps = self._ending_many(live, tokens)
            try:
                reply, resent = self.rpc.txn_sent("release", [], steps, key=keys[0])
            except BackendError:
                with self._mutex:
                    for t in tokens.values():
                        self._unsure[t] = None
                    while len(self._unsure) > _UNSURE_KEPT:
                        del self._unsure[next(iter(self._unsure))]
                raise
            if resent:
                earlier |= set(tokens.values())
            ended = {
                k for k, r in zip(live, reply.responses, strict=True) if r.response_txn.succeeded
            }
        for key in keys:
            if key not in ended and tokens[key] in earlier:
                # a copy whose reply was lost may have ended it: its record names the token
                hold = self._parts(key)[0]
                if self._released(hold, self._base(key) + b"r", tokens[key], None, key):
                    ended.add(key)
        for lease in {int(kv.lease) for kv in live.values() if kv is not None}:
            with contextlib.suppress(BackendError):
                self.rpc.revoke("release", lease, keys[0])
        for token in set(tokens.values()):
            self._forget(token)
            with self._mutex:
                self._many.pop(token, None)
        return len(ended) == len(keys)

    def _ending_many(self, live: Mapping[str, Any], tokens: Mapping[str, int]) -> list[Any]:
        """A nested transaction per key of ``live`` (key -> its hold as read, or None) that
        ends the hold of its token, as ``release`` does (and, read, only as it was read)."""
        now = time.time()
        steps = []
        for key, kv in live.items():
            hold = self._parts(key)[0]
            compare = [created(hold, tokens[key])]
            if kv is not None:
                compare.append(
                    etcdrpc.Compare(
                        key=hold,
                        target=etcdrpc.Compare.MOD,
                        result=etcdrpc.Compare.EQUAL,
                        mod_revision=kv.mod_revision,
                    )
                )
            record = put(self._base(key) + b"r", _ended(now, 0, tokens[key]))
            value = delete(self._base(key) + b"v")
            inner = etcdrpc.TxnRequest(compare=compare, success=[delete(hold), record, value])
            steps.append(Req(request_txn=inner))
        return steps

    def subscribe_many(self, keys: Sequence[str], owner: str) -> Subscription | None:
        sub = EtcdManySubscription(self, keys, owner)
        with self._mutex:
            self._subs.add(sub)
        return sub

    # -- FairManyKeys -----------------------------------------------------------------------
    # A many-waiter's entry on each key is ``q/lock/<owner>``, the key a single-key lock
    # waiter's entry has: newcomers (``empty`` queue), queued waiters (nobody created before
    # them), readers and the single-key watches treat it as one. Its place is its create
    # revision, as every entry's: the entries of one ``enqueue_many`` are put by one
    # transaction, so they share one revision, and revisions are one order for the whole
    # cluster, so the order is common to all keys.
    def _many_entries(self, keys: Sequence[str], owner: str) -> list[bytes]:
        return [self._entry_key(key, "lock", owner) for key in keys]

    def _many_place(self, owner: str) -> int | None:
        """The create revision of ``owner``'s many-entries, as this client made them."""
        with self._mutex:
            known = self._queued_many.get(owner)
        return None if known is None else known[3]

    def enqueue_many(self, keys: Sequence[str], owner: str, ttl: float) -> None:
        """One lease for every entry, put by one transaction if none of them exists. Entries
        on that lease are this call's own (a copy whose reply was lost put them); others are
        an earlier arrival's: deleted first (etcd refuses a delete and a put of one key in
        one transaction), so the new ones take a fresh place."""
        first = keys[0]
        entries = self._many_entries(keys, owner)
        lease, granted = self.rpc.grant("queueing", ttl, first)
        for _ in range(3):
            reply = self.rpc.txn(
                "queueing",
                [created(e, 0) for e in entries],
                [put(e, b"", lease) for e in entries],
                [get(e) for e in entries],
                key=first,
            )
            found = [kv for i in range(len(keys)) for kv in _kvs(reply, i)]
            if reply.succeeded or (
                len(found) == len(keys) and all(kv.lease == lease for kv in found)
            ):
                rev = int(found[0].create_revision) if found else int(reply.header.revision)
                with self._mutex:
                    self._queued_many[owner] = (tuple(keys), lease, granted, rev)
                return
            self.rpc.txn("queueing", [], [delete(e) for e in entries], key=first)
            for old in {int(kv.lease) for kv in found} - {lease, 0}:
                with contextlib.suppress(BackendError):
                    self.rpc.revoke("queueing", old, first)
        with contextlib.suppress(BackendError):
            self.rpc.revoke("queueing", lease, first)
        raise BackendError(
            f"queueing failed on {self.safe_url} (keys {list(keys)!r}, table {self.table}): "
            "owner's entries kept being made again meanwhile"
        )

    def requeue_many(self, keys: Sequence[str], owner: str, ttl: float) -> bool:
        """A keep-alive of the entries' lease, then a transaction that finds every entry at
        its place (another ttl: one that moves them all to a new lease, keeping their
        place: a put keeps a key's create revision)."""
        with self._mutex:
            known = self._queued_many.get(owner)
        if known is None or known[0] != tuple(keys):
            return False
        _, lease, granted, rev = known
        first = keys[0]
        at_place = [created(e, rev) for e in self._many_entries(keys, owner)]
        if granted == lease_seconds(ttl):
            live = (
                self.rpc.keepalive("queueing", lease, first) > 0
                and self.rpc.txn("queueing", at_place, [], key=first).succeeded
            )
        else:
            new, new_granted = self.rpc.grant("queueing", ttl, first)
            moves = [put(e, b"", new, keep_value=True) for e in self._many_entries(keys, owner)]
            live = self.rpc.txn("queueing", at_place, moves, key=first).succeeded
            with contextlib.suppress(BackendError):
                self.rpc.revoke("queueing", lease if live else new, first)
            if live:
                with self._mutex:
                    self._queued_many[owner] = (tuple(keys), new, new_granted, rev)
        if not live:
            with self._mutex:
                self._queued_many.pop(owner, None)
        return bool(live)

    def dequeue_many(self, keys: Sequence[str], owner: str) -> None:
        """One transaction deleting the entries by key: it needs nothing this client
        remembers (an ``enqueue_many`` that failed may have made them). Their lease, with
        no key left, runs out by itself."""
        with self._mutex:
            self._queued_many.pop(owner, None)
        entries = self._many_entries(keys, owner)
        self.rpc.txn("leaving the queue", [], [delete(e) for e in entries], key=keys[0])

    def acquire_many_in_turn(
        self, keys: Sequence[str], owner: str, ttl: float
    ) -> dict[str, int] | None:
        """``acquire_many`` whose queue compare on each key is "no entry created before
        owner's" (a compare on the queue's key range, one transaction), and which deletes
        owner's entries with the puts."""
        place = self._many_place(owner)
        tokens = self._take_many(keys, owner, ttl, dict.fromkeys(keys, place))
        if tokens is not None:
            with self._mutex:
                self._queued_many.pop(owner, None)
        return tokens

    # -- LeaderPush (watch.py) ------------------------------------------------------------
    def watch_leader(self, key: str, heard: Callable[[], None]) -> Callable[[], None]:
        watch = EtcdLeaderWatch(self, key, heard)
        watch.start()
        self._leader_watches.add(watch)
        return watch.stop

    # -- LeaderValues -----------------------------------------------------------------------
    def proclaim(self, key: str, owner: str, token: int, value: str | None) -> bool:
        """One transaction: the value key put on the hold's lease if the hold key is still
        the one created at ``token`` on that lease. A hold this client granted is known
        here (owner, lease); another's is read first, as is one whose lease moved."""
        hold = self._parts(key)[0]
        with self._mutex:
            known_owner, known = self._owners.get(token), self._holds.get(token)
        if known_owner not in (None, owner):
            return False
        data = json.dumps({"t": token, "v": value}).encode()
        lease = known[0] if known_owner is not None and known is not None else None
        for _ in range(2):
            if lease is None:
                reply = self.rpc.txn("proclaiming", [], [get(hold)], key=key)
                found = [
                    int(kv.lease)
                    for kv in _kvs(reply, 0)
                    if int(kv.create_revision) == token
                    and kv.lease
                    and _decode(kv).get("o") == owner
                ]
                if not found:
                    return False
                lease = found[0]
            compare = [created(hold, token), _on_lease(hold, lease)]
            reply = self.rpc.txn(
                "proclaiming", compare, [put(hold[:-1] + b"v", data, lease)], key=key
            )
            if reply.succeeded:
                return True
            lease = None
        return False

    def leader(self, key: str) -> Leading | None:
        """One transaction reads the hold and the value key; the hold's lease is then read
        for its remaining TTL, as ``info`` does (two round trips: a lease is not a key).
        An observer's watch of ``key`` whose stream broke is set again first (what it missed
        meanwhile, this read sees)."""
        for watch in [w for w in self._leader_watches if w.key == key and w.broken]:
            with contextlib.suppress(BackendError):
                watch.start()
        hold = self._parts(key)[0]
        reply = self.rpc.txn("reading the leader", [], [get(hold), get(hold[:-1] + b"v")], key=key)
        locks = [kv for kv in _kvs(reply, 0) if _decode(kv).get("k", "lock") == "lock"]
        found = self._infos(locks)
        if not found:
            return None
        values = _kvs(reply, 1)
        data = _decode(values[0]) if values else {}
        if data.get("t") != found[0].token:  # none, or an earlier hold's
            return Leading(found[0], False, None)
        return Leading(found[0], True, data.get("v"))
