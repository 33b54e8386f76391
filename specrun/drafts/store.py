"""The store of earlier requests: the tokens their prompts and outputs held (`NgramStore`).

An agent or a chat client calls the model again and again with output that repeats what
earlier calls wrote (the same JSON fields, the same code, the same phrasing). Prompt
lookup only sees the current request; a session keeps its requests here, and the "store"
source (store_lookup.py) drafts from them.
"""

from __future__ import annotations

from collections import deque
from typing import Sequence

import numpy as np

from specrun.errors import SpecrunError
from specrun.sequences import common_prefix

END = -1  # written after each sequence, so no match runs from one request into the next
DEFAULT_LIMIT = 65536  # tokens: 256 KiB, searched in tens of microseconds a step


class NgramStore:
    """The tokens of the last sequences added (requests' prompts and outputs), at most `limit`.

    Adding beyond the limit drops whole sequences, oldest first; a single sequence longer
    than the limit keeps its last `limit` tokens. The tokens sit in one int32 array, so
    the store costs 4 bytes a token and a search is one vectorised comparison.
    """

    MAX_MATCH = 32  # longest context suffix searched for; longer agreement adds no evidence

    def __init__(self, limit: int):
        if limit < 1:
            raise SpecrunError(f"the n-gram store needs a limit >= 1 token, but got {limit}")
        self.limit = limit
        self._tokens = np.empty(0, dtype=np.int32)  # sequences, each followed by END
        self._lengths: deque[int] = deque()  # of the sequences held, oldest first
        self._last: list[int] = []  # the last sequence offered, whole

    def __len__(self) -> int:
        """Tokens held (END markers not counted)."""
        return len(self._tokens) - len(self._lengths)

    def add(self, tokens: Sequence[int]) -> None:
        """Learn one request's prompt and output.

        What the previous sequence already began with is not stored again: a conversation
        that extends the last request adds its new turn and reply, with the few tokens
        before them that lead into it.
        """
        tokens = list(tokens)
        common = common_prefix(self._last, tokens)
        self._last = tokens
        new = tokens[max(common - self.MAX_MATCH, 0) :][-self.limit :]
        if len(new) <= min(common, self.MAX_MATCH):
            return  # nothing beyond what is stored already
        held, dropped = len(self) + len(new), 0
        while held > self.limit:
            oldest = self._lengths.popleft()
            held -= oldest
            dropped += oldest + 1  # with its END
        self._lengths.append(len(new))
        self._tokens = np.concatenate([self._tokens[dropped:], np.array([*new, END], dtype=np.int32)])

    def matches(self, context: Sequence[int]) -> tuple[np.ndarray, int]:
        """Where the longest suffix of `context` (up to MAX_MATCH tokens) occurs in the store.

        Returns the positions of its last token in each occurrence that has a follower, and
        the suffix's length (0 and no positions when not even its last token occurs).
        """
        tokens = self._tokens
        if not context or len(tokens) < 2:
            return np.empty(0, dtype=np.intp), 0
        ends = np.flatnonzero(tokens[:-1] == context[-1])
        matched = 1 if ends.size else 0
        for back in range(1, min(len(context), self.MAX_MATCH)):
            if not ends.size:
                break
            starts = ends - back
            inside = starts >= 0
            longer = ends[inside][tokens[starts[inside]] == context[-1 - back]]
            if not longer.size:
                break
            ends, matched = longer, back + 1
        return ends, matched

    def follower_counts(self, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The distinct tokens that follow positions `ends` (sequence ends left out), with counts."""
        followers = self._tokens[ends + 1]
        return np.unique(followers[followers != END], return_counts=True)

    def token(self, position: np.ndarray) -> np.ndarray:
        return self._tokens[position]
