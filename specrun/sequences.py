"""Token sequences compared: the one helper the caches, the drafts and the store share, and the
generation's history, which only grows."""

from __future__ import annotations

from typing import Sequence


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens `a` and `b` share from their start."""
    limit = min(len(a), len(b))
    # Spans doubling from the start, each compared in C, until one differs; then halve the span
    # that holds the first difference. The work grows with the prefix the two share, not with
    # their length: streams whose texts part early are compared every step, however long.
    same, span = 0, 1
    while same < limit:
        end = min(same + span, limit)
        if list(a[same:end]) != list(b[same:end]):
            break
        same, span = end, 2 * span
    else:
        return limit
    differs = end  # a[:same] == b[:same], a[:differs] != b[:differs]
    while differs - same > 1:
        middle = (same + differs) // 2
        if list(a[same:middle]) == list(b[same:middle]):
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
