"""The contract every draft source keeps, as the engine that drives it states it.

A source guesses the next tokens of a generation. The engine asks it with a `DraftRequest`
each step, verifies what it proposes in one target decode and, after every step, tells it
the history to roll back to. The whole contract is `DraftSource`:
- `names`: what its drafts are reported under; a policy learns each name apart (lookup
  reports a short match, a long one and a copy as three).
- `counters`: the `Stats.counters` its drafts add to (`Draft.counters`), zero from the start.
- `parts`: the sources a chain asks, in order; a single source has none.
- `runs_model`: whether drafting decodes a model (time per token) or only copies (free).
- `propose(history, request)`, a coroutine (`Proposal`): it yields each decode its model needs
  (`DraftDecode`), is sent that decode's `DraftRows`, and returns its `Draft`. The caller runs the
  decodes: one stream's alone (`drafted`), a batch's together, one decode per draft cache for
  every stream drafting the next position. A source that decodes nothing writes its propose
  as a function returning the draft and marks it `@without_decodes`.
- `rollback(history)`.

A source sizes each draft by `request.offer(name, ...)` and returns the `Budget` with
the draft (`Draft.under`); the engine refuses tokens proposed without one, so no source can
draft where the policy never hears of it.

What else a source must know:
- One instance serves one stream across its generations: the next `propose` may come with an
  unrelated history (a new prompt), after `rollback` to the common part, or `[]`.
- `history` is the engine's own list, which grows after every step: read it, keep a copy of
  what must outlive the call, never change it. Within a generation it is one `History`, which
  only grows: a source that follows it can remember how much of it it has seen, and compare
  only what was added (`Context.reuse_prefix` does so for a cache).
- `Draft.dists` and `Draft.confidences` run parallel to `Draft.tokens`, one entry per token.
  A sampled draft's `dists[i]` must be exactly the distribution `tokens[i]` was drawn from
  (the p/q rule is exact only then); a deterministic draft leaves `dists` None.
  `confidences[i]` is the probability of the likeliest token there, never of the token drawn:
  stops and a batch's cut read it, and a stop that depended on the draw would bias the rule.
- A source with a model of its own decodes on a `DraftCache`: a `Context` sequence of a draft
  model's cache, or anything with `n_batch`, `eval(tokens, logits_rows)` (the last rows'
  logits), `decode_many([(cache, tokens, rows), ...])` (several caches of one llama.cpp
  context in one decode) and `shares_cache(other)` (whether `decode_many` takes both).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Concatenate, Generator, Literal, Mapping, NamedTuple, ParamSpec, Protocol, Sequence, TypeVar

import numpy as np

from specrun.core.driver import drive
from specrun.core.policy import PRIOR, Budget, DraftPolicy
from specrun.core.sampling import Distribution, Sampler

CatchUp = Literal["window", "all"]
"""How a source with a cache of its own that fell far behind the text (a new prompt) catches up:
on the last window of it, sized by what feeding costs ("window", under auto), or on all of it,
as llama.cpp does."""


@dataclass(frozen=True)
class DraftRequest:
    """What the engine asks of a source in one step."""

    limit: int  # the most tokens the step can verify
    policy: DraftPolicy  # sizes the draft: offer() before drafting, extend() before each model-drafted token
    sampler: Sampler  # a source that samples draws from its stream, with its settings
    catch_up: CatchUp = "all"
    rows: int = 0  # rows other streams put in the same target decode (batched streams)

    def offer(self, source: str, limit: int, prior: float = PRIOR, block: bool = False) -> Budget:
        """The policy's budget for `source` this step, priced in the decode it joins (`block`: a
        source that drafts all its tokens in one decode)."""
        return self.policy.offer(source, limit, prior, self.rows, block)


@dataclass(frozen=True)
class Draft:
    """A source's guess for the next tokens, and what it cost to make."""

    tokens: list[int] = field(default_factory=list)
    budget: Budget | None = None  # what the policy granted (k > 0); None: nothing was drafted
    declined: tuple[Budget, ...] = ()  # budgets of k = 0 the policy gave on the way (chains collect them)
    dists: list[Distribution] | None = None  # q_i of each token when the source sampled; None: deterministic
    # A model draft's confidence at each token: the probability of its likeliest token there (not of
    # the token it sampled, on which no stop may depend), for confidence stops and a batch's cut.
    confidences: list[float] | None = None
    counters: Mapping[str, float] = field(default_factory=dict)  # what this draft adds to its source's counters
    # Seconds a source with a cache spent feeding it more text than one step can accept (a new
    # prompt, or text other sources drafted) before it could draft: charged to probes, not per token.
    catch_up_s: float = 0.0

    @property
    def source(self) -> str | None:
        """The name the draft was granted under (None: no draft)."""
        return self.budget.source if self.budget is not None else None

    @classmethod
    def under(cls, budget: Budget, tokens: Sequence[int] = (), **measured) -> Draft:
        """`tokens` drafted under `budget` (at most its k); no draft where the policy declined."""
        if budget.k < 1:
            return cls(declined=(budget,) if budget.decision != "none" else ())
        return cls(list(tokens[: budget.k]), budget, **measured)


class DraftRows(NamedTuple):
    """What a `DraftDecode` is answered with: its last rows' logits (valid until that cache's next
    decode), and the seconds and tokens of the decode that held it (in a batch, other streams'
    tokens too)."""

    logits: np.ndarray
    seconds: float
    tokens: int

    @classmethod
    def of(cls, logits: np.ndarray, seconds: float, decodes: Sequence[DraftDecode]) -> DraftRows:
        """A source's row of one decode of `decodes` (every stream's) that took `seconds`."""
        return cls(logits, seconds, sum(len(decode.tokens) for decode in decodes))

    def share_s(self, tokens: int) -> float:
        """The seconds of the decode that `tokens` of its tokens account for."""
        return self.seconds * tokens / self.tokens


class DraftCache(Protocol):
    """What a draft decode runs on: a stream's sequence of a draft model's cache (`Context`) or
    its MTP head (`backend.mtp.MtpHead`); sequences of one cache decode together."""

    @property
    def n_batch(self) -> int: ...

    def eval(self, tokens: Sequence[int], logits_rows: int = 1) -> np.ndarray: ...

    def decode_many(self, parts: Sequence[tuple[Any, Sequence[int], int]]) -> list[np.ndarray]: ...

    def shares_cache(self, other: Any) -> bool: ...


class DraftDecode(NamedTuple):
    """A decode a source's draft needs: `tokens` onto `context` (its sequence of a draft cache),
    and how many of the last rows' logits it reads (more than one: a block drafter's)."""

    context: DraftCache
    tokens: Sequence[int]
    rows: int = 1

    def alone(self) -> DraftRows:
        """Run as a decode of its own (one stream)."""
        started = time.perf_counter()
        logits = self.context.eval(self.tokens, self.rows)
        return DraftRows(logits, time.perf_counter() - started, len(self.tokens))


Result = TypeVar("Result")
NeedsDecodes = Generator[DraftDecode, DraftRows, Result]
"""A coroutine that yields the draft decodes it needs, is sent each one's `DraftRows`, and returns its result."""
Proposal = NeedsDecodes[Draft]
"""A source's `propose`."""

Source = TypeVar("Source")
Args = ParamSpec("Args")


def without_decodes(propose: Callable[Concatenate[Source, Args], Draft]) -> Callable[Concatenate[Source, Args], Proposal]:
    """The `propose` of a source that decodes nothing (a copy, a grammar's forced text), written
    as a function that returns its draft, as the contract's coroutine."""

    @functools.wraps(propose)
    def drafting(source: Source, *args: Args.args, **kwargs: Args.kwargs) -> Proposal:
        yield from ()
        return propose(source, *args, **kwargs)

    return drafting


def drafted(source: DraftSource, history: Sequence[int], request: DraftRequest) -> Draft:
    """`source`'s draft for one stream, each decode it asks for run on its own."""
    return drive(source.propose(history, request))


class DraftSource(Protocol):
    """Anything that guesses the next tokens: the engine asks, verifies and rolls back."""

    @property
    def names(self) -> tuple[str, ...]:
        """The names its drafts are reported under; the first is its own."""
        ...

    @property
    def counters(self) -> tuple[str, ...]:
        """The Stats.counters its drafts add to."""
        ...

    @property
    def parts(self) -> tuple[DraftSource, ...]:
        """The sources a chain asks, in order; none for a single source."""
        ...

    @property
    def runs_model(self) -> bool:
        """Whether drafting decodes a model (time per token) or only copies (free)."""
        ...

    def propose(self, history: Sequence[int], request: DraftRequest) -> Proposal:
        """Up to `request.limit` tokens guessed to follow `history` (which ends with the last
        emitted token), as many as the policy grants; the decodes that takes yielded to the caller."""
        ...

    def rollback(self, history: Sequence[int]) -> None:
        """Forget any state (cached drafts) that is not part of `history`; [] empties it."""
        ...
