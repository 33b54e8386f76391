"""Several draft sources as one: the chain that asks them in turn, and the parts of one."""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from specrun.core.drafting import Draft, DraftRequest, DraftSource, Proposal
from specrun.core.policy import Budget


class Chain:
    """Draft sources in order (context lookup, the cross-request store, a model): the first that
    drafts, drafts; the budgets the policy declined to those asked before it travel with it."""

    counters: tuple[str, ...]

    def __init__(self, *parts: DraftSource):
        self.parts = parts
        self.names = tuple(dict.fromkeys(name for part in parts for name in part.names))
        self.counters = tuple(dict.fromkeys(name for part in parts for name in part.counters))
        self.runs_model = any(part.runs_model for part in parts)

    def propose(self, history: Sequence[int], request: DraftRequest) -> Proposal:
        declined: tuple[Budget, ...] = ()
        draft = Draft()
        for part in self.parts:
            draft = yield from part.propose(history, request)
            draft = replace(draft, declined=declined + draft.declined)
            if draft.tokens:
                break
            declined = draft.declined
        return draft

    def rollback(self, history: Sequence[int]) -> None:
        for part in self.parts:
            part.rollback(history)


def chained(sources: Sequence[DraftSource]) -> DraftSource | None:
    """One source for `sources`: none, the one, or a chain of them in order."""
    if len(sources) < 2:
        return sources[0] if sources else None
    return Chain(*sources)


def leaves(source: DraftSource) -> list[DraftSource]:
    """The single sources inside `source`, in the order they are asked."""
    return [leaf for part in source.parts for leaf in leaves(part)] if source.parts else [source]


def copying_part(source: DraftSource) -> DraftSource | None:
    """The part of `source` that drafts without a model (lookup, the store), whose drafts cost
    no decodes; None when every part of it runs a model."""
    return chained([leaf for leaf in leaves(source) if not leaf.runs_model])


def model_part(source: DraftSource | None) -> DraftSource | None:
    """The part of `source` that drafts with a model of its own (alone, or chained with copies)."""
    return next((leaf for leaf in leaves(source) if leaf.runs_model), None) if source is not None else None
