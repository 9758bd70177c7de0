"""``python -m dblock``: the ``dblock`` command."""

from __future__ import annotations

import sys

from dblock.cli import main

if __name__ == "__main__":
    sys.exit(main())
