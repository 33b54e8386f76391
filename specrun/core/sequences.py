"""Token sequences compared: the one helper the caches, the drafts and the store share."""

from __future__ import annotations

from typing import Sequence


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens `a` and `b` share from their start."""
    limit = min(len(a), len(b))
    if list(a[:limit]) == list(b[:limit]):  # the usual case, compared in C
        return limit
    return next(i for i in range(limit) if a[i] != b[i])
