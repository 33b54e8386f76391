"""A generation held to a grammar, exactly: the engine's `OutputConstraint`.

`Constraint` masks the target's distribution by llama.cpp's grammar sampler: each verified
row by the grammar state after the drafts before it (a copy of the state walked along the
draft; a draft token the grammar forbids ends the draft before verification). A row's
distribution is the filtered one restricted to what the grammar allows, renormalised; only
when none of its support is allowed is the whole vocabulary masked and filtered again (a
mask over a large vocabulary costs far more than asking about a row's likely tokens:
docs/benchmarks.md). It also reads, off the same GBNF (`gbnf.py`), the text the grammar
forces next, which `specrun.drafts.grammar` drafts.
"""

from __future__ import annotations

import codecs
from typing import Sequence

import numpy as np

from specrun.backend import Model
from specrun.backend.grammar import GrammarState
from specrun.core.sampling import Distribution, SamplerSettings, filtered
from specrun.grammar.gbnf import GbnfState, GrammarSyntaxError
from specrun.grammar.schemas import Grammar

FORCED_CHARS = 256  # the most text one grammar draft reads ahead


class Constraint:
    """Where one generation stands in its grammar: llama.cpp's state says what is allowed, the
    reader's what is forced."""

    def __init__(self, model: Model, grammar: Grammar):
        self.model = model
        self.state = GrammarState(model, grammar.gbnf, grammar.what)
        try:
            self.reader: GbnfState | None = GbnfState.start(grammar.gbnf)
        except GrammarSyntaxError:
            self.reader = None  # llama.cpp takes grammars this reader does not: no grammar drafts then
        # Bytes that are not UTF-8 reach the reader as U+FFFD: it only guesses; llama.cpp decides.
        self._text = codecs.getincrementaldecoder("utf-8")("replace")
        self._rows: list[GrammarState] = [self.state]

    def admissible(self, tokens: list[int]) -> int:
        """How many of a draft's tokens the grammar allows in a row; the states after each are kept
        for `restrict` (row i is verified in the state after the first i)."""
        self._rows = [self.state]
        for token in tokens:
            after = self._rows[-1].clone()
            # Nothing follows an end, and llama.cpp takes one only when the grammar is complete.
            allowed = after.allows(np.array([token]))[0] if token in self.model.eog_ids else after.try_accept(token)
            if not allowed:
                break
            self._rows.append(after)
        return len(self._rows) - 1

    def restrict(self, dist: Distribution, row: np.ndarray, settings: SamplerSettings, i: int) -> Distribution:
        """Row i's distribution held to the grammar."""
        allowed = self._rows[i].allows(dist.ids)
        if allowed.all():
            return dist
        if allowed.any():
            probs = dist.probs[allowed]
            return Distribution(dist.ids[allowed], probs / probs.sum())
        return filtered(self._rows[i].mask(row), settings)  # nothing of the support fits: mask it all

    def commit(self, accepted: int, emitted: Sequence[int]) -> None:
        """The step emitted `emitted`: the draft's first `accepted` tokens, then perhaps one more."""
        self.state = self._rows[accepted]
        for token in emitted[accepted:]:
            if token not in self.model.eog_ids:
                self.state.accept(token)
        self._rows = [self.state]
        if self.reader is not None:
            text = self._text.decode(b"".join(self.model.piece(t) for t in emitted))
            self.reader = self.reader.feed(text)  # None: this reader lost the grammar; drafting stops

    def forced(self) -> tuple[str, bool]:
        """The text the grammar forces next and whether the end follows it; nothing while a
        character is half written or the reader has lost its way."""
        if self.reader is None or self._text.getstate()[0]:
            return "", False
        walk = self.reader.forced(FORCED_CHARS)
        return walk.text, walk.ends
