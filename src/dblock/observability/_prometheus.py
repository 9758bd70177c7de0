"""Prometheus metrics of this process's locks (the ``prometheus`` extra).

The hooks only append what happened to a queue (``deque.append`` is atomic: no lock); the
queue is folded into plain numbers, one set per series, when scraped (a custom collector) or
when it holds ``FOLD_AT`` events. Updating prometheus-client's Counter/Histogram objects on
every event costs several locks and layers per acquire, and even plain numbers under a lock
per series cost a Redis acquire+release about 8 % (bench ``obs``): the hooks run between
round trips, with the processor's caches cold, while the fold runs a batch at a time.

Every label value is a series kept for the life of the process, and every series costs the
scrape about 37 samples (two histograms): past ``max_prefixes`` distinct prefixes, a key's
events are counted under the prefix ``(other)``, and ``dblock_folded_acquisitions_total``
counts the acquire calls that were (20,000 prefixes unfolded made a 68 MB scrape taking 10 s).
"""

from __future__ import annotations

import bisect
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from .._bounded import remember
from .._errors import ConfigurationError
from .._observe import LockEvent, Outcome
from ._prefix import DEFAULT_MAX_PREFIXES, OTHER

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
#: events queued before the hook that queues the next one folds them
FOLD_AT = 2048


class _Histogram:
    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)  # the last one: above every bound (+Inf)
        self.sum = 0.0

    def buckets(self) -> list[tuple[str, float]]:
        out, total = [], 0
        for bound, n in zip((*map(str, BUCKETS), "+Inf"), self.counts, strict=True):
            total += n
            out.append((bound, float(total)))
        return out


class _Series:
    """The numbers of one (backend, prefix, kind), changed only by the fold."""

    __slots__ = (
        "acquisitions",
        "folded",
        "held",
        "holds",
        "lost",
        "renewals_failed",
        "waiters",
        "waits",
    )

    def __init__(self, folded: bool = False) -> None:
        #: the series of prefix ``(other)``: its keys' own prefixes were over the cap
        self.folded = folded
        self.acquisitions: dict[str, int] = {}
        self.waits: dict[str, _Histogram] = {}
        self.held = _Histogram()
        self.holds = 0
        self.waiters = 0
        self.lost = 0
        self.renewals_failed = 0


#: what a queued event is (its first item; the event and the hook's numbers follow)
_ACQUIRING, _ACQUIRED, _RELEASED, _LOST, _RENEWAL_FAILED = range(5)


class PrometheusMetrics:
    """The observer behind :func:`dblock.observability.enable_metrics`, and the collector
    that exports what it counted."""

    def __init__(
        self, registry: Any, prefix: Callable[[str], str], max_prefixes: int = DEFAULT_MAX_PREFIXES
    ) -> None:
        self._prefix = prefix
        self._max_prefixes = max_prefixes
        #: the prefixes that have series of their own (at most ``max_prefixes``)
        self._prefixes: set[str] = set()
        #: acquire calls counted under ``(other)``, by backend
        self._folded: dict[str, int] = {}
        self._series: dict[tuple[str, str, str], _Series] = {}
        self._by_key: dict[tuple[str, str, str], _Series] = {}
        self._events: deque[tuple[Any, ...]] = deque()
        #: held while folding (by one thread at a time, in the order the events came)
        self._fold_lock = threading.Lock()
        self._registry = REGISTRY if registry is None else registry
        self._registry.register(self)

    def unregister(self) -> None:
        self._registry.unregister(self)

    def _of(self, event: LockEvent) -> _Series:
        # by (backend, key, kind) first: a key's prefix is worked out once, not per event
        found = self._by_key.get(event[:3])
        if found is not None:
            return found
        prefix = self._prefix(event.key)
        if prefix not in self._prefixes:
            if len(self._prefixes) < self._max_prefixes:
                self._prefixes.add(prefix)
            else:
                prefix = OTHER
        labels = (event.backend, prefix, event.kind)
        series = self._series.get(labels)
        if series is None:
            series = self._series.setdefault(labels, _Series(folded=prefix == OTHER))
        # many keys: the memory starts over (the series stay)
        remember(self._by_key, (event.backend, event.key, event.kind), series, _KEYS_REMEMBERED)
        return series

    def _fold(self) -> None:
        with self._fold_lock:
            self._fold_locked()

    def _fold_locked(self) -> None:
        """Fold the queued events into their series' numbers (``_fold_lock`` held)."""
        events, by_key, bisect_left = self._events, self._by_key, bisect.bisect_left
        while events:
            item = events.popleft()
            what, event = item[0], item[1]
            series = by_key.get(event[:3]) or self._of(event)
            if what == _ACQUIRING:
                series.waiters += 1
                if series.folded:
                    self._folded[event.backend] = self._folded.get(event.backend, 0) + 1
            elif what == _ACQUIRED:
                outcome, wait = item[2], item[3]
                series.waiters -= 1
                series.acquisitions[outcome] = series.acquisitions.get(outcome, 0) + 1
                histogram = series.waits.get(outcome)
                if histogram is None:
                    histogram = series.waits[outcome] = _Histogram()
                histogram.counts[bisect_left(BUCKETS, wait)] += 1
                histogram.sum += wait
                if outcome == "granted" and not event.reentry:
                    series.holds += 1
            elif what == _RELEASED:
                held = series.held
                held.counts[bisect_left(BUCKETS, item[2])] += 1
                held.sum += item[2]
                series.holds -= 1
            elif what == _LOST:
                series.lost += 1
            else:
                series.renewals_failed += 1

    # -- the hooks: each queues what happened (and folds a full queue) ----------------------
    def acquiring(self, event: LockEvent) -> None:
        events = self._events
        events.append((_ACQUIRING, event))
        if len(events) >= FOLD_AT:
            self._fold()

    def acquired(
        self, event: LockEvent, outcome: Outcome, wait: float, error: BaseException | None
    ) -> None:
        events = self._events
        events.append((_ACQUIRED, event, outcome, wait))
        if len(events) >= FOLD_AT:
            self._fold()

    def released(self, event: LockEvent, held: float, lost: bool) -> None:
        events = self._events
        events.append((_RELEASED, event, held))
        if len(events) >= FOLD_AT:
            self._fold()

    def lost(self, event: LockEvent) -> None:
        self._events.append((_LOST, event))
        self._fold()  # rare: counted at once

    def renewal_failed(self, event: LockEvent, error: BaseException) -> None:
        self._events.append((_RENEWAL_FAILED, event))
        self._fold()

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
        folded = CounterMetricFamily(
            "dblock_folded_acquisitions",
            f"Acquire calls counted under prefix {OTHER!r}: their key's prefix came after "
            f"max_prefixes ({self._max_prefixes}) others",
            labels=["backend"],
        )
        with self._fold_lock:
            self._fold_locked()
            for labels, series in sorted(self._series.items()):
                names = list(labels)
                for outcome, n in sorted(series.acquisitions.items()):
                    acquisitions.add_metric([*names, outcome], n)
                    wait = series.waits[outcome]
                    waits.add_metric([*names, outcome], wait.buckets(), wait.sum)
                held.add_metric(names, series.held.buckets(), series.held.sum)
                lost.add_metric(names, series.lost)
                renewals.add_metric(names, series.renewals_failed)
                holds.add_metric(names, series.holds)
                waiters.add_metric(names, series.waiters)
            for backend, n in sorted(self._folded.items()):
                folded.add_metric([backend], n)
        yield from (acquisitions, waits, held, lost, renewals, holds, waiters, folded)
