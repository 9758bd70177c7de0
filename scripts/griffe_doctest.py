"""A griffe extension for the API reference (mkdocs.yml): doctest examples become code blocks.

dblock's docstrings show examples as bare ``>>>`` lines, which Markdown would read as nested
block quotes. This wraps each run of ``>>>``/``...`` lines (and the output lines after them,
up to a blank line) in a ``pycon`` fence before mkdocstrings renders the docstring.
"""

from __future__ import annotations

from typing import Any

import griffe


def fence_doctests(text: str) -> str:
    out: list[str] = []
    inside = False
    for line in text.splitlines():
        prompt = line.lstrip().startswith((">>>", "..."))
        if prompt and not inside:
            out.append("```pycon")
            inside = True
        elif inside and not line.strip():
            out.append("```")
            inside = False
        out.append(line)
    if inside:
        out.append("```")
    return "\n".join(out)


class DoctestFences(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None and ">>>" in obj.docstring.value:
            obj.docstring.value = fence_doctests(obj.docstring.value)
