"""Drafts from an EAGLE-3 drafter: `--draft FILE` where FILE's architecture is eagle3.

An EAGLE-3 drafter is trained to read its target's own features: the inputs of three of the
target's layers (low, middle, high) at each position, which its encoder fuses into one row
`g` per position. Its one decoder layer then reads, at cache position P, the pair (the token at
P + 1, g at P), as llama.cpp's draft-eagle3 feeds it (common/speculative.cpp,
`common_speculative_impl_draft_eagle3`). So the drafter follows every target decode: the
target hands over the features of the rows it decoded (`follow`), the encoder fuses them, and
the pairs wait in the drafter's batch for its next decode (backend.mtp's head context, which an
MTP head uses the same way). To draft it decodes the last token with g of the position before
it, then each drafted token with its own last output row in place of g.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from specrun.backend import Context, Model
from specrun.backend.mtp import MtpHead
from specrun.core.drafting import Draft, DraftDecode, DraftRequest, DraftSource, NeedsDecodes, Proposal
from specrun.drafts.drafting_loop import Picker, guessed
from specrun.drafts.registry import SourceSite, load_trained_drafter, register
from specrun.sequences import common_prefix


class Eagle3Draft:
    """Drafts with an EAGLE-3 drafter for one sequence of the target's cache, greedily or by
    sampling (then p/q-verified)."""

    names: tuple[str, ...] = ("eagle3",)
    counters: tuple[str, ...] = ()
    parts: tuple[DraftSource, ...] = ()
    runs_model = True

    def __init__(self, target: Context, drafter: Model, layers: tuple[int, ...], sample: bool = True):
        self.target = target
        self.head = MtpHead(target, drafter)
        self.layers = layers  # the target layers whose inputs it reads
        self.sample = sample
        self.picker = Picker(target.model.n_vocab)
        self.fused = np.zeros((target.n_ctx, self.head.n_embd), dtype=np.float32)  # g at each position of the text
        # The target's text and features since the drafter last caught up, one run from position
        # `start` on. They wait until it drafts: while auto declines to draft, following costs a
        # copy of the rows, not an encoder pass per target decode.
        self.held: list[int] = []
        self.start = 0
        self.features = np.zeros((self.head.n_batch, len(layers) * target.model.n_embd), dtype=np.float32)

    def follow(self, on: bool) -> None:
        """Follow the target's decodes (while generations draft with it), or stop. Cache position P
        holds the token at P + 1: where the drafter missed decodes, the target drops the text
        past what both hold, so the next prefill decodes it again with the drafter following."""
        self.target.listen(self._process if on else None, self.layers)
        self.held = []
        if on:
            self.target.truncate(common_prefix(self.head.tokens, self.target.tokens[1:]) + 1)
            self.head.truncate(max(len(self.target.tokens) - 1, 0))

    def _process(self, tokens: Sequence[int], pos0: int, features: np.ndarray) -> None:
        """A target decode: its rows held with the text since the last catch-up, from pos0 on."""
        if not self.held:
            self.start = len(self.head.tokens) + 1  # the first position whose pair the drafter lacks
        if pos0 > self.start + len(self.held):
            return  # the drafter missed text: it drafts nothing until it follows again
        if pos0 < self.start:  # the target decodes again what the drafter holds: it goes back there
            self.held, self.start = [], pos0
        done = 0
        while done < len(tokens):
            if len(self.held) == self.head.n_batch:
                self._catch_up()
                self.start = pos0 + done
            at = len(self.held) if not self.held else pos0 + done - self.start
            n = min(len(tokens) - done, self.head.n_batch - at)
            self.features[at : at + n] = features[done : done + n]
            self.held[at:] = tokens[done : done + n]
            done += n

    def _catch_up(self) -> None:
        """g of every held row (the encoder), and the pairs (token at p, g at p - 1) at p - 1."""
        if not self.held:
            return
        tokens, pos0, n = self.held, self.start, len(self.held)
        self.held = []
        self.fused[pos0 : pos0 + n] = self.head.encode(self.features[:n])
        if pos0 == 0:  # the first token has no position before it
            tokens, pos0 = tokens[1:], 1
        self.head.process(tokens, pos0 - 1, self.fused[pos0 - 1 : pos0 - 1 + len(tokens)])

    def propose(self, history: Sequence[int], request: DraftRequest) -> Proposal:
        budget = request.offer(self.names[0], request.limit)
        if budget.k < 1:
            return Draft.under(budget)
        pos = len(history) - 1  # the target holds all but the last token; the drafter one fewer
        self._catch_up()
        if pos < 1 or len(self.head.tokens) != pos - 1:
            return Draft()  # the drafter missed decodes; following again (a new generation) brings it back
        sample = self.sample and not request.sampler.settings.greedy
        self.head.reads = self.fused[pos - 1]
        row = yield from self._next_row(history[-1])
        guess = yield from guessed(row, budget, request, self.picker, sample, self._next_row, text=history)
        self.head.truncate(pos - 1)  # its own drafting rows go: the verify decode brings the target's
        return guess.draft(budget, sample, request.policy.wants_confidence)

    def _next_row(self, token: int) -> NeedsDecodes[np.ndarray]:
        decoded = yield DraftDecode(self.head, [token])
        self.head.reads = self.head.row  # the next drafting row reads the drafter's own output
        return decoded.logits[-1]

    def rollback(self, history: Sequence[int]) -> None:
        keep = len(history) - 1  # the target holds history[:-1]: the held rows past it go
        del self.held[max(keep - self.start, 0) :]
        self.head.truncate(max(keep - 1, 0))


def _build(site: SourceSite) -> Eagle3Draft:
    drafter, found = site.resources.once("eagle3", lambda: load_trained_drafter(site, "eagle3"))
    return Eagle3Draft(site.target, drafter, found.target_layers, sample=site.config.draft_sampling)


register("eagle3", _build, follow=Eagle3Draft.follow)
