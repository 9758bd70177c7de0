"""Run first in the test suite's child processes (``tests/conftest.py`` puts this folder on
their ``PYTHONPATH``): they run as on a host without the OpenTelemetry SDK.

redis-py 8 imports the SDK at import wherever it is installed (0.1 s of CPU, a third of a
Redis worker's start); dblock's dev extra installs it for the tests that record spans in the
test process itself, and no child uses it. A child that imports the SDK gets the
``ModuleNotFoundError`` it would get where the SDK is not installed.
"""

from __future__ import annotations

import os
import sys
from typing import Any


class _NoOtelSdk:
    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "opentelemetry.sdk" or name.startswith("opentelemetry.sdk."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


if os.environ.get("DBLOCK_TEST_CHILD_NO_OTEL_SDK") == "1":
    sys.meta_path.insert(0, _NoOtelSdk())
