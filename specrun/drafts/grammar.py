"""Drafts of what a grammar forces (keys, quotes, commas, a call's opening): free to draft, and
always allowed.

`GrammarDraft` proposes the text the grammar forces from the current state, in the target's
tokens. `GrammarFirst` puts it ahead of the other sources: where text is forced, a copy
(lookup, the store) still drafts if it writes that text and more; a draft model is asked
only where nothing is forced, so its decodes never redo what the grammar gives free.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from specrun.backend import Model
from specrun.core.drafting import Draft, DraftRequest, DraftSource, Proposal, without_decodes
from specrun.drafts.chain import copying_part
from specrun.drafts.word_tokens import exact_tokens
from specrun.grammar.constraint import Constraint


class GrammarDraft:
    """Drafts the tokens the grammar forces from here (the target's tokenization of that text)."""

    names: tuple[str, ...] = ("grammar",)
    counters: tuple[str, ...] = ()
    parts: tuple[DraftSource, ...] = ()
    runs_model = False
    PRIOR = 0.95  # forced text is always allowed; the target may still split it into other tokens

    def __init__(self, constraint: Constraint, target: Model):
        self.constraint, self.target = constraint, target
        self.end = target.turn_end
        self.extendable = target.prefix_tokens  # read once per model (a second for 262k tokens), before any timing
        self.pieces = target.pieces()

    @without_decodes
    def propose(self, history: Sequence[int], request: DraftRequest) -> Draft:
        text, ends = self.constraint.forced()
        tokens = (exact_tokens(self.target, self.pieces, text.encode()) or []) if text else []
        if ends:
            tokens.append(self.end)
        elif tokens and tokens[-1] in self.extendable:
            tokens.pop()  # the free text after it may be written with a longer token (`"` then `"John`)
        if not tokens:
            return Draft()
        return Draft.under(request.offer(self.names[0], min(len(tokens), request.limit), self.PRIOR), tokens)

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
    where nothing is forced, the other sources' draft, a model's included. Only the draft it
    keeps is reported to the policy, with the declines on the way to it."""

    def __init__(self, forced: GrammarDraft, other: DraftSource):
        self.forced, self.other = forced, other
        self.parts = (forced, other)
        self.names = tuple(dict.fromkeys((*forced.names, *other.names)))
        self.counters = other.counters
        self.runs_model = other.runs_model
        # A model would spend a decode on each forced token it rewrote: it waits for the free text.
        self.copies = copying_part(other)

    def propose(self, history: Sequence[int], request: DraftRequest) -> Proposal:
        forced = yield from self.forced.propose(history, request)
        if not forced.tokens:
            other = yield from self.other.propose(history, request)
            return replace(other, declined=forced.declined + other.declined)
        copy = (yield from self.copies.propose(history, request)) if self.copies is not None else None
        if copy is not None and self.forced.writes_and_goes_past(forced.tokens, copy.tokens):
            return copy
        return forced

    def rollback(self, history: Sequence[int]) -> None:
        self.other.rollback(history)
