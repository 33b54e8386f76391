"""How many tokens to draft: fixed k, llama.cpp's rule, or `auto` (core/auto.py: cost-aware, measured).

`DraftPolicy` is the whole contract, in four verbs:
- `offer(source, limit, prior, rows, block)`: what the policy grants a source this step, as a
  `Budget`, in a target decode that holds `rows` rows of other streams already; `block`: the
  source drafts a whole block in one decode, whatever part of it is kept (DFlash). A query: it
  changes nothing, so a draft that is proposed and then thrown away teaches nothing.
- `extend(budget, confidence)`: the budget with one more model-drafted token kept, or None
  where that token is not worth verifying. Also a query.
- `chances(budget, n, confidences)`: what each of a draft's rows is expected to add, so that a
  batch of streams can verify the rows that pay most for the decode's cost; none where a
  draft is verified whole. Also a query.
- `observe(step)`: what the verified step did, with the budgets it drafted under and those
  the policy declined on the way; the only verb that changes the policy's state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol, Sequence

from specrun.settings import K_ALLOWED, SettingError, check

LLAMA_CPP_DRAFT_MAX = 16  # llama.cpp's --draft-max default, for --k llama.cpp
# Under --k auto a recurrent or hybrid target keeps snapshots to roll back this many drafted
# tokens: each is one more copy of its recurrent state (`specrun pair check` reports their memory).
AUTO_ROLLBACK = 16
PRIOR = 0.7  # acceptance per position assumed of a draft source before any is measured

Decision = Literal["grant", "first", "probe", "decline", "none"]
"""How a budget came about, for auto's bookkeeping once the step is verified: a grant on what was
measured, the first grant to a source, a probe of a source that plain decoding beats, a decline
(k = 0: plain is faster for now), or none (nothing could be drafted: nothing to learn)."""


def rollback_tokens(k: int | str) -> int:
    """How many drafted tokens a recurrent or hybrid target keeps snapshots for under a k: the
    longest draft it grants."""
    return k if isinstance(k, int) else LLAMA_CPP_DRAFT_MAX if k == "llama.cpp" else AUTO_ROLLBACK


class Budget(NamedTuple):
    """One step's allowance for one source: what `offer` granted and what `extend` has kept of it.

    Drafters hand it back to `extend` with each model-drafted token and return it with their
    draft; nothing about the step in flight lives in the policy. A named tuple, not a dataclass:
    `extend` makes one per drafted token, and `_replace` costs a fraction of `dataclasses.replace`.
    """

    source: str  # the name the source drafts under (a policy learns each apart)
    k: int  # the most tokens the source may draft this step (0: a plain step)
    decision: Decision = "grant"
    prior: float = PRIOR  # the acceptance the source expects before any is measured
    rows: int = 0  # rows other streams hold in the same decode (their tokens and cost count in)
    block: bool = False  # the source drafts a block in one decode: what drafting costs does not grow with k
    kept: int = 0  # auto: model-drafted tokens kept so far
    gain: float = 1.0  # auto: tokens the step is expected to yield with the tokens kept so far
    alive: float = 1.0  # auto: the chance that every kept token is accepted


class StepRecord(NamedTuple):
    """What one verified step did, as a policy learns from it (a named tuple, as `Budget` is:
    every step makes one, and a frozen dataclass costs several times as much to make)."""

    budget: Budget | None  # what the verified draft was granted; None for a plain step
    declined: tuple[Budget, ...]  # sources the policy turned down (k = 0) on the way to this step's draft
    drafted: int
    accepted: int
    confidences: Sequence[float] | None  # the drafter's confidence per drafted token (Draft.confidences), when measured
    draft_s: float  # seconds spent drafting
    verify_s: float  # seconds of the verify decode and the check of its rows
    catch_up_s: float = 0.0  # of draft_s, feeding a draft's cache text it missed (see Draft.catch_up_s)
    rows: int | None = 0  # the decode's rows, every stream's (0: this step's own, drafted + 1; None: it held a prompt's too)


class DraftPolicy(Protocol):
    """How many tokens to draft, per step and source: `offer` before drafting, `extend` before
    each model-drafted token (both queries), `observe` once the step is verified."""

    label: str  # how --k and the chat panel name it ("auto", "8", "llama.cpp")
    max_k: int  # the longest draft it ever grants: the verify batch needs max_k + 1 rows
    wants_confidence: bool  # whether `extend` reads a token's probability (drafters compute it only then)
    learns: bool  # whether `observe` learns from steps (the engine makes each step's record only then)

    def offer(self, source: str, limit: int, prior: float = PRIOR, rows: int = 0, block: bool = False) -> Budget:
        """This step's budget for `source`, at most `limit` tokens (k = 0: do not draft).

        `prior`: the acceptance the drafter expects from this source before any is measured;
        `rows`: rows other streams hold in the same target decode; `block`: the source drafts
        its tokens in one decode (a block drafter), not one decode a token.
        """
        ...

    def extend(self, budget: Budget, confidence: float) -> Budget | None:
        """The budget with one more model-drafted token (probability `confidence`) kept, or
        None when that token is not worth verifying: the draft ends before it."""
        ...

    def chances(self, budget: Budget, n: int, confidences: Sequence[float] | None) -> tuple[float, ...]:
        """For each of the n tokens drafted under `budget`, the chance that it and every one
        before it are accepted (the tokens its row is expected to add); () where the draft is
        to be verified whole. A batch verifies, of its streams' drafts, the rows that pay."""
        ...

    def observe(self, step: StepRecord) -> None:
        """Learn from a verified step (or a plain one)."""
        ...


class FixedK:
    """Draft k tokens whenever the drafter offers them (a lookup copy may offer fewer)."""

    wants_confidence = False
    learns = False

    def __init__(self, k: int):
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise SettingError("k", K_ALLOWED, k)
        self.k = self.max_k = k
        self.label = str(k)

    def offer(self, source: str, limit: int, prior: float = PRIOR, rows: int = 0, block: bool = False) -> Budget:
        return Budget(source, max(0, min(self.k, limit)), prior=prior, rows=rows, block=block)

    def extend(self, budget: Budget, confidence: float) -> Budget | None:
        return budget  # a fixed k tracks nothing per token, so no new tuple per drafted token

    def chances(self, budget: Budget, n: int, confidences: Sequence[float] | None) -> tuple[float, ...]:
        return ()  # a k asked for is verified whole

    def observe(self, step: StepRecord) -> None:
        pass


class PMinPolicy(FixedK):
    """llama.cpp's speculative rule: up to --draft-max 16, stop below --draft-p-min 0.75."""

    wants_confidence = True

    def __init__(self, k: int = LLAMA_CPP_DRAFT_MAX, p_min: float = 0.75):
        super().__init__(k)
        self.p_min = p_min
        self.label = "llama.cpp"

    def extend(self, budget: Budget, confidence: float) -> Budget | None:
        return budget if confidence >= self.p_min else None


@dataclass(frozen=True)
class SpeculativeSettings:
    """llama-server's per-request `speculative` object, with its defaults."""

    n_max: int = LLAMA_CPP_DRAFT_MAX  # the most tokens drafted
    n_min: int = 0  # a copied draft shorter than this is not verified
    p_min: float = 0.75  # a model draft stops below this probability

    def __post_init__(self) -> None:
        check(n_max=self.n_max, n_min=self.n_min, p_min=self.p_min)
        if self.n_min > self.n_max:
            raise SettingError("n_min", f"<= n_max ({self.n_max})", self.n_min)


class SpeculativeRule(PMinPolicy):
    """llama-server's per-request `speculative`: at most n_max drafted, p_min for model drafts,
    and a copied draft shorter than n_min is not verified (a model draft's length is not
    known before it is drafted, so n_min does not apply to it)."""

    def __init__(self, settings: SpeculativeSettings):
        super().__init__(settings.n_max, settings.p_min)
        self.n_min = settings.n_min
        self.label = "speculative"

    def offer(self, source: str, limit: int, prior: float = PRIOR, rows: int = 0, block: bool = False) -> Budget:
        budget = super().offer(source, limit, prior, rows, block)
        return budget if budget.k >= self.n_min else budget._replace(k=0)


def ema(old: float, new: float, weight: float, first: bool) -> float:
    """An exponential moving average's next value (`first`: there is no old one yet)."""
    return new if first else (1 - weight) * old + weight * new
