"""Draft sources: anything that guesses the next k tokens behind one small interface."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np

from specrun.backend import Context
from specrun.errors import SpecrunError
from specrun.policy import PRIOR, DraftPolicy, Source, ema
from specrun.sampling import Distribution, Sampler, filtered


@dataclass(frozen=True)
class Translation:
    """What a draft with another vocabulary spent keeping in step with the target's text."""

    seconds: float  # re-encoding the accepted text and tokenizing the guess for the target
    # Draft tokens fed to its cache for the text accepted since the last step:
    reencoded: int  # re-encoded from a window of the text
    kept: int  # its own guess, which the accepted text confirmed (already cached)


@dataclass(frozen=True)
class Draft:
    source: Source | None  # which drafter produced it ("lookup", "draft", ...; None: no drafter); policies learn per source
    tokens: list[int] = field(default_factory=list)
    # q_i for each token when the drafter sampled; None when it is deterministic.
    dists: list[Distribution] | None = None
    # The drafter's probability for each token (model drafts), for confidence stops.
    confidences: list[float] | None = None
    translation: Translation | None = None  # a draft model with another vocabulary says what translating cost
    # Seconds a model draft spent feeding its cache more text than one step can accept (a new
    # prompt, or text other sources drafted) before it could draft: charged to probes, not per token.
    catch_up_s: float = 0.0


CATCH_UP_DRAFTS = 16  # a bounded catch-up feeds what drafting this many tokens one by one costs
MIN_WINDOW = 32  # the least context a bounded catch-up leaves a draft, and all it feeds before that is measured
TIMED_BATCH = 8  # feeds of at least this many tokens measure the per-token cost of catching up


class FeedCost:
    """What a draft model takes per token to feed its cache one token at a time (drafting) and
    in a batch (catching up), and so the window a bounded catch-up feeds: the text that costs as
    much as drafting CATCH_UP_DRAFTS tokens. Where a batch is far cheaper per token than one
    token (a GPU) that is the whole context; on two CPU cores, the last few dozen tokens."""

    def __init__(self) -> None:
        self.one_s = 0.0  # seconds for a one-token decode
        self.batched_s = 0.0  # seconds per token in a batch of TIMED_BATCH or more

    @property
    def measured(self) -> bool:
        return bool(self.one_s and self.batched_s)

    def eval(self, context: Context, tokens: Sequence[int]) -> np.ndarray:
        """Feed `tokens`, timing it; until both costs are known, a batch goes in as all but its
        last token and then that one alone, which times each at no extra cost."""
        if not self.measured and len(tokens) > TIMED_BATCH:
            self._timed(context, tokens[:-1])
            tokens = tokens[-1:]
        return self._timed(context, tokens)

    def _timed(self, context: Context, tokens: Sequence[int]) -> np.ndarray:
        started = time.perf_counter()
        logits = context.eval(tokens)
        seconds = time.perf_counter() - started
        if len(tokens) == 1:
            self.one_s = ema(self.one_s, seconds, 0.2, not self.one_s)
        elif len(tokens) >= TIMED_BATCH:
            self.batched_s = ema(self.batched_s, seconds / len(tokens), 0.2, not self.batched_s)
        return logits

    @property
    def window(self) -> int:
        if not self.measured:
            return MIN_WINDOW
        return max(MIN_WINDOW, int(CATCH_UP_DRAFTS * self.one_s / self.batched_s))


def catch_up_seconds(fed: int, k: int, seconds: float) -> float:
    """Of `seconds` spent decoding `fed` tokens before drafting up to `k`, what was catching up:
    all of it where more was fed than a step of k drafts can accept, else nothing."""
    return seconds if fed > k + 1 else 0.0


class DraftSource(Protocol):
    """Anything that guesses the next tokens: the engine asks, verifies and rolls back."""

    name: str

    def propose(self, history: Sequence[int], limit: int, policy: DraftPolicy, sampler: Sampler) -> Draft:
        """Up to `limit` tokens guessed to follow `history` (which ends with the last emitted token),
        as many as `policy` grants; a drafter that samples draws with `sampler`."""
        ...

    def rollback(self, history: Sequence[int]) -> None:
        """Forget any state (cached drafts) that is not part of `history`; [] empties it."""
        ...

    @property
    def model(self) -> "DraftModel | None":
        """The source in here that drafts with a model of its own, or None."""
        ...


class PromptLookup:
    """Copies what followed the most recent earlier occurrence of the longest matching n-gram.

    The index maps each n-gram to the end of its latest occurrence that has a follower,
    and grows with the history, so a step never rescans it: a step costs the same however
    long the history is. A copy stops where the history has seen its context go on in
    more than one way (one "return self." went on with "items.pop()", another with
    "items[-1]"): there it would only guess. A copy whose source has been in step with the
    text for TRUSTED_MATCH tokens goes on: the text is being copied, and a 4-token context
    is too short to tell table rows or repeated phrases apart.

    How far back the source agrees with the text predicts how much of the copy will be
    accepted, so matches are reported as three sources the policy learns and sizes apart:
    "lookup" (short matches), "lookup-long" (LONG_MATCH tokens or more) and "lookup-copy"
    (COPY_MATCH or more: the text has been copying for a while, so a long draft pays; one
    rejection drops the next match back to a short one).

    The end of a copied block (a function, a quote, a table row set) is where copies most
    often break: past it, the source goes on with text of its own. So a copy stops after a
    blank line of its source (`breaks`: the vocabulary's blank-line tokens) until copies
    have more often than not gone on past one, as they do where whole sections with blank
    lines inside are copied.
    """

    name = "lookup"
    LONG_MATCH = 6
    COPY_MATCH = 32
    TRUSTED_MATCH = 12  # a copy this far in step with the text goes on past ambiguous contexts
    # Acceptance per position expected before any is measured, by how far back the match reaches.
    PRIORS = {"lookup": PRIOR, "lookup-long": 0.9, "lookup-copy": 0.99}

    def __init__(self, n_min: int = 2, n_max: int = 4, breaks: frozenset[int] = frozenset()):
        if not 1 <= n_min <= n_max:
            raise SpecrunError(f"lookup n-gram range has to satisfy 1 <= min <= max, but is {n_min}..{n_max}")
        self.n_min, self.n_max = n_min, n_max
        self._index: dict[tuple[int, ...], int] = {}
        self._ambiguous: set[tuple[int, ...]] = set()  # n-grams seen with more than one follower
        self._indexed: list[int] = []  # the history the index was built from
        self.breaks = breaks
        self._crossings = [0, 0]  # copies that went on past a blank line of their source, of those seen
        self._crossing: tuple[int, int] | None = None  # (position, token) the last copy expected past a blank line

    model = None  # copies from the history: no model of its own

    def propose(self, history: Sequence[int], limit: int, policy: DraftPolicy, sampler: Sampler) -> Draft:
        self._extend_index(history)
        self._learn_crossing(history)
        end = self._match_end(history)
        if end is None:
            return Draft(self.name)
        # The policy sizes what the copy can offer: a cost-aware one then sees the real choice.
        agreed = self._match_length(history, end)
        copy = self._unambiguous_prefix(history, history[end + 1 : end + 1 + limit], agreed)
        copy = self._to_block_end(len(history), copy)
        if not copy:
            return Draft(self.name)
        source = self._source(agreed)
        return Draft(source, copy[: policy.cap(source, len(copy), self.PRIORS[source]).k])

    def _source(self, agreed: int) -> str:
        if agreed >= self.COPY_MATCH:
            return f"{self.name}-copy"
        return f"{self.name}-long" if agreed >= self.LONG_MATCH else self.name

    def _match_end(self, history: Sequence[int]) -> int | None:
        """Where the latest occurrence of the longest indexed suffix n-gram ends."""
        ngram = self._longest_ngram(history)
        return None if ngram is None else self._index[ngram]

    def _longest_ngram(self, tokens: Sequence[int]) -> tuple[int, ...] | None:
        for n in range(min(self.n_max, len(tokens)), self.n_min - 1, -1):
            ngram = tuple(tokens[-n:])
            if ngram in self._index:
                return ngram
        return None

    def _unambiguous_prefix(self, history: Sequence[int], copy: Sequence[int], agreed: int) -> list[int]:
        """The copy up to the first token whose context the history continued in several ways.

        `agreed`: how many tokens before the copy's source equal the history's end; each
        copied token extends that, and from TRUSTED_MATCH on, the copy is the context.
        """
        context = list(history[-self.n_max :])
        for i, token in enumerate(copy):
            if agreed + i < self.TRUSTED_MATCH and self._longest_ngram(context) in self._ambiguous:
                return list(copy[:i])
            context.append(token)
        return list(copy)

    def _match_length(self, history: Sequence[int], end: int) -> int:
        """How many tokens back (up to COPY_MATCH) the text before `end` equals the history's end."""
        length = 0
        while length < self.COPY_MATCH and end - length >= 0 and history[end - length] == history[-1 - length]:
            length += 1
        return length

    def _to_block_end(self, start: int, copy: list[int]) -> list[int]:
        """The copy up to its first blank line, unless copies have mostly gone on past one."""
        for i, token in enumerate(copy[:-1]):
            if token in self.breaks:
                self._crossing = (start + i + 1, copy[i + 1])
                hits, tries = self._crossings
                return copy if 2 * hits > tries else copy[: i + 1]  # gone on past one more often than not
        return copy

    def _learn_crossing(self, history: Sequence[int]) -> None:
        """Whether the text went on as the last copy's source did past its blank line (known
        once the text reaches past it; a copy rejected before it says nothing)."""
        if self._crossing is not None:
            position, token = self._crossing
            if len(history) > position:
                self._crossings[0] += history[position] == token
                self._crossings[1] += 1
            self._crossing = None

    def rollback(self, history: Sequence[int]) -> None:
        pass  # the index only ever holds n-grams of the history itself

    def _extend_index(self, history: Sequence[int]) -> None:
        done = len(self._indexed)
        if done > len(history) or history[done - 1 : done] != self._indexed[done - 1 : done]:
            self._index.clear()  # a different conversation: start over
            self._ambiguous.clear()
            self._indexed = []
            self._crossing = None
            done = 0
        self._indexed.extend(history[done:])
        # Positions that now have a follower: n-grams ending at done-1 .. len-2.
        for end in range(max(done - 1, 0), len(history) - 1):
            for n in range(self.n_min, min(self.n_max, end + 1) + 1):
                ngram = tuple(history[end - n + 1 : end + 1])
                earlier = self._index.get(ngram)
                if earlier is not None and history[earlier + 1] != history[end + 1]:
                    self._ambiguous.add(ngram)
                self._index[ngram] = end


def blank_lines(model) -> frozenset[int]:
    """The tokens of this model's vocabulary that are a blank line and nothing else ("\\n\\n", ...)."""
    spellings = (model.tokenize("\n" * n, add_special=False, parse_special=False) for n in range(2, 9))
    return frozenset(tokens[0] for tokens in spellings if len(tokens) == 1)


class DraftModel:
    """A second, smaller GGUF run on its own KV cache, greedily or by sampling.

    The cache holds the history, or, where a policy bounds catching up and feeding all the
    cache lacks would cost more than `FeedCost.window` allows, the history's first token (the
    start token, which attention leans on) and its last `window` tokens.
    """

    name = "draft"

    def __init__(self, context: Context, sample: bool = True):
        """`sample`: at temperature > 0, sample the drafts (verified by the p/q rule); else greedy."""
        self.context = context
        self.sample = sample
        self.feed = FeedCost()
        self.start = 0  # where in the history the cache's window begins, after its first token (0: all of it)
        # Reused every token: no vocab-sized allocation per draft.
        self._softmax = np.empty(context.model.n_vocab, dtype=np.float32)
        self._scratch = np.empty(context.model.n_vocab, dtype=bool)

    @property
    def model(self) -> "DraftModel":
        return self

    def propose(self, history: Sequence[int], limit: int, policy: DraftPolicy, sampler: Sampler) -> Draft:
        budget = policy.cap(self.name, min(limit, self.context.free_slots - 1))
        if budget.k < 1:
            return Draft(self.name)
        started = time.perf_counter()
        fed, logits = self._catch_up(history, policy.bounds_catch_up)
        if self.start and len(history) <= self.feed.window + 1:
            fed, logits = self._catch_up(history, True)  # that feed timed feeding cheap enough for all of it
        catch_up_s = catch_up_seconds(fed, budget.k, time.perf_counter() - started)
        sample = self.sample and not sampler.settings.greedy
        tokens: list[int] = []
        dists: list[Distribution] = []
        confidences: list[float] = []
        for i in range(budget.k):
            token, q, confidence = self._guess(logits[-1], sampler, sample, policy.wants_confidence)
            budget = policy.keep(budget, confidence)
            if budget is None:
                break
            tokens.append(token)
            confidences.append(confidence)
            if q is not None:
                dists.append(q)
            if i < budget.k - 1:
                logits = self.feed.eval(self.context, [token])
        measured = sample or policy.wants_confidence
        return Draft(self.name, tokens, dists if sample else None, confidences if measured else None, catch_up_s=catch_up_s)

    def _guess(self, row: np.ndarray, sampler: Sampler, sample: bool,
               wants_confidence: bool) -> tuple[int, Distribution | None, float]:
        """The next draft token, the distribution it was sampled from (None: argmax), its probability."""
        if sample:
            q = filtered(row, sampler.settings, self._scratch)
            token = q.sample(sampler.rng)
            return token, q, q.prob(token)
        token = int(np.argmax(row))
        return token, None, self._top_probability(row) if wants_confidence else 1.0

    def _top_probability(self, row: np.ndarray) -> float:
        np.subtract(row, row.max(), out=self._softmax)
        np.exp(self._softmax, out=self._softmax)
        return float(1.0 / self._softmax.sum())

    def _catch_up(self, history: Sequence[int], bounded: bool) -> tuple[int, np.ndarray]:
        """Feed the cache what it lacks of its view of `history` (its cached prefix reused; after
        a fully accepted draft, just that); how many tokens that was, and the last one's logits."""
        view = self._view(history, bounded)
        if len(self.context.tokens) == len(view):
            self.context.truncate(len(view) - 1)  # we need the last position's logits again
        missing = view[len(self.context.tokens) :]
        return len(missing), self.feed.eval(self.context, missing)

    def _view(self, history: Sequence[int], bounded: bool) -> Sequence[int]:
        """What the cache should hold of `history`, its longest cached prefix kept: all of it, or
        where catching up is bounded and it lacks more than the window, its first and last tokens."""
        window = self.feed.window if bounded else len(history)
        if self.start >= len(history) - 1 or len(history) <= window + 1:
            self.start = 0  # rolled back into the window's gap, or all of it fits the window now
        view = self._windowed(history)
        if len(view) - self.context.reuse_prefix(view) > window:
            self.start = len(history) - window
            view = self._windowed(history)
            self.context.reuse_prefix(view)
        return view

    def _windowed(self, history: Sequence[int]) -> Sequence[int]:
        return [*history[:1], *history[self.start :]] if self.start else history

    def rollback(self, history: Sequence[int]) -> None:
        self.context.reuse_prefix(self._windowed(history) if self.start < len(history) - 1 else history)


class Hybrid:
    """Draft sources in order (context lookup, the cross-request store, the draft model): the first that offers a draft drafts."""

    name = "hybrid"

    def __init__(self, *sources: DraftSource):
        self.sources = sources

    @property
    def model(self) -> DraftModel | None:
        return next((source.model for source in self.sources if source.model is not None), None)

    def propose(self, history: Sequence[int], limit: int, policy: DraftPolicy, sampler: Sampler) -> Draft:
        for source in self.sources:
            draft = source.propose(history, limit, policy, sampler)
            if draft.tokens:
                break
        return draft

    def rollback(self, history: Sequence[int]) -> None:
        for source in self.sources:
            source.rollback(history)


def copying_part(source: DraftSource) -> DraftSource | None:
    """The part of `source` that drafts without a model of its own (lookup, the store), whose
    drafts cost no decodes; None when every part of it is a model."""
    parts = [part for part in getattr(source, "sources", (source,)) if part.model is None]
    return parts[0] if len(parts) == 1 else Hybrid(*parts) if parts else None
