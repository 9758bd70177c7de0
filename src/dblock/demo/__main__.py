"""``python -m dblock.demo``: the same as ``dblock demo``."""

from __future__ import annotations

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
