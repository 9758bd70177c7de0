"""``dblock demo``: warehouse inventory deduction, every strategy side by side.

One SKU with a fixed stock, several worker processes confirming outbound orders at once, once
per strategy (no lock, guarded UPDATE, SELECT ... FOR UPDATE, optimistic version column, a
dblock lock, an advisory lock, orders of several SKUs, and holders stalled past a short lease
fenced by a token column or a guarded commit). Prints what each shipped, what it oversold,
and what it cost.
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """Run the demo with command-line arguments ``argv``; return the exit status."""
    from ._cli import run

    return run(argv)


__all__ = ["main"]
