"""Drafts from the target's own MTP (NextN) layers: `--draft mtp`.

Models such as Qwen3.5 ship a multi-token-prediction head trained to guess the token after the
next from the target's hidden state. It runs on a context of its own (`backend.mtp.MtpHead`)
that follows every target decode, whichever source drafted (the target hands each decode's
hidden rows to `follow`); so it never catches up on text, and drafting k tokens costs k small
decodes of the head alone. What it keeps per position is the target's hidden row there: the
row the head reads to draft from the end of the text, and the one a rollback returns to. Each
stream has its own: a head on its sequence of the target, in one MTP context for all of them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from specrun.backend import Context, Model, ModelOptions
from specrun.backend.mtp import MtpHead
from specrun.core.drafting import Draft, DraftDecode, DraftRequest, DraftSource, NeedsDecodes, Proposal
from specrun.drafts.drafting_loop import Picker, guessed
from specrun.drafts.registry import SourceSite, register
from specrun.errors import SpecrunError
from specrun.headers.arch import DRAFTER, SEPARATE_DRAFTERS, header_traits
from specrun.headers.read import read_keys
from specrun.sequences import common_prefix


class MtpDraft:
    """Drafts with the MTP head of the target's model for one sequence of its cache, greedily or by
    sampling (then p/q-verified)."""

    names: tuple[str, ...] = ("mtp",)
    counters: tuple[str, ...] = ()
    parts: tuple[DraftSource, ...] = ()
    runs_model = True

    def __init__(self, target: Context, sample: bool = True):
        self.target = target
        self.head = MtpHead(target)
        self.sample = sample
        self.picker = Picker(target.model.n_vocab)
        # The target's hidden row at each position the head holds (row -1, before the text: zeros).
        self.hidden = np.zeros((target.n_ctx + 1, self.head.n_embd), dtype=np.float32)

    def follow(self, on: bool) -> None:
        """Follow the target's decodes (while generations draft with the head), or stop (plain
        generations need not pay for the head). Where the head missed decodes, the target drops
        the text past what both hold, so the next prefill decodes it again with the head following."""
        self.target.listen(self._process if on else None)  # first: a recurrent target's truncate may decode again
        if on:
            self.target.truncate(common_prefix(self.head.tokens, self.target.tokens))
            self.head.truncate(len(self.target.tokens))

    def _process(self, tokens: Sequence[int], pos0: int, hidden: np.ndarray) -> None:
        """A target decode: the head follows the same tokens, each with the target's row before it
        (rows that go in with its next decode)."""
        if pos0 > len(self.head.tokens):
            return  # the head missed text: it drafts nothing until it follows again
        self.hidden[pos0 + 1 : pos0 + 1 + len(tokens)] = hidden
        self.head.process(tokens, pos0, self.hidden[pos0 : pos0 + len(tokens)])

    def propose(self, history: Sequence[int], request: DraftRequest) -> Proposal:
        budget = request.offer(self.names[0], request.limit)
        if budget.k < 1:
            return Draft.under(budget)
        pos = len(history) - 1  # the target holds all but the last token
        # While it follows, the head holds a prefix of what the target holds (history[:pos]): all
        # of it, unless it missed decodes. No copy of the history, whose length grows every step.
        if len(self.head.tokens) != pos:
            return Draft()  # the head missed decodes; following again (a new generation) brings it back
        sample = self.sample and not request.sampler.settings.greedy
        self.head.reads = self.hidden[pos]  # the target's row before the last token
        row = yield from self._next_row(history[-1])
        guess = yield from guessed(row, budget, request, self.picker, sample, self._next_row, text=history)
        self.head.truncate(pos)  # its own drafting rows go: the verify decode brings the target's
        return guess.draft(budget, sample, request.policy.wants_confidence)

    def _next_row(self, token: int) -> NeedsDecodes[np.ndarray]:
        decoded = yield DraftDecode(self.head, [token])
        self.head.reads = self.head.row  # the next drafting row reads the head's own
        return decoded.logits[-1]

    def rollback(self, history: Sequence[int]) -> None:
        self.head.truncate(max(len(history) - 1, 0))


def _build(site: SourceSite) -> MtpDraft:
    return MtpDraft(site.target, sample=site.config.draft_sampling)


def _with_mtp_layers(options: ModelOptions) -> ModelOptions:
    return replace(options, load_mtp=True)


def refuse_mtp_drafter(model: Model) -> None:
    """A separate MTP drafter (a gemma4-assistant, or NextN layers alone) loads, but llama.cpp crashes
    decoding it as a model of its own: one line instead. Only a model with MTP layers or of a drafter's
    architecture has its header read for it."""
    if not model.n_nextn and model.architecture not in SEPARATE_DRAFTERS.values():
        return
    keys = read_keys(model.path)
    if header_traits(keys.meta, keys.tensor_names).mtp == DRAFTER:
        raise SpecrunError(
            f"the {model.role} model {model.path.name} is an MTP drafter ({model.architecture}: MTP layers "
            "without the model they draft for), which specrun cannot run yet (llama.cpp's draft-mtp can); "
            "a target with MTP layers of its own drafts with --draft mtp"
        )


register(
    "mtp",
    _build,
    target_options=_with_mtp_layers,
    follow=MtpDraft.follow,
    check_model=refuse_mtp_drafter,
    named_by_draft=True,  # --draft mtp: the target's own layers are its draft model
)
