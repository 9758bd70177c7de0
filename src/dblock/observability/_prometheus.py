"""Prometheus metrics of this process's locks (the ``prometheus`` extra).

The hooks only add to plain numbers under one lock per series; prometheus-client reads them
when scraped (a custom collector). Updating its Counter/Histogram objects on every event
costs several locks and layers per acquire, which showed in the acquire rate (bench ``obs``).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterator
from typing import Any

from .._errors import ConfigurationError
from .._observe import LockEvent, Outcome

try:
    from prometheus_client import REGISTRY
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
    )
except ImportError as exc:  # pragma: no cover - depends on the extras installed
    raise ConfigurationError(
        "dblock metrics need prometheus-client: pip install 'dblock[prometheus]'"
    ) from exc

#: lock waits and holds range from milliseconds to many minutes
BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
LABELS = ["backend", "prefix", "kind"]
#: keys whose series the metrics remember by key (beyond it they start over)
_KEYS_REMEMBERED = 4096


class _Histogram:
    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)  # the last one: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS, value)] += 1
        self.sum += value

    def buckets(self) -> list[tuple[str, float]]:
        out, total = [], 0
        for bound, n in zip((*map(str, BUCKETS), "+Inf"), self.counts, strict=True):
            total += n
            out.append((bound, float(total)))
        return out


class _Series:
    """The numbers of one (backend, prefix, kind); every change under ``mutex``."""

    __slots__ = (
        "acquisitions",
        "held",
        "holds",
        "lost",
        "mutex",
        "renewals_failed",
        "waiters",
        "waits",
    )

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.acquisitions: dict[str, int] = {}
        self.waits: dict[str, _Histogram] = {}
        self.held = _Histogram()
        self.holds = 0
        self.waiters = 0
        self.lost = 0
        self.renewals_failed = 0


class PrometheusMetrics:
    """The observer behind :func:`dblock.observability.enable_metrics`, and the collector
    that exports what it counted."""

    def __init__(self, registry: Any, prefix: Callable[[str], str]) -> None:
        self._prefix = prefix
        self._series: dict[tuple[str, str, str], _Series] = {}
        self._by_key: dict[tuple[str, str, str], _Series] = {}
        self._registry = REGISTRY if registry is None else registry
        self._registry.register(self)

    def unregister(self) -> None:
        self._registry.unregister(self)

    def _of(self, event: LockEvent) -> _Series:
        # by (backend, key, kind) first: a key's prefix is worked out once, not per event
        found = self._by_key.get((event.backend, event.key, event.kind))
        if found is not None:
            return found
        labels = (event.backend, self._prefix(event.key), event.kind)
        series = self._series.get(labels)
        if series is None:
            series = self._series.setdefault(labels, _Series())
        if len(self._by_key) >= _KEYS_REMEMBERED:
            self._by_key.clear()  # many keys: start over (the series stay)
        self._by_key[(event.backend, event.key, event.kind)] = series
        return series

    # -- the hooks ------------------------------------------------------------------------
    def acquiring(self, event: LockEvent) -> None:
        series = self._of(event)
        with series.mutex:
            series.waiters += 1

    def acquired(
        self, event: LockEvent, outcome: Outcome, wait: float, error: BaseException | None
    ) -> None:
        series = self._of(event)
        with series.mutex:
            series.waiters -= 1
            series.acquisitions[outcome] = series.acquisitions.get(outcome, 0) + 1
            histogram = series.waits.get(outcome)
            if histogram is None:
                histogram = series.waits[outcome] = _Histogram()
            histogram.observe(wait)
            if outcome == "granted" and not event.reentry:
                series.holds += 1

    def released(self, event: LockEvent, held: float, lost: bool) -> None:
        series = self._of(event)
        with series.mutex:
            series.held.observe(held)
            series.holds -= 1

    def lost(self, event: LockEvent) -> None:
        series = self._of(event)
        with series.mutex:
            series.lost += 1

    def renewal_failed(self, event: LockEvent, error: BaseException) -> None:
        series = self._of(event)
        with series.mutex:
            series.renewals_failed += 1

    # -- the collector --------------------------------------------------------------------
    def describe(self) -> list[Metric]:
        return []  # nothing to check at registration: the names are dblock's own

    def collect(self) -> Iterator[Metric]:
        acquisitions = CounterMetricFamily(
            "dblock_acquisitions",
            "Acquire calls by outcome: granted, busy (not waiting), timeout, error, cancelled",
            labels=[*LABELS, "outcome"],
        )
        waits = HistogramMetricFamily(
            "dblock_wait_seconds",
            "Time an acquire call took, the wait included, by outcome",
            labels=[*LABELS, "outcome"],
        )
        held = HistogramMetricFamily(
            "dblock_hold_seconds", "Time from grant to final release", labels=LABELS
        )
        lost = CounterMetricFamily(
            "dblock_leases_lost", "Holds whose lease was found lost", labels=LABELS
        )
        renewals = CounterMetricFamily(
            "dblock_renewals_failed",
            "Background renewals that failed (retried while the lease may last)",
            labels=LABELS,
        )
        holds = GaugeMetricFamily("dblock_holds", "Holds of this process now", labels=LABELS)
        waiters = GaugeMetricFamily(
            "dblock_waiters",
            "Acquire calls of this process in progress now (waiting for the lock)",
            labels=LABELS,
        )
        for labels, series in sorted(self._series.items()):
            names = list(labels)
            with series.mutex:
                for outcome, n in sorted(series.acquisitions.items()):
                    acquisitions.add_metric([*names, outcome], n)
                    wait = series.waits[outcome]
                    waits.add_metric([*names, outcome], wait.buckets(), wait.sum)
                held.add_metric(names, series.held.buckets(), series.held.sum)
                lost.add_metric(names, series.lost)
                renewals.add_metric(names, series.renewals_failed)
                holds.add_metric(names, series.holds)
                waiters.add_metric(names, series.waiters)
        yield from (acquisitions, waits, held, lost, renewals, holds, waiters)
