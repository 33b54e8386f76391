"""Drafts learned across requests: what earlier prompts and outputs went on with.

An agent or a chat client calls the model again and again with output that repeats what
earlier calls wrote (the same JSON fields, the same code, the same phrasing). Prompt
lookup only sees the current request; `NgramStore` keeps the tokens earlier requests read
and wrote, and `StoreLookup` drafts from them as SuffixDecoding (arXiv 2411.04975) does
from its global suffix tree: find where the current context's longest suffix occurred,
then follow the most frequent continuation while the occurrences agree. Every drafted
token is still checked by the target, so the output does not change; only how often a
draft is right does.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Sequence

import numpy as np

from specrun.core.sequences import common_prefix
from specrun.drafts.base import Draft, DraftRequest, DraftSource, without_decodes
from specrun.drafts.registry import register
from specrun.errors import SpecrunError

if TYPE_CHECKING:
    from specrun.session import Session

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


class StoreLookup:
    """Drafts what most often followed the current context in earlier requests.

    From the occurrences of the longest matching suffix, the draft takes the most frequent
    next token and goes on with the occurrences that agree, while the product of those
    tokens' shares stays at least MIN_PATH_SHARE: where earlier requests went on in several
    ways with no clear winner (the value of a JSON field), drafting stops. A one-token
    match seen only once is no evidence. Drafts whose match is at least LONG_MATCH tokens
    are reported as "store-long", so a cost-aware policy learns the two kinds apart.
    """

    names: tuple[str, ...] = ("store", "store-long")
    counters: tuple[str, ...] = ()
    parts: tuple[DraftSource, ...] = ()
    runs_model = False  # drafts from earlier requests' tokens: no model of its own
    LONG_MATCH = 4
    MIN_PATH_SHARE = 0.5

    def __init__(self, store: NgramStore):
        self.store = store

    @without_decodes
    def propose(self, history: Sequence[int], request: DraftRequest) -> Draft:
        ends, matched = self.store.matches(history[-NgramStore.MAX_MATCH :])
        tokens: list[int] = []
        path = 1.0
        while ends.size and len(tokens) < request.limit:
            ids, counts = self.store.follower_counts(ends)
            if not ids.size:
                break
            best = int(np.argmax(counts))
            path *= counts[best] / ends.size  # occurrences that ended count against the draft
            if path < self.MIN_PATH_SHARE or (matched == 1 and counts[best] < 2):
                break
            token = int(ids[best])
            tokens.append(token)
            ends = ends[self.store.token(ends + 1) == token] + 1
        if not tokens:
            return Draft()
        short, long = self.names
        return Draft.under(request.offer(long if matched >= self.LONG_MATCH else short, len(tokens)), tokens)

    def rollback(self, history: Sequence[int]) -> None:
        pass  # nothing here depends on the current request's history


def _build(session: Session, slot: int) -> StoreLookup:
    """Drafts from the session's store, which its settings size (store_tokens)."""
    if session.store is None:
        raise SpecrunError("the store draft source needs a store: give store_tokens > 0 (--store-tokens N)")
    return StoreLookup(session.store)


register("store", _build)
