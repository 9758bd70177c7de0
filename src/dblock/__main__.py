"""``python -m dblock``: the ``dblock`` command."""

from __future__ import annotations

from dblock.cli import command

if __name__ == "__main__":
    command()
