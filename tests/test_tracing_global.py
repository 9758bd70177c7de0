"""``enable_tracing()`` without a provider follows OpenTelemetry's global one: nothing is
started while no SDK is set (the API's proxy), and spans are recorded once the application
sets its SDK, even after dblock's tracer was made. A subprocess: the global provider can be
set only once per process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.sdk.trace")

SCRIPT = textwrap.dedent(
    """
    import sys
    import dblock
    from dblock import observability
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    client = dblock.connect("sqlite:///" + sys.argv[1])
    observability.enable_tracing()  # before the application sets its SDK
    with client.lock("job:before"):
        pass
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    with client.lock("job:after"):
        pass
    print(sorted(s.attributes["dblock.key"] for s in exporter.get_finished_spans()))
    """
)


def _run(
    script: str, tmp_path: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a fresh interpreter (the global provider is set once per process)."""
    return subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "locks.db")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        # the suite hides the SDK from its children (tests/_children): this one is the app
        env={**os.environ, **(env or {}), "DBLOCK_TEST_CHILD_NO_OTEL_SDK": "0"},
    )


def test_spans_start_once_the_application_sets_its_sdk(tmp_path: Path) -> None:
    out = _run(SCRIPT, tmp_path)
    assert out.stdout.strip() == "['job:after']", out.stderr


ENV_SCRIPT = textwrap.dedent(
    """
    import sys
    import dblock
    from dblock import observability
    from opentelemetry import trace
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    client = dblock.connect("sqlite:///" + sys.argv[1])
    observability.enable_tracing()
    with client.lock("job:first"):
        pass
    print("the API's global is set:", trace._TRACER_PROVIDER is not None)
    exporter = InMemorySpanExporter()
    trace.get_tracer_provider().add_span_processor(SimpleSpanProcessor(exporter))
    with client.lock("job:second"):
        pass
    print(sorted(s.attributes["dblock.key"] for s in exporter.get_finished_spans()))
    """
)


def test_a_provider_named_by_the_environment_is_followed_from_the_first_acquire(
    tmp_path: Path,
) -> None:
    # the API makes the global provider from OTEL_PYTHON_TRACER_PROVIDER when first asked;
    # dblock, which takes an unset global for "no SDK", must have asked by then
    out = _run(ENV_SCRIPT, tmp_path, {"OTEL_PYTHON_TRACER_PROVIDER": "sdk_tracer_provider"})
    made, spans = out.stdout.strip().splitlines()
    assert made == "the API's global is set: True", out.stderr
    assert spans == "['job:second']", out.stderr
