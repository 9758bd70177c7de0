"""OpenTelemetry spans of this process's locks, through the API only (no SDK needed).

A span ``dblock.acquire`` covers each acquire call, the wait included; it is started with the
call's start time when the call ends, so an acquire costs nothing extra while it waits, and
its attributes are made only for a span that records (an SDK is installed and samples it).
With no SDK behind the API (the global provider still the API's proxy) no span is started. A
lease loss becomes a span ``dblock.lease_lost`` with a ``lease lost`` event, linked to the span
of the acquire that granted the hold.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from .._errors import ConfigurationError
from .._observe import LockEvent, Outcome

try:
    from opentelemetry import trace
except ImportError as exc:  # pragma: no cover - depends on the extras installed
    # as enable_metrics does: a silent no-op would leave a user looking for spans that never
    # come
    raise ConfigurationError(
        "dblock tracing needs the OpenTelemetry API: pip install 'dblock[otel]'"
    ) from exc

#: grants whose span a later loss links to, at most this many (the oldest are forgotten)
_KEEP = 10_000
#: the API's global provider until an SDK's is set
_PROXY: Any = getattr(trace, "ProxyTracerProvider", None)
#: providers with no SDK behind them: every span they start is a non-recording one
_NO_SDK = tuple(t for t in (_PROXY, getattr(trace, "NoOpTracerProvider", None)) if t is not None)
#: the API's global provider could not be read: ask get_tracer_provider() every time
_UNKNOWN = object()


class Tracing:
    """The observer behind :func:`dblock.observability.enable_tracing`."""

    def __init__(self, tracer_provider: Any = None) -> None:
        self._tracer: Any = None
        if _PROXY is not None and isinstance(tracer_provider, _PROXY):
            tracer_provider = None  # the global proxy: the SDK may be set behind it later
        self._provider = tracer_provider
        self._tracer = trace.get_tracer("dblock", tracer_provider=tracer_provider)
        self._grants: dict[tuple[str, str, int], Any] = {}
        self._mutex = threading.Lock()

    @staticmethod
    def _attributes(event: LockEvent) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            "dblock.key": event.key,
            "dblock.backend": event.backend,
            "dblock.kind": event.kind,
        }
        if event.token is not None:
            attributes["dblock.token"] = event.token
        return attributes

    def acquired(
        self, event: LockEvent, outcome: Outcome, wait: float, error: BaseException | None
    ) -> None:
        provider = self._provider
        if provider is None:
            # get_tracer_provider() looks up an environment variable on every call (a few
            # Python calls deep), which showed in the acquire rate. While the API's global
            # stays unset no SDK is behind it: a provider named by that variable was made
            # when get_tracer() in __init__ asked for the global one
            if getattr(trace, "_TRACER_PROVIDER", _UNKNOWN) is None:
                return
            provider = trace.get_tracer_provider()
        if isinstance(provider, _NO_SDK):
            return  # not even a span to start: the API's no-op one costs more than the check
        end = time.time_ns()
        span = self._tracer.start_span("dblock.acquire", start_time=end - int(wait * 1e9))
        if not span.is_recording():
            return  # no SDK, or not sampled: nothing would keep what follows
        attributes = self._attributes(event)
        attributes["dblock.outcome"] = outcome
        attributes["dblock.wait_seconds"] = wait
        if event.reentry:
            attributes["dblock.reentry"] = True
        span.set_attributes(attributes)
        if error is not None and outcome == "error":
            span.record_exception(error)
            span.set_status(trace.StatusCode.ERROR, str(error))
        span.end(end_time=end)
        if outcome == "granted" and not event.reentry and event.token is not None:
            with self._mutex:
                if len(self._grants) >= _KEEP:
                    self._grants.pop(next(iter(self._grants)))
                self._grants[(event.key, event.owner or "", event.token)] = span.get_span_context()

    def _forget(self, event: LockEvent) -> Any:
        if not self._grants:  # nothing recorded (no SDK): no lock to take
            return None
        with self._mutex:
            return self._grants.pop((event.key, event.owner or "", event.token or 0), None)

    def released(self, event: LockEvent, held: float, lost: bool) -> None:
        self._forget(event)

    def lost(self, event: LockEvent) -> None:
        granted = self._forget(event)
        links = [trace.Link(granted)] if granted is not None else []
        attributes = self._attributes(event)
        attributes["dblock.owner"] = event.owner or ""
        with self._tracer.start_as_current_span(
            "dblock.lease_lost", links=links, attributes=attributes
        ) as span:
            span.add_event("lease lost", attributes=attributes)
            span.set_status(trace.StatusCode.ERROR, "lease lost")
