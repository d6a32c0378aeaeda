"""Byte counts as the planner's messages print them (:func:`size_text`)."""

from __future__ import annotations


def size_text(n: float) -> str:
    """Bytes in the largest unit that keeps them ≥ 1 (a tiny model's floor is not "0.0 GiB")."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"
