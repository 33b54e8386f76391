"""Token sequences compared: the one helper the caches, the drafts and the store share."""

from __future__ import annotations

from typing import Sequence


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens `a` and `b` share from their start."""
    limit = min(len(a), len(b))
    a, b = list(a[:limit]), list(b[:limit])
    if a == b:  # the usual case, compared in C
        return limit
    # Halve the span holding the first difference, each half compared in C: streams whose texts
    # part early are compared every step, and a Python loop to the difference costs per token.
    same, differs = 0, limit  # a[:same] == b[:same], a[:differs] != b[:differs]
    while differs - same > 1:
        middle = (same + differs) // 2
        if a[same:middle] == b[same:middle]:
            same = middle
        else:
            differs = middle
    return same
