"""Prometheus metrics of this process's locks (the ``prometheus`` extra)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._errors import ConfigurationError
from .._observe import LockEvent, Outcome

try:
    from prometheus_client import REGISTRY, Counter, Gauge, Histogram
except ImportError as exc:  # pragma: no cover - depends on the extras installed
    raise ConfigurationError(
        "dblock metrics need prometheus-client: pip install 'dblock[prometheus]'"
    ) from exc

#: lock waits and holds range from milliseconds to many minutes
BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
LABELS = ("backend", "prefix", "kind")


class PrometheusMetrics:
    """The observer behind :func:`dblock.observability.enable_metrics`."""

    def __init__(self, registry: Any, prefix: Callable[[str], str]) -> None:
        self._prefix = prefix
        reg = REGISTRY if registry is None else registry
        self.acquisitions = Counter(
            "dblock_acquisitions",
            "Acquire calls by outcome: granted, busy (not waiting), timeout, error, cancelled",
            [*LABELS, "outcome"],
            registry=reg,
        )
        self.wait = Histogram(
            "dblock_wait_seconds",
            "Time an acquire call took, the wait included, by outcome",
            [*LABELS, "outcome"],
            buckets=BUCKETS,
            registry=reg,
        )
        self.hold = Histogram(
            "dblock_hold_seconds",
            "Time from grant to final release",
            LABELS,
            buckets=BUCKETS,
            registry=reg,
        )
        self.lost_leases = Counter(
            "dblock_leases_lost", "Holds whose lease was found lost", LABELS, registry=reg
        )
        self.renewals_failed = Counter(
            "dblock_renewals_failed",
            "Background renewals that failed (retried while the lease may last)",
            LABELS,
            registry=reg,
        )
        self.holds = Gauge("dblock_holds", "Holds of this process now", LABELS, registry=reg)
        self.waiters = Gauge(
            "dblock_waiters", "Acquire calls of this process waiting now", LABELS, registry=reg
        )

    def _labels(self, event: LockEvent) -> tuple[str, str, str]:
        return (event.backend, self._prefix(event.key), event.kind)

    def waiting(self, event: LockEvent, delta: int) -> None:
        self.waiters.labels(*self._labels(event)).inc(delta)

    def acquired(
        self, event: LockEvent, outcome: Outcome, wait: float, error: BaseException | None
    ) -> None:
        labels = self._labels(event)
        self.acquisitions.labels(*labels, outcome).inc()
        self.wait.labels(*labels, outcome).observe(wait)
        if outcome == "granted" and not event.reentry:
            self.holds.labels(*labels).inc()

    def released(self, event: LockEvent, held: float, lost: bool) -> None:
        labels = self._labels(event)
        self.hold.labels(*labels).observe(held)
        self.holds.labels(*labels).dec()

    def lost(self, event: LockEvent) -> None:
        self.lost_leases.labels(*self._labels(event)).inc()

    def renewal_failed(self, event: LockEvent, error: BaseException) -> None:
        self.renewals_failed.labels(*self._labels(event)).inc()
