"""A generation held to a grammar, exactly, and drafts of what the grammar forces.

`Constraint` masks the target's distribution by llama.cpp's grammar sampler: each verified
row by the grammar state after the drafts before it (a copy of the state walked along the
draft; a draft token the grammar forbids ends the draft before verification). A row's
distribution is the filtered one restricted to what the grammar allows, renormalised; only
when none of its support is allowed is the whole vocabulary masked and filtered again (a
mask over Gemma's 262k tokens costs ~33 ms here; asking about a row's argmax, ~0.1 ms).

`GrammarDraft` proposes what the grammar forces from the current state (keys, quotes,
commas, a call's opening), read off the same GBNF by `specrun.gbnf`: free to draft, and
always allowed. `GrammarFirst` puts it ahead of the other sources: where text is forced, a
copy (lookup, the store) still drafts if it writes that text and more; a draft model is
asked only where nothing is forced, so its decodes never redo what the grammar gives free.
"""

from __future__ import annotations

import codecs
from typing import Sequence

import numpy as np

from specrun.backend import Model
from specrun.backend.grammar import GrammarState
from specrun.drafters import Draft, DraftSource, copying_part
from specrun.gbnf import GbnfState, GrammarSyntaxError
from specrun.policy import DraftPolicy
from specrun.sampling import Distribution, Sampler, SamplerSettings, filtered
from specrun.structured import Grammar
from specrun.translate import exact_tokens

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


class GrammarDraft:
    """Drafts the tokens the grammar forces from here (the target's tokenization of that text)."""

    name = "grammar"
    model = None  # no model of its own
    PRIOR = 0.95  # forced text is always allowed; the target may still split it into other tokens

    def __init__(self, constraint: Constraint, target: Model):
        self.constraint, self.target = constraint, target
        self.end = target.eot if target.eot >= 0 else target.eos
        self.extendable = target.prefix_tokens  # read once per model (a second for 262k tokens), before any timing
        self.pieces = target.pieces()

    def propose(self, history: Sequence[int], limit: int, policy: DraftPolicy, sampler: Sampler) -> Draft:
        text, ends = self.constraint.forced()
        tokens = (exact_tokens(self.target, self.pieces, text.encode()) or []) if text else []
        if ends:
            tokens.append(self.end)
        elif tokens and tokens[-1] in self.extendable:
            tokens.pop()  # the free text after it may be written with a longer token (`"` then `"John`)
        if not tokens:
            return Draft(self.name)
        return Draft(self.name, tokens[: policy.cap(self.name, min(len(tokens), limit), self.PRIOR).k])

    def rollback(self, history: Sequence[int]) -> None:
        pass  # the constraint moves with what the engine emits

    def writes_and_goes_past(self, forced: Sequence[int], tokens: Sequence[int]) -> bool:
        """Whether `tokens` write the text of this step's `forced` draft and more after it."""
        if not forced or forced[-1] == self.end:
            return False  # the forced text ends the output
        text, theirs = (b"".join(self.pieces[t] for t in seq) for seq in (forced, tokens))
        return len(theirs) > len(text) and theirs.startswith(text)


class GrammarFirst:
    """The grammar's forced text, or a copy's draft where that writes the forced text too and
    goes on past it (a record copied from an earlier request holds its keys, and its values);
    where nothing is forced, the other sources' draft, a model's included."""

    name = "hybrid"

    def __init__(self, forced: GrammarDraft, other: DraftSource):
        self.forced, self.other = forced, other
        # A model would spend a decode on each forced token it rewrote: it waits for the free text.
        self.copies = copying_part(other)

    @property
    def model(self):
        return self.other.model

    def propose(self, history: Sequence[int], limit: int, policy: DraftPolicy, sampler: Sampler) -> Draft:
        forced = self.forced.propose(history, limit, policy, sampler)
        if not forced.tokens:
            return self.other.propose(history, limit, policy, sampler)
        copy = self.copies.propose(history, limit, policy, sampler) if self.copies is not None else None
        return copy if copy is not None and self.forced.writes_and_goes_past(forced.tokens, copy.tokens) else forced

    def rollback(self, history: Sequence[int]) -> None:
        self.other.rollback(history)
