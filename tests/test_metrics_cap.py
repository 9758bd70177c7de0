"""The metrics' label cardinality is bounded (issue 46): past ``max_prefixes`` distinct
prefixes, keys are counted under ``(other)`` and the folded acquire calls are counted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import dblock
from dblock import observability

prometheus_client = pytest.importorskip("prometheus_client")
parser = pytest.importorskip("prometheus_client.parser")


@pytest.fixture
def client(tmp_path: Path) -> Iterator[dblock.Client]:
    with dblock.connect(f"sqlite:///{tmp_path}/locks.sqlite3") as c:
        yield c


def _samples(registry: Any, name: str) -> dict[frozenset[tuple[str, str]], float]:
    text = observability.metrics_text(registry).decode()
    return {
        frozenset(s.labels.items()): s.value
        for family in parser.text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def _take(client: dblock.Client, *keys: str) -> None:
    for key in keys:
        with client.lock(key, ttl=30):
            pass


@pytest.mark.parametrize("raw_keys", [False, True])
def test_prefixes_past_the_cap_fold_into_other_and_are_counted(
    client: dblock.Client, raw_keys: bool
) -> None:
    registry = prometheus_client.CollectorRegistry()
    metrics = observability.enable_metrics(registry, raw_keys=raw_keys, max_prefixes=3)
    try:
        keys = ["a:1", "b:1", "c:1", "d:1", "e:1", "e:2"]
        _take(client, *keys, "a:1")  # a:1 again: its own series, however late
        granted = _samples(registry, "dblock_acquisitions_total")
        by_prefix = {dict(labels)["prefix"]: n for labels, n in granted.items()}
        own = ["a:1", "b:1", "c:1"] if raw_keys else ["a", "b", "c"]
        assert by_prefix == {own[0]: 2, own[1]: 1, own[2]: 1, observability.OTHER: 3}
        folded = _samples(registry, "dblock_folded_acquisitions_total")
        assert folded == {frozenset({("backend", "sqlite")}): 3}
        holds = _samples(registry, "dblock_hold_seconds_count")
        assert sum(n for labels, n in holds.items() if ("prefix", "(other)") in labels) == 3
    finally:
        observability.remove_observer(metrics)


def test_nothing_is_folded_under_the_cap(client: dblock.Client) -> None:
    registry = prometheus_client.CollectorRegistry()
    metrics = observability.enable_metrics(registry)
    try:
        _take(client, *(f"p{i}:k" for i in range(20)))
        assert _samples(registry, "dblock_folded_acquisitions_total") == {}
        assert observability.DEFAULT_MAX_PREFIXES == 200  # docs/observability.md says so
    finally:
        observability.remove_observer(metrics)


@pytest.mark.parametrize(("bad", "error"), [(0, ValueError), (-1, ValueError), ("9", TypeError)])
def test_a_cap_below_one_or_not_an_int_is_refused(bad: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="max_prefixes"):
        observability.enable_metrics(prometheus_client.CollectorRegistry(), max_prefixes=bad)


def test_the_dashboards_store_metrics_fold_the_smallest_prefixes(client: dblock.Client) -> None:
    dashboard = pytest.importorskip("dblock.dashboard")
    locks = [client.lock(key, ttl=30) for key in ("a:1", "a:2", "b:1", "b:2", "c:1", "d:1")]
    for lock in locks:
        assert lock.acquire()
    try:
        registry = prometheus_client.CollectorRegistry()
        registry.register(dashboard._StoreCollector(client, max_prefixes=2))
        holds = _samples(registry, "dblock_store_holds")
        assert {dict(labels)["prefix"]: n for labels, n in holds.items()} == {
            "a": 2,
            "b": 2,
            observability.OTHER: 2,
        }
    finally:
        for lock in locks:
            lock.release()
