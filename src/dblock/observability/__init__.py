"""Metrics, traces and logs of this process's locks. See docs/observability.md.

>>> from dblock import observability
>>> observability.enable_metrics()        # prometheus-client's default registry
>>> observability.enable_tracing()        # the OpenTelemetry API (the ``otel`` extra)

Both are process-wide and cover every client, blocking and async, and every primitive. Logs
need nothing: the ``dblock`` logger reports grants and releases at DEBUG, losses and failed
renewals at WARNING, with ``key``, ``owner``, ``token``, ``kind`` and ``backend`` as record
attributes (``extra=``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from .._errors import ConfigurationError
from .._observe import LockEvent, Observer, Outcome, add, remove
from ._prefix import DEFAULT_MAX_PREFIXES, OTHER, key_prefix

if TYPE_CHECKING:
    from ._prometheus import PrometheusMetrics
    from ._tracing import Tracing

__all__ = [
    "DEFAULT_MAX_PREFIXES",
    "OTHER",
    "LockEvent",
    "Observer",
    "Outcome",
    "add_observer",
    "enable_metrics",
    "enable_tracing",
    "key_prefix",
    "metrics_text",
    "remove_observer",
]


def add_observer(observer: Observer) -> None:
    """Report every lock event of this process to ``observer`` (see :class:`Observer`)."""
    add(observer)


def remove_observer(observer: Observer) -> None:
    """Stop reporting to ``observer`` (the metrics of ``enable_metrics`` also leave their
    registry)."""
    remove(observer)
    unregister = getattr(observer, "unregister", None)
    if callable(unregister):
        unregister()


def enable_metrics(
    registry: Any = None,
    *,
    raw_keys: bool = False,
    prefix: Callable[[str], str] = key_prefix,
    max_prefixes: int = DEFAULT_MAX_PREFIXES,
) -> PrometheusMetrics:
    """Export Prometheus metrics (needs the ``prometheus`` extra), labelled by backend and key
    prefix (``prefix(key)``: by default the key up to its first ``:``). ``raw_keys=True``
    labels by the whole key instead: only for a small, fixed set of keys (every label value
    is a time series kept for the process's life). At most ``max_prefixes`` distinct prefixes
    (or keys) get series of their own; later ones are counted under the prefix ``(other)``,
    and ``dblock_folded_acquisitions_total`` counts those acquire calls. ``registry``
    defaults to prometheus-client's default ``REGISTRY``. Returns the observer
    (``remove_observer`` it to stop)."""
    if isinstance(max_prefixes, bool) or not isinstance(max_prefixes, int):
        raise TypeError(f"max_prefixes must be an int, not {type(max_prefixes).__name__}")
    if max_prefixes < 1:
        raise ConfigurationError(f"max_prefixes must be at least 1, not {max_prefixes}")
    from ._prometheus import PrometheusMetrics

    metrics = PrometheusMetrics(
        registry, (lambda key: key) if raw_keys else prefix, max_prefixes=max_prefixes
    )
    add(metrics)
    return metrics


def enable_tracing(tracer_provider: Any = None) -> Tracing:
    """A span per acquire (``dblock.acquire``, the wait included) and one per lease loss, via
    the OpenTelemetry API (the app configures the SDK and exporter). Without
    ``opentelemetry-api`` installed it raises ``ConfigurationError`` naming the ``otel``
    extra, as :func:`enable_metrics` does without prometheus-client."""
    from ._tracing import Tracing

    tracing = Tracing(tracer_provider)
    add(cast("Observer", tracing))  # it leaves out the hooks it has no use for
    return tracing


def metrics_text(registry: Any = None) -> bytes:
    """The Prometheus text exposition of ``registry`` (default: the default registry), for
    apps that serve ``/metrics`` themselves."""
    from prometheus_client import REGISTRY, generate_latest

    return generate_latest(REGISTRY if registry is None else registry)
