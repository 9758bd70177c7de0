"""The etcd store's plumbing: URL options, one gRPC client, calls with failover and wrapping.

The client is etcd-sdk-python (``pyetcd``, the maintained fork of python-etcd3): its
channel per endpoint, its authentication and its stubs. Requests are built here as the
protocol's own messages (``etcdrpc``) so that a transaction's compares may span a key range
and its reply's header (the cluster's revision) is kept. Every call is bounded by a gRPC
deadline; one that fails because its endpoint is unreachable marks that endpoint failed and
is sent once to each other endpoint. Such a call may have been applied by the cluster even
so (its reply was lost), so each operation is safe to resend, and a caller whose transaction's
outcome depends on it asks :meth:`Rpc.txn_sent` whether it was sent more than once (etcd.py).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

# gRPC's own log lines (an INFO line on every fork while a watch is open: `dblock run`'s
# child) are not for dblock's users; GRPC_VERBOSITY set by the user still wins
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import grpc
from pyetcd import etcdrpc
from pyetcd.client import Endpoint, MultiEndpointEtcd3Client

from ... import _forksafe
from ..._errors import BackendError, ConfigurationError
from ..._runtime import THREADS, Runtime
from ..._url import MAX_URL_TIMEOUT, DatabaseURL, scrub, scrub_exception, url_number

T = TypeVar("T")

#: the deadline of one call, seconds (a frozen node or a partition: the next endpoint)
CALL_DEADLINE = 5.0
#: the URL's query parameters
_PARAMS = {"connect_timeout", "ca_cert", "cert_key", "cert_cert"}
_TLS_ONLY = {"ca_cert", "cert_key", "cert_cert"}
#: codes that say the endpoint (not the request) failed: try another
_UNREACHABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
#: what the cluster refuses for good: these codes, or a message with one of these signs
_REFUSED = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED}
_REFUSED_SIGNS = (
    "authentication is not enabled",
    "authentication failed",
    "invalid user ID or password",
    "user name not found",
    "permission denied",
)

Req = etcdrpc.RequestOp
Cmp = etcdrpc.Compare


def endpoints(url: DatabaseURL) -> list[tuple[str, int]]:
    """``host:port[,host:port...]`` of the URL; ConfigurationError naming a bad part."""
    netloc = url.host or ""
    found = []
    for part in netloc.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep:
            host, port = part.strip(), "2379"
        host = host.strip("[]")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigurationError(
                f"invalid etcd URL {url.safe!r}: use etcd://host:port[,host:port...] "
                f"(bad endpoint {part!r})"
            )
        found.append((host, int(port)))
    return found


def options(url: DatabaseURL) -> dict[str, Any]:
    """The connection options of ``url`` (etcd:// or etcd+https://)."""
    tls = url.raw.split("://", 1)[0].lower() == "etcd+https"
    if url.database:
        raise ConfigurationError(
            f"invalid etcd URL {url.safe!r}: it takes no path (the lock table names the key "
            "prefix: connect(table=...))"
        )
    unknown = set(url.query) - _PARAMS
    if not tls:
        unknown |= set(url.query) & _TLS_ONLY
    if unknown:
        raise ConfigurationError(
            f"unknown etcd URL parameter(s) {sorted(unknown)} in {url.safe!r}; supported: "
            "connect_timeout, and for etcd+https:// ca_cert, cert_key, cert_cert"
        )
    if tls and "ca_cert" not in url.query:
        raise ConfigurationError(
            f"etcd+https URL {url.safe!r} needs ca_cert=<path of the cluster's CA certificate>"
        )
    if ("cert_key" in url.query) != ("cert_cert" in url.query):
        raise ConfigurationError(
            f"etcd URL {url.safe!r}: give both cert_key and cert_cert (a client certificate), "
            "or neither"
        )
    if (url.user is None) != (url.password is None):
        raise ConfigurationError(
            f"etcd URL {url.safe!r}: give both a user and a password, or neither"
        )
    timeout = url_number(
        url.query.get("connect_timeout"),
        "connect_timeout",
        CALL_DEADLINE,
        safe=url.safe,
        minimum=0.001,
        maximum=MAX_URL_TIMEOUT,
    )
    return {
        "endpoints": endpoints(url),
        "tls": tls,
        "timeout": timeout,
        "user": url.user,
        "password": url.password,
        **{k: url.query[k] for k in _TLS_ONLY if k in url.query},
    }


class Rpc:
    """One etcd client of a store: calls with failover, driver errors wrapped."""

    def __init__(self, opts: dict[str, Any], safe_url: str, table: str, secrets: tuple[str, ...]):
        self._opts = opts
        self.safe_url = safe_url
        self.table = table
        self._secrets = secrets
        self._client: Any = None
        self._pid = _forksafe.pid()
        self._closed = False
        self.rt: Runtime = THREADS

    # -- the client -----------------------------------------------------------------------
    def client(self) -> Any:
        if self._closed:
            raise BackendError(f"the client of {self.safe_url} (table {self.table}) is closed")
        if self._pid != _forksafe.pid():
            # a forked child: gRPC closes the parent's connections in it ("Stream removed
            # (Closed on fork)" on a call that raced the reconnection). Start afresh, without
            # closing the parent's client: that could speak on the parent's sockets.
            self._client, self._pid = None, _forksafe.pid()
        if self._client is None:
            self._client = self._connect()
        return self._client

    def _connect(self) -> Any:
        opts = self._opts
        creds = None
        if opts["tls"]:
            creds = MultiEndpointEtcd3Client.get_secure_creds(
                opts["ca_cert"], opts.get("cert_key"), opts.get("cert_cert")
            )
        eps = [
            Endpoint(h, p, secure=opts["tls"], creds=creds, time_retry=1.0)
            for h, p in opts["endpoints"]
        ]
        return MultiEndpointEtcd3Client(
            endpoints=eps,
            timeout=opts["timeout"],
            user=opts["user"],
            password=opts["password"],
            failover=True,
        )

    def close(self) -> None:
        self._closed = True
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()

    # -- calls ----------------------------------------------------------------------------
    def call(self, what: str, fn: Callable[[Any, tuple[Any, ...]], T], key: str | None = None) -> T:
        """``fn(client, call_args)`` (call_args: timeout, credentials, metadata for a stub),
        on another endpoint when this one is unreachable; BackendError otherwise."""
        tries = len(self._opts["endpoints"]) + 1
        for attempt in range(tries):
            try:
                result: T = self.rt.offload(self._once, fn)
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                if code in _UNREACHABLE and attempt + 1 < tries:
                    self._failed()
                    continue
                if code in _UNREACHABLE:
                    self._failed()
                # no endpoint answered: say so, not what was being done ("creating the lock
                # table failed" read as a problem with the table)
                doing = (
                    f"cannot connect to {self.safe_url}"
                    if code == grpc.StatusCode.UNAVAILABLE
                    else f"{what} failed on {self.safe_url}"
                )
                refusal = self._refusal(exc)
                if refusal is not None:
                    raise refusal from exc
                raise self._wrap(exc, doing, key) from exc
            except BackendError:
                raise
            except Exception as exc:
                if type(exc).__module__.startswith("pyetcd") and attempt + 1 < tries:
                    self._failed()  # no endpoint left for now: wait for one below
                    self.rt.sleep(0.2 * (attempt + 1))
                    continue
                if type(exc).__module__.startswith(("pyetcd", "grpc")):
                    raise self._wrap(exc, f"{what} failed on {self.safe_url}", key) from exc
                raise
            else:
                return result
        raise AssertionError("unreachable")  # pragma: no cover

    def _once(self, fn: Callable[[Any, tuple[Any, ...]], T]) -> T:
        client = self.client()
        return fn(client, (client.timeout, client.call_credentials, client.metadata))

    def _failed(self) -> None:
        client = self._client
        if client is None:
            return
        with contextlib.suppress(Exception):
            client.endpoint_in_use.fail()
            client._clear_old_stubs()
            # an endpoint failed moments ago may be the only one left: retry them all
            if all(ep.is_failed() for ep in client.endpoints.values()):
                for ep in client.endpoints.values():
                    ep.last_failed = 0

    def _refusal(self, exc: grpc.RpcError) -> ConfigurationError | None:
        """``ConfigurationError`` if the cluster refuses for good what the URL gave (its
        credentials, or credentials at all): retrying cannot help, the CLI exits 2."""
        code = exc.code() if hasattr(exc, "code") else None
        detail = str(exc.details() if hasattr(exc, "details") else "") or ""
        if code not in _REFUSED and not any(sign in detail for sign in _REFUSED_SIGNS):
            return None
        scrub_exception(exc, self._secrets)
        first = detail.strip().splitlines()[0] if detail.strip() else str(code)
        detail = scrub(first, self._secrets)
        if "not enabled" in detail:
            fix = "this cluster has no authentication: leave the user and password out of the URL"
        else:
            fix = "check the user and password in the URL, and the user's role"
        return ConfigurationError(f"{self.safe_url} refused the request: {detail} ({fix})")

    def _wrap(self, exc: BaseException, doing: str, key: str | None) -> BackendError:
        scrub_exception(exc, self._secrets)
        detail = exc.details() if isinstance(exc, grpc.RpcError) and hasattr(exc, "details") else ""
        detail = scrub(
            str(detail or exc).strip().splitlines()[0]
            if str(detail or exc).strip()
            else type(exc).__name__,
            self._secrets,
        )
        where = f" (table {self.table})" if key is None else f" (key {key!r}, table {self.table})"
        return BackendError(f"{doing}{where}: {detail}", key=key)

    # -- the operations -------------------------------------------------------------------
    def txn(
        self,
        what: str,
        compare: list[Any],
        success: list[Any],
        failure: list[Any] | None = None,
        key: str | None = None,
    ) -> Any:
        return self.txn_sent(what, compare, success, failure, key)[0]

    def txn_sent(
        self,
        what: str,
        compare: list[Any],
        success: list[Any],
        failure: list[Any] | None = None,
        key: str | None = None,
    ) -> tuple[Any, bool]:
        """The transaction's reply, and whether it was sent more than once: then an earlier
        copy, whose reply was lost, may have been applied before the one that answered."""
        request = etcdrpc.TxnRequest(compare=compare, success=success, failure=failure or [])
        sent = 0

        def op(client: Any, a: tuple[Any, ...]) -> Any:
            nonlocal sent
            sent += 1
            return client.kvstub.Txn(request, a[0], credentials=a[1], metadata=a[2])

        reply = self.call(what, op, key)
        return reply, sent > 1

    def grant(self, what: str, ttl: float, key: str | None = None) -> tuple[int, int]:
        """A new lease of ``ttl`` s (rounded up to whole seconds): (id, granted TTL)."""
        request = etcdrpc.LeaseGrantRequest(TTL=lease_seconds(ttl))

        def op(client: Any, a: tuple[Any, ...]) -> Any:
            return client.leasestub.LeaseGrant(request, a[0], credentials=a[1], metadata=a[2])

        reply = self.call(what, op, key)
        return int(reply.ID), int(reply.TTL)

    def keepalive(self, what: str, lease: int, key: str | None = None) -> int:
        """Renew ``lease`` to its granted TTL; its TTL now (0: it had expired or was revoked)."""

        def op(client: Any, a: tuple[Any, ...]) -> int:
            requests = iter([etcdrpc.LeaseKeepAliveRequest(ID=lease)])
            stream: Iterator[Any] = client.leasestub.LeaseKeepAlive(
                requests, a[0], credentials=a[1], metadata=a[2]
            )
            for reply in stream:
                return int(reply.TTL)
            return 0

        return self.call(what, op, key)

    def revoke(self, what: str, lease: int, key: str | None = None) -> bool:
        """Revoke ``lease`` (its keys go with it); False if it had already ended."""
        request = etcdrpc.LeaseRevokeRequest(ID=lease)

        def op(client: Any, a: tuple[Any, ...]) -> bool:
            try:
                client.leasestub.LeaseRevoke(request, a[0], credentials=a[1], metadata=a[2])
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    return False
                raise
            return True

        return self.call(what, op, key)

    def time_to_live(self, what: str, lease: int, key: str | None = None) -> tuple[int, int]:
        """(remaining TTL, granted TTL) of ``lease`` as the cluster reports it (-1: gone)."""
        request = etcdrpc.LeaseTimeToLiveRequest(ID=lease)

        def op(client: Any, a: tuple[Any, ...]) -> tuple[int, int]:
            reply = client.leasestub.LeaseTimeToLive(request, a[0], credentials=a[1], metadata=a[2])
            return int(reply.TTL), int(reply.grantedTTL)

        return self.call(what, op, key)


def lease_seconds(ttl: float) -> int:
    """etcd's lease TTL for ``ttl`` s: whole seconds, never shorter than asked."""
    return max(1, math.ceil(ttl - 1e-9))


# -- message builders --------------------------------------------------------------------


def prefix_end(prefix: bytes) -> bytes:
    """The end of the key range of every key that starts with ``prefix``."""
    trimmed = prefix.rstrip(b"\xff")
    return trimmed[:-1] + bytes([trimmed[-1] + 1]) if trimmed else b"\0"


def created(key: bytes, rev: int) -> Any:
    """``key`` was created at revision ``rev`` (0: it does not exist)."""
    return Cmp(key=key, target=Cmp.CREATE, result=Cmp.EQUAL, create_revision=rev)


def _every(prefix: bytes, target: str, result: Any, rev: int) -> Any:
    """A compare that every key of the range starting with ``prefix`` must pass (an empty
    range is compared as one key whose revisions are 0)."""
    return Cmp(
        key=prefix,
        range_end=prefix_end(prefix),
        target=Cmp.MOD if target == "mod" else Cmp.CREATE,
        result=result,
        **{f"{target}_revision": rev},
    )


def empty(prefix: bytes) -> Any:
    """Every key of the range has mod revision < 1: the range has no key."""
    return _every(prefix, "mod", Cmp.LESS, 1)


def none_created_before(prefix: bytes, rev: int) -> Any:
    """No key of the range was created before revision ``rev`` (and the range has one)."""
    return _every(prefix, "create", Cmp.GREATER, rev - 1)


def unchanged_since(prefix: bytes, rev: int) -> Any:
    """No key of the range was written after revision ``rev``."""
    return _every(prefix, "mod", Cmp.LESS, rev + 1)


def put(key: bytes, value: bytes, lease: int = 0, keep_value: bool = False) -> Any:
    if keep_value:
        return Req(request_put=etcdrpc.PutRequest(key=key, lease=lease, ignore_value=True))
    return Req(request_put=etcdrpc.PutRequest(key=key, value=value, lease=lease))


def get(key: bytes, at: int = 0, whole_prefix: bool = False) -> Any:
    """Read ``key`` (and with ``whole_prefix`` every key it starts), as of revision ``at``
    (0: now)."""
    end = prefix_end(key) if whole_prefix else b""
    return Req(request_range=etcdrpc.RangeRequest(key=key, range_end=end, revision=at))


def delete(key: bytes, whole_prefix: bool = False) -> Any:
    end = prefix_end(key) if whole_prefix else b""
    return Req(request_delete_range=etcdrpc.DeleteRangeRequest(key=key, range_end=end))
