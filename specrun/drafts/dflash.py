"""Drafts from a DFlash or DSpark drafter: `--draft FILE` where FILE's architecture is dflash.

A DFlash drafter is trained to read its target's own features: the inputs of several of the
target's layers at each position, which it fuses and writes into its own cache at that position
as it follows every target decode (backend.block). It drafts a whole block in one decode: the
last token, then mask tokens at the positions after it, each of whose rows predicts the token at
its own position, as llama.cpp's draft-dflash reads them (common/speculative.cpp,
`common_speculative_impl_draft_dflash`). So a draft of k tokens costs one decode of k + 1 rows
however many are kept, and a row does not depend on the tokens drafted before it: greedily each
token is its row's argmax; sampled, each is drawn from its own row, which is then exactly the q
the p/q rule needs. The block is as long as the draft k: its mask rows attend to one another,
so a shorter block drafts other tokens, as llama.cpp's shorter --draft-max does.

DSpark (llama.cpp's draft-dspark: a dflash file with a Markov head) is DFlash whose graph adds
to each row a bias from the token before it, chained greedily inside the graph, and whose block
usually starts at the anchor: the last token's row drafts too, so a block of k rows drafts k.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from specrun.backend import Context, Model
from specrun.backend.block import BlockHead
from specrun.core.drafting import Draft, DraftDecode, DraftRequest, Proposal
from specrun.drafts.drafting_loop import Picker, decoded_rows, guessed
from specrun.drafts.registry import SourceSite, load_trained_drafter, register
from specrun.headers.arch import TrainedDrafter
from specrun.sequences import common_prefix


class DFlashDraft:
    """Drafts blocks with a DFlash or DSpark drafter for one sequence of the target's cache,
    greedily or by sampling (then p/q-verified)."""

    counters: tuple[str, ...] = ()
    parts = ()
    runs_model = True

    def __init__(self, target: Context, drafter: Model, found: TrainedDrafter, sample: bool = True):
        assert found.mask is not None  # drafter_misfit checked it
        self.names = (found.kind,)
        self.target = target
        self.layers = found.target_layers
        # DSpark's graph chains its Markov bias along equal blocks: each decode takes blocks of one length
        equal = found.kind == "dspark"
        self.head = BlockHead(target, drafter, len(self.layers) * target.model.n_embd, found.causal, equal)
        self.most = found.most
        self.first_row = 0 if found.anchored else 1  # the block's first row that drafts
        self.mask = found.mask
        self.sample = sample
        self.picker = Picker(target.model.n_vocab)

    def follow(self, on: bool) -> None:
        """Follow the target's decodes (while generations draft with it), or stop. Where the
        drafter missed decodes, the target drops the text past what both hold, so the next
        prefill decodes it again with the drafter following."""
        self.target.listen(self._process if on else None, self.layers)
        if on:
            self.target.truncate(common_prefix(self.head.tokens, self.target.tokens))
            self.head.truncate(len(self.target.tokens))

    def _process(self, tokens: Sequence[int], pos0: int, features: np.ndarray) -> None:
        if pos0 <= len(self.head.tokens):  # else it missed text: it drafts nothing until it follows again
            self.head.follow(tokens, pos0, features)

    def propose(self, history: Sequence[int], request: DraftRequest) -> Proposal:
        budget = request.offer(self.names[0], min(request.limit, self.most), block=True)
        if budget.k < 1:
            return Draft.under(budget)
        pos = len(history) - 1  # the target holds all but the last token, and so does the drafter
        if len(self.head.tokens) != pos:
            return Draft()  # it missed decodes; following again (a new generation) brings it back
        sample = self.sample and not request.sampler.settings.greedy
        # Every row gives logits, the last token's too, as llama.cpp's draft-dflash asks: the
        # drafter's graph computes them all, and llama.cpp hands out its first rows as the
        # outputs, whichever rows were asked for.
        block = [history[-1]] + [self.mask] * (budget.k - 1 + self.first_row)
        decoded = yield DraftDecode(self.head, block, len(block))
        self.head.truncate(pos)  # the block goes: the verify decode brings the target's features
        rows = decoded.logits[self.first_row :]
        guess = yield from guessed(rows[0], budget, request, self.picker, sample, decoded_rows(rows[1:]), text=history)
        return guess.draft(budget, sample, request.policy.wants_confidence)

    def rollback(self, history: Sequence[int]) -> None:
        self.head.truncate(max(len(history) - 1, 0))  # the target holds history[:-1]


def _builder(kind: str) -> Callable[[SourceSite], DFlashDraft]:
    def build(site: SourceSite) -> DFlashDraft:
        drafter, found = site.resources.once(kind, lambda: load_trained_drafter(site, kind))
        return DFlashDraft(site.target, drafter, found, sample=site.config.draft_sampling)

    return build


for _kind in ("dflash", "dspark"):
    register(_kind, _builder(_kind), follow=DFlashDraft.follow)
