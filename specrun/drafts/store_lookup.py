"""Drafts from the store of earlier requests: what their prompts and outputs went on with.

`StoreLookup` drafts as SuffixDecoding (arXiv 2411.04975) does from its global suffix tree:
find where the current context's longest suffix occurred in the session's `NgramStore`, then
follow the most frequent continuation while the occurrences agree. Every drafted token is
still checked by the target, so the output does not change; only how often a draft is right does.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from specrun.core.drafting import Draft, DraftRequest, DraftSource, without_decodes
from specrun.drafts.registry import SourceSite, register
from specrun.drafts.store import NgramStore
from specrun.errors import SpecrunError


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


def _build(site: SourceSite) -> StoreLookup:
    """Drafts from the session's store, which its settings size (store_tokens)."""
    if site.store is None:
        raise SpecrunError("the store draft source needs a store: give store_tokens > 0 (--store-tokens N)")
    return StoreLookup(site.store)


register("store", _build)
