"""What dblock's own tools (the command line, the demo) use besides the API of ``dblock``:
URL handling that never shows a secret, the validation the API applies to its arguments, the
schema as a script, and the error for a lock table that does not exist yet.

The tools import only ``dblock`` and this module, so the inside can change under them.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import TYPE_CHECKING, Any

from ._url import DatabaseURL, default_url, quorum_urls, redact, scrub
from ._validate import MAX_TTL, check_key, check_leader_value, check_seconds, check_table
from .stores import ddl_for, parse_url, schema_script
from .stores._registry import entry
from .stores._schema import MissingTable

if TYPE_CHECKING:
    from ._election import Term

__all__ = [
    "MAX_TTL",
    "DatabaseURL",
    "MissingTable",
    "Term",
    "check_key",
    "check_leader_value",
    "check_parameter_names",
    "check_seconds",
    "check_table",
    "ddl_for",
    "default_url",
    "parse_url",
    "quorum_urls",
    "redact",
    "schema_script",
    "scrub",
]


def __getattr__(name: str) -> Any:
    # the election's module is imported only by what uses it (`dblock lead`, not `dblock run`)
    if name == "Term":
        from ._election import Term

        return Term
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_parameter_names(url: DatabaseURL) -> None:
    """ConfigurationError for a URL parameter the URL's store does not know, without
    connecting (a parameter's value is judged when the store connects), where its registry
    entry names a check (MySQL's: the other stores pass unknown names on to their driver, or
    judge them as they connect)."""
    check = entry(url.dialect).check_parameters
    if check is not None and url.query:
        with contextlib.suppress(ImportError):  # no driver: connect() will say so
            module_name, _, function = check.partition(":")
            getattr(importlib.import_module(module_name), function)(url)
