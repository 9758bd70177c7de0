"""``dblock dashboard``: a live web page of the current holds (the ``dashboard`` extra).

One page (``page.html``) polls ``/api/state`` every second; ``/metrics`` serves what the store
holds now in the Prometheus text format. Holds and once-records come from the public client
API (``list``, ``state``, ``force_release``); waiters from the store's wait queue where it
keeps one that can be listed (the SQL stores: ``QueueView``). Read-only unless started with
``allow_force_release``: then ``POST /api/release`` frees a hold, given the one-time secret.

Every request must be addressed (its ``Host``) to the address it listens on, ``localhost`` or
a name in ``allowed_hosts``: a web page elsewhere could otherwise read every key, owner and
token through DNS rebinding (its own name made to resolve to this address). A request that
fails that check, or is malformed, gets 400 and one log line, never a traceback.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import secrets
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from importlib import resources
from typing import Any

from .._contract import QueueView, provides
from .._errors import ConfigurationError
from .._types import LockInfo
from ..observability import DEFAULT_MAX_PREFIXES, OTHER, key_prefix

try:
    import uvicorn
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import GaugeMetricFamily
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse, Response
    from starlette.routing import Route
except ImportError as exc:  # pragma: no cover - depends on the extras installed
    raise ConfigurationError(
        f"dblock dashboard needs its extra: pip install 'dblock[dashboard]' ({exc})"
    ) from exc

#: once-records the page keeps showing after their hold ended (most recent first)
ONCE_KEEP = 200
SECRET_HEADER = "x-dblock-secret"  # noqa: S105 - a header's name, not a secret

log = logging.getLogger("dblock.dashboard")


@dataclass
class Settings:
    """What the dashboard serves and allows."""

    allow_force_release: bool = False
    #: the one-time secret a force-release needs (made at start-up when allowed)
    secret: str = field(default_factory=lambda: secrets.token_urlsafe(18))
    poll_ms: int = 1000
    #: the address it listens on (``serve`` sets it): requests addressed to it are answered
    host: str = "127.0.0.1"
    #: further names requests may be addressed to (``--allowed-host``), besides ``localhost``
    allowed_hosts: tuple[str, ...] = ()


def host_allowed(header: str | None, settings: Settings) -> bool:
    """Is a request whose ``Host`` header is ``header`` addressed to this dashboard?

    Yes for ``localhost``, a name in ``settings.allowed_hosts``, the address it listens on,
    and a loopback address. Listening on every address (``0.0.0.0``, ``::``), any IP address
    is one of its own: only a name can be rebound to it, and names need ``allowed_hosts``."""
    if not header:
        return False
    name = header.strip().lower()
    if name.startswith("["):  # [IPv6]:port
        name = name[1:].partition("]")[0]
    elif name.count(":") == 1:
        name = name.partition(":")[0]
    name = name.rstrip(".")
    bound = settings.host.strip("[]").lower()
    if name in ("localhost", bound) or name in {h.lower() for h in settings.allowed_hosts}:
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    try:
        every = ipaddress.ip_address(bound).is_unspecified
    except ValueError:
        every = False
    return address.is_loopback or every


class _HostCheck:
    """ASGI middleware: 400 for a request not addressed to this dashboard (``host_allowed``)."""

    def __init__(self, app: Any, settings: Settings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            host = next((v for k, v in scope["headers"] if k == b"host"), b"")
            header = host.decode("latin-1")
            if not host_allowed(header, self.settings):
                log.warning(
                    "dashboard: refused a request for host %r (not its address, localhost or an "
                    "--allowed-host name)",
                    header,
                )
                response = JSONResponse(
                    {"error": "host not allowed: start the dashboard with --allowed-host NAME"},
                    400,
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _Onces:
    """Once keys the dashboard has seen held, to show their state after the hold ends.

    A held one is ``processing``; a ``succeeded`` one stays so (until purged), so only the
    others are asked about at each poll."""

    def __init__(self) -> None:
        self._states: dict[str, str | None] = {}
        self._mutex = threading.Lock()

    def states(self, holds: list[LockInfo], state: Callable[[str], str | None]) -> list[Any]:
        held = {info.key for info in holds if info.kind == "once"}
        with self._mutex:
            for key in held:
                self._states.pop(key, None)
                self._states[key] = "processing"
            while len(self._states) > ONCE_KEEP:
                self._states.pop(next(iter(self._states)))
            ask = [k for k, v in self._states.items() if k not in held and v != "succeeded"]
        found = {key: state(key) for key in ask}
        with self._mutex:
            for key, value in found.items():
                if key in self._states:
                    self._states[key] = value
            return [{"key": k, "state": v} for k, v in reversed(self._states.items())]


def _seconds(moment: datetime | None, now: datetime) -> float | None:
    return None if moment is None else (moment - now).total_seconds()


def snapshot(client: Any, seen: _Onces) -> dict[str, Any]:
    """The page's data: every current hold, and the once-records seen."""
    holds = client.list()
    now = datetime.now(timezone.utc)
    rows = []
    for info in holds:
        held_for = -(_seconds(info.acquired_at, now) or 0.0)
        left = _seconds(info.expires_at, now)
        lease = None if info.expires_at is None else (info.expires_at - info.acquired_at)
        total = None if lease is None else lease.total_seconds()
        rows.append(
            {
                "key": info.key,
                "prefix": key_prefix(info.key),
                "kind": info.kind,
                "owner": info.owner,
                "token": info.token,
                "acquired_at": info.acquired_at.isoformat(),
                "held_for": round(held_for, 3),
                "lease_left": None if left is None else round(max(left, 0.0), 3),
                "lease_fraction": (
                    None if left is None or not total else round(min(max(left / total, 0), 1), 4)
                ),
            }
        )
    onces = seen.states(holds, client.state)
    return {"now": now.isoformat(), "holds": rows, "once": onces, "waiters": waiters(client, now)}


def waiters(client: Any, now: datetime) -> list[dict[str, Any]] | None:
    """Who waits for which key, in queue order; None where the store cannot list them."""
    store = getattr(client, "_store", None)
    if not provides(store, QueueView):
        return None
    return [
        {
            "key": entry.key,
            "prefix": key_prefix(entry.key),
            "kind": entry.kind,
            "owner": entry.owner,
            "waiting_for": round(max(0.0, -(_seconds(entry.acquired_at, now) or 0.0)), 3),
        }
        for entry in store.waiters("")
    ]


class _StoreCollector:
    """``/metrics``: what the store holds now, by key prefix and kind; the prefixes past the
    ``max_prefixes`` that hold the most are folded into ``(other)``, as ``enable_metrics``
    folds them (100,000 prefixes would otherwise make a scrape of 200,000 samples)."""

    def __init__(self, client: Any, max_prefixes: int = DEFAULT_MAX_PREFIXES) -> None:
        self._client = client
        self._max_prefixes = max_prefixes

    def collect(self) -> Iterator[GaugeMetricFamily]:
        holds = self._client.list()
        now = datetime.now(timezone.utc)
        count = GaugeMetricFamily(
            "dblock_store_holds", "Current holds in the lock table", labels=["prefix", "kind"]
        )
        oldest = GaugeMetricFamily(
            "dblock_store_oldest_hold_seconds",
            "How long the oldest current hold has been held",
            labels=["prefix", "kind"],
        )
        per_prefix = Counter(key_prefix(info.key) for info in holds)
        kept = {p for p, _ in per_prefix.most_common(self._max_prefixes)}
        counts: dict[tuple[str, str], int] = {}
        ages: dict[tuple[str, str], float] = {}
        for info in holds:
            prefix = key_prefix(info.key)
            labels = (prefix if prefix in kept else OTHER, info.kind)
            counts[labels] = counts.get(labels, 0) + 1
            age = (now - info.acquired_at).total_seconds()
            ages[labels] = max(ages.get(labels, 0.0), age)
        for labels, n in sorted(counts.items()):
            count.add_metric(list(labels), n)
            oldest.add_metric(list(labels), ages[labels])
        yield count
        yield oldest


def make_app(client: Any, settings: Settings | None = None) -> Starlette:
    """The ASGI app over a blocking ``dblock.Client`` (its calls run in worker threads)."""
    settings = settings or Settings()
    onces = _Onces()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_StoreCollector(client))
    page = resources.files(__name__).joinpath("page.html").read_text(encoding="utf-8")
    config = {
        "url": client.url,
        "table": client.table,
        "forceRelease": settings.allow_force_release,
        "pollMs": settings.poll_ms,
    }
    page = page.replace("/*CONFIG*/null", _script_json(config))

    async def index(request: Request) -> Response:
        return HTMLResponse(page, headers={"Cache-Control": "no-store"})

    async def state(request: Request) -> Response:
        data = await run_in_threadpool(snapshot, client, onces)
        return JSONResponse(data, headers={"Cache-Control": "no-store"})

    async def metrics(request: Request) -> Response:
        body = await run_in_threadpool(generate_latest, registry)
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def release(request: Request) -> Response:
        if not settings.allow_force_release:
            return JSONResponse({"error": "read-only: start with --allow-force-release"}, 404)
        given = request.headers.get(SECRET_HEADER, "")
        if not secrets.compare_digest(given.encode(), settings.secret.encode()):
            return JSONResponse({"error": "wrong or missing secret"}, 403)
        try:
            body = json.loads(await request.body())
        except ValueError as exc:  # not JSON, not UTF-8: the caller's mistake, not a 500
            log.warning("dashboard: refused a release request whose body is not JSON: %s", exc)
            return JSONResponse({"error": 'the body must be JSON: {"key": KEY}'}, 400)
        key = body.get("key") if isinstance(body, dict) else None
        if not isinstance(key, str):
            return JSONResponse({"error": "give the key"}, 400)
        try:
            freed = await run_in_threadpool(client.force_release, key)
        except (TypeError, ValueError) as exc:
            return JSONResponse({"error": str(exc)}, 400)
        return JSONResponse({"released": freed})

    return Starlette(
        routes=[
            Route("/", index),
            Route("/api/state", state),
            Route("/api/release", release, methods=["POST"]),
            Route("/metrics", metrics),
        ],
        middleware=[Middleware(_HostCheck, settings=settings)],
    )


def _script_json(value: object) -> str:
    """JSON that cannot end the <script> it sits in."""
    text = json.dumps(value)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(client: Any, host: str, port: int, settings: Settings) -> None:
    """Serve until Ctrl-C (``dblock dashboard``)."""
    app = make_app(client, replace(settings, host=host))
    uvicorn.run(app, host=host, port=port, log_level="warning")
