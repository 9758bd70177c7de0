"""dblock's benchmark suite (a dev tool, not part of the installed package).

Run ``python -m bench --help`` from the repository root. See ``bench/run.py``.
"""

from __future__ import annotations
