"""Metrics, spans and logs of real acquisitions (docs/observability.md), on every provider, in
both client modes: the hooks sit in the Lock code that the async client runs too."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import dblock
from dblock import observability

prometheus_client = pytest.importorskip("prometheus_client")
sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
in_memory = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")
export = pytest.importorskip("opentelemetry.sdk.trace.export")
parser = pytest.importorskip("prometheus_client.parser")


@pytest.fixture
def registry() -> Iterator[Any]:
    reg = prometheus_client.CollectorRegistry()
    metrics = observability.enable_metrics(reg)
    yield reg
    observability.remove_observer(metrics)


@pytest.fixture
def spans() -> Iterator[Any]:
    exporter = in_memory.InMemorySpanExporter()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(export.SimpleSpanProcessor(exporter))
    tracing = observability.enable_tracing(provider)
    yield exporter
    observability.remove_observer(tracing)


def _scrape(registry: Any) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The text format, parsed back: (sample name, labels) -> value."""
    text = observability.metrics_text(registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in parser.text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(scraped: dict[Any, float], name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in scraped.items() if n == name and want <= ls)


def test_metrics_count_outcomes_holds_and_a_lost_lease(
    client: dblock.Client, key: str, registry: Any
) -> None:
    prefix, key = key, key + ":obs"  # a prefix of its own: the test's series only
    lock = client.lock(key, ttl=10, reentrant=False)
    assert lock.acquire()
    other = client.lock(key, ttl=10, reentrant=False)
    assert not other.acquire(blocking=False)
    assert not other.acquire(timeout=0.2)
    scraped = _scrape(registry)
    labels = {"prefix": prefix, "kind": "lock"}
    assert _value(scraped, "dblock_acquisitions_total", outcome="granted", **labels) == 1
    assert _value(scraped, "dblock_acquisitions_total", outcome="busy", **labels) == 1
    assert _value(scraped, "dblock_acquisitions_total", outcome="timeout", **labels) == 1
    assert _value(scraped, "dblock_wait_seconds_count", outcome="timeout", **labels) == 1
    assert _value(scraped, "dblock_wait_seconds_sum", outcome="timeout", **labels) >= 0.2
    assert _value(scraped, "dblock_holds", **labels) == 1
    assert _value(scraped, "dblock_waiters", **labels) == 0
    lock.release()
    scraped = _scrape(registry)
    assert _value(scraped, "dblock_holds", **labels) == 0
    assert _value(scraped, "dblock_hold_seconds_count", **labels) == 1
    assert _value(scraped, "dblock_leases_lost_total", **labels) == 0

    assert lock.acquire()  # then an operator takes it away: the release finds it lost
    assert client.force_release(key)
    with pytest.raises(dblock.LockLost):
        lock.release()
    scraped = _scrape(registry)
    assert _value(scraped, "dblock_leases_lost_total", **labels) == 1
    assert _value(scraped, "dblock_holds", **labels) == 0
    # the backend is a label; keys are not (the prefix stands for them)
    assert all(dict(ls).get("backend") == client.dialect for (n, ls) in scraped if "dblock" in n)
    assert key not in observability.metrics_text(registry).decode()


def test_a_span_per_acquire_and_one_per_lost_lease(
    client: dblock.Client, key: str, spans: Any
) -> None:
    lock = client.lock(key, ttl=10, reentrant=False)
    assert lock.acquire()
    token = lock.token
    assert not client.lock(key, reentrant=False).acquire(timeout=0.1)
    assert client.force_release(key)
    with pytest.raises(dblock.LockLost):
        lock.release()
    finished = [s for s in spans.get_finished_spans() if s.attributes["dblock.key"] == key]
    acquires = [s for s in finished if s.name == "dblock.acquire"]
    assert [s.attributes["dblock.outcome"] for s in acquires] == ["granted", "timeout"]
    granted, timed_out = acquires
    assert granted.attributes["dblock.key"] == key
    assert granted.attributes["dblock.backend"] == client.dialect
    assert granted.attributes["dblock.token"] == token
    assert timed_out.attributes["dblock.wait_seconds"] >= 0.1
    assert (timed_out.end_time - timed_out.start_time) / 1e9 >= 0.1
    (lost,) = [s for s in finished if s.name == "dblock.lease_lost"]
    assert [e.name for e in lost.events] == ["lease lost"]
    assert lost.attributes["dblock.token"] == token
    assert [link.context.span_id for link in lost.links] == [granted.context.span_id]


def test_logs_carry_key_owner_and_token_and_are_quiet_by_default(
    client: dblock.Client, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dblock")
    with client.lock(key, ttl=10):
        pass
    assert not [r for r in caplog.records if r.name == "dblock"]
    caplog.set_level(logging.DEBUG, logger="dblock")
    with client.lock(key, ttl=10) as lock:
        token, owner = lock.token, lock.owner
    records = [r for r in caplog.records if r.name == "dblock" and getattr(r, "key", None) == key]
    assert [r.getMessage().split()[0] for r in records] == ["granted", "released"]
    for record in records:
        assert (record.token, record.owner, record.kind) == (token, owner, "lock")  # type: ignore[attr-defined]


def test_a_lease_that_runs_out_is_reported_once(
    client: dblock.Client, key: str, registry: Any, spans: Any
) -> None:
    key += ":x"  # a prefix of its own: the test's series only
    lost = threading.Event()
    lock = client.lock(key, ttl=0.5, on_lost=lambda _lock: lost.set())
    assert lock.acquire()
    assert lost.wait(10), "on_lost was not called"
    with pytest.raises(dblock.LockLost):
        lock.release()
    scraped = _scrape(registry)
    prefix = observability.key_prefix(key)
    assert _value(scraped, "dblock_leases_lost_total", prefix=prefix) == 1
    assert _value(scraped, "dblock_holds", prefix=prefix) == 0
    mine = [s.name for s in spans.get_finished_spans() if s.attributes["dblock.key"] == key]
    assert mine.count("dblock.lease_lost") == 1


def test_raw_keys_label_by_the_whole_key(client: dblock.Client, key: str) -> None:
    reg = prometheus_client.CollectorRegistry()
    metrics = observability.enable_metrics(reg, raw_keys=True)
    try:
        with client.lock("nightly:" + key, ttl=10):
            pass
        scraped = _scrape(reg)
    finally:
        observability.remove_observer(metrics)
    labels = {"prefix": "nightly:" + key, "outcome": "granted"}
    assert _value(scraped, "dblock_acquisitions_total", **labels) == 1
    assert observability.key_prefix("nightly:" + key) == "nightly"
    assert observability.key_prefix("nightly-report") == "(none)"


def test_an_observer_may_leave_hooks_out_and_its_errors_do_not_fail_the_lock(
    client: dblock.Client, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken:
        def acquired(self, *args: object) -> None:
            raise RuntimeError("observer bug")

    broken = Broken()
    observability.add_observer(broken)  # type: ignore[arg-type]
    try:
        with client.lock(key, ttl=10) as lock:
            assert lock.held
    finally:
        observability.remove_observer(broken)  # type: ignore[arg-type]
    assert any("observer" in r.getMessage() and r.exc_info for r in caplog.records)


def test_tracing_without_the_opentelemetry_api_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As enable_metrics() without prometheus-client: not a silent no-op (issue 46)."""
    monkeypatch.delitem(sys.modules, "dblock.observability._tracing", raising=False)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # makes the import fail
    with pytest.raises(dblock.ConfigurationError, match=r"pip install 'dblock\[otel\]'"):
        observability.enable_tracing()
