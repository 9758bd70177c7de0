"""What ``pyproject.toml`` publishes about the project."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def test_no_placeholder_addresses_are_published() -> None:
    """A placeholder (``github.com/OWNER/...``) would reach PyPI as a link to someone else's
    page: the project names no address until it has one (issue 46)."""
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    urls = project.get("urls", {})
    assert not [url for url in urls.values() if "OWNER" in url], urls
