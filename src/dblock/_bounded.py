"""Memories of recent keys that cannot grow without bound."""

from __future__ import annotations

from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


def remember(memory: dict[K, V], key: K, value: V, limit: int) -> None:
    """``memory[key] = value``, in a memory of at most ``limit`` keys. A full one is forgotten
    at once: what such a memory holds is a hint, never the truth, and keys of holds never
    ended or of clients that never came back would otherwise fill it; forgetting all costs
    less than keeping an order of use on every call."""
    if key not in memory and len(memory) >= limit:
        memory.clear()
    memory[key] = value
