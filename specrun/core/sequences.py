"""Token sequences compared: the one helper the caches, the drafts and the store share, and the
generation's history, which only grows."""

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


class History(list):
    """A generation's text so far: tokens are only ever added at its end. What a cache once
    found it holds of a History it still holds of it (`Context.reuse_prefix`), so a cache that
    follows the history compares only what was added since, not the whole text every step."""

    def _changes(self, *args, **kwargs):
        raise TypeError("a History only grows at its end: append to it or extend it")

    __setitem__ = __delitem__ = insert = pop = remove = reverse = sort = clear = _changes
