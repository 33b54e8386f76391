"""Drafts copied from the longest earlier match of the text's end: `--source suffix`.

Prompt lookup (lookup.py) matches n-grams of a few tokens, and so copies from the latest place
that shares the last 2 to 4 tokens, which in a long text is often the wrong one. This source
copies from where the most tokens before agree with the end of the text (up to MAX_MATCH): the
place a suffix array or tree of the history would find, searched here with numpy over the
history's tokens each step, as `NgramStore` searches the store.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from specrun.core.drafting import Draft, DraftRequest, DraftSource, without_decodes
from specrun.drafts.registry import SourceSite, register
from specrun.sequences import History, common_prefix


class SuffixCopy:
    """Copies what followed the earlier position whose context agrees longest with the end of the
    history (the latest of them on a tie), once at least MIN_MATCH tokens agree."""

    names: tuple[str, ...] = ("suffix",)
    counters: tuple[str, ...] = ()
    parts: tuple[DraftSource, ...] = ()
    runs_model = False  # copies from the history: no model of its own
    MIN_MATCH = 2  # one token agreeing is no evidence
    MAX_MATCH = 64  # longer agreement finds the same place

    def __init__(self) -> None:
        self._seen: list[int] = []  # the history of the last step
        self._tokens = np.empty(1024, dtype=np.int32)  # the same as an array, grown as it grows
        self._follows: History | None = None  # the History `_seen` was last made, which still starts it

    @without_decodes
    def propose(self, history: Sequence[int], request: DraftRequest) -> Draft:
        tokens = self._follow(history)
        end, length = longest_match(tokens, self.MAX_MATCH)
        if length < self.MIN_MATCH:
            return Draft()
        copy = tokens[end + 1 : end + 1 + request.limit].tolist()
        return Draft.under(request.offer(self.names[0], len(copy)), copy)

    def _follow(self, history: Sequence[int]) -> np.ndarray:
        """The history as an array, copying only what changed since the last step (of the same
        History, only what was added to it: the rest is unchanged)."""
        same = len(self._seen) if history is self._follows else common_prefix(self._seen, history)
        self._seen[same:] = history[same:]
        if len(history) > len(self._tokens):
            self._tokens = np.resize(self._tokens, 2 * len(history))
        self._tokens[same : len(history)] = history[same:]
        self._follows = history if isinstance(history, History) else None
        return self._tokens[: len(history)]

    def rollback(self, history: Sequence[int]) -> None:
        pass  # the next propose compares the history with what it holds


def longest_match(tokens: np.ndarray, most: int) -> tuple[int, int]:
    """The earlier position (not the last) whose tokens up to it equal the end of `tokens` for the
    most tokens (at most `most`; the latest such position), and how many: (-1, 0) for none."""
    last = len(tokens) - 1
    ends = np.flatnonzero(tokens[:last] == tokens[last]) if last > 0 else np.empty(0, dtype=np.intp)
    length = 1 if ends.size else 0
    while 0 < length < most:
        starts = ends - length
        inside = starts >= 0
        longer = ends[inside][tokens[starts[inside]] == tokens[last - length]]
        if not longer.size:
            break
        ends, length = longer, length + 1
    return (int(ends[-1]), length) if ends.size else (-1, 0)


def _build(site: SourceSite) -> SuffixCopy:
    return SuffixCopy()


register("suffix", _build)
