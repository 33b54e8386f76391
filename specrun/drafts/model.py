"""Drafting with a second, smaller model of the target's vocabulary, on a KV cache of its own.

Also what every source with a model shares: `FeedCost`, which times feeding the draft's
cache and so sizes the window a cache far behind the text catches up on, and `Picker`,
which picks a draft token from a logits row (sampled with its q, or the argmax).
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from specrun.backend import Context
from specrun.core.policy import ema
from specrun.core.sampling import Distribution, Sampler, filtered
from specrun.drafts.base import CatchUp, Decodes, Draft, DraftDecode, Drafting, DraftRequest, DraftSource

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

    def eval(self, context: Context, tokens: Sequence[int]) -> Decodes[np.ndarray]:
        """Feed `tokens` (a decode yielded to the caller), timing it; until both costs are known, a
        batch goes in as all but its last token and then that one alone, which times each at no
        extra cost. A decode that held other streams' tokens too is charged its tokens' share."""
        if not self.measured and len(tokens) > TIMED_BATCH:
            yield from self._timed(context, tokens[:-1])
            tokens = tokens[-1:]
        return (yield from self._timed(context, tokens))

    def _timed(self, context: Context, tokens: Sequence[int]) -> Decodes[np.ndarray]:
        decoded = yield DraftDecode(context, tokens)
        logits, seconds = decoded.logits, decoded.share_s(len(tokens))
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

    def window_for(self, catch_up: CatchUp) -> int | None:
        """The most recent tokens a cache far behind the text is fed: the window, or None (all of it)."""
        return self.window if catch_up == "window" else None

    def covers(self, length: int) -> bool:
        """Whether the window, as now measured, spans `length` tokens: a windowed cache then takes all of the text."""
        return length <= self.window


def catch_up_seconds(fed: int, k: int, seconds: float) -> float:
    """Of `seconds` spent decoding `fed` tokens before drafting up to `k`, what was catching up:
    all of it where more was fed than a step of k drafts can accept, else nothing."""
    return seconds if fed > k + 1 else 0.0


class Picker:
    """Picks a model draft's next token from its logits row, with buffers reused every token
    (no vocabulary-sized allocation per draft)."""

    def __init__(self, n_vocab: int):
        self._softmax = np.empty(n_vocab, dtype=np.float32)
        self._scratch = np.empty(n_vocab, dtype=bool)

    def pick(
        self, row: np.ndarray, sampler: Sampler, sample: bool, wants_confidence: bool
    ) -> tuple[int, Distribution | None, float]:
        """The next draft token, the distribution it was sampled from (None: argmax), and the
        draft's confidence there: the probability of its likeliest token. For a sampled token
        that is not the token's own probability: where a draft stops or is cut depends on the
        confidence, and a stop that depended on which token was drawn would bias the p/q rule,
        which is exact only for drafts drawn from q as they are."""
        if sample:
            q = filtered(row, sampler.settings, self._scratch)
            token = q.sample(sampler.rng)
            return token, q, float(q.probs.max())
        token = int(row.argmax())
        if not wants_confidence:
            return token, None, 1.0
        np.subtract(row, row[token], out=self._softmax)
        np.exp(self._softmax, out=self._softmax)
        return token, None, float(1.0 / self._softmax.sum())


class DraftModel:
    """A second, smaller GGUF run on its own KV cache, greedily or by sampling.

    The cache holds the history, or, where catching up is windowed and feeding all the cache
    lacks would cost more than `FeedCost.window` allows, the history's first token (the start
    token, which attention leans on) and its last `window` tokens.
    """

    names: tuple[str, ...] = ("draft",)
    counters: tuple[str, ...] = ()
    parts: tuple[DraftSource, ...] = ()
    runs_model = True

    def __init__(self, context: Context, sample: bool = True):
        """`sample`: at temperature > 0, sample the drafts (verified by the p/q rule); else greedy."""
        self.context = context
        self.sample = sample
        self.feed = FeedCost()
        self.picker = Picker(context.model.n_vocab)
        self.start = 0  # where in the history the cache's window begins, after its first token (0: all of it)

    def propose(self, history: Sequence[int], request: DraftRequest) -> Drafting:
        policy = request.policy
        budget = request.offer(self.names[0], min(request.limit, self.context.free_slots - 1))
        if budget.k < 1:
            return Draft.under(budget)
        started = time.perf_counter()
        fed, logits = yield from self._catch_up(history, self.feed.window_for(request.catch_up))
        if self.start and self.feed.covers(len(history) - 1):
            fed, logits = yield from self._catch_up(history, None)  # that feed timed feeding cheap enough for all of it
        catch_up_s = catch_up_seconds(fed, budget.k, time.perf_counter() - started)
        self.context.checkpoint()  # a recurrent draft rolls its 1-token decodes back to here
        sample = self.sample and not request.sampler.settings.greedy
        tokens: list[int] = []
        dists: list[Distribution] = []
        confidences: list[float] = []
        kept = budget
        for i in range(budget.k):
            token, q, confidence = self.picker.pick(logits[-1], request.sampler, sample, policy.wants_confidence)
            extended = policy.extend(kept, confidence)
            if extended is None:
                break
            kept = extended
            tokens.append(token)
            confidences.append(confidence)
            if q is not None:
                dists.append(q)
            if i < budget.k - 1:
                logits = yield from self.feed.eval(self.context, [token])
        measured = sample or policy.wants_confidence
        return Draft(
            tokens, budget, dists=dists if sample else None, confidences=confidences if measured else None, catch_up_s=catch_up_s
        )

    def _catch_up(self, history: Sequence[int], window: int | None) -> Decodes[tuple[int, np.ndarray]]:
        """Feed the cache what it lacks of its view of `history` (its cached prefix reused; after
        a fully accepted draft, just that); how many tokens that was, and the last one's logits."""
        view = self._view(history, window)
        if len(self.context.tokens) == len(view):
            self.context.truncate(len(view) - 1)  # we need the last position's logits again
        missing = view[len(self.context.tokens) :]
        return len(missing), (yield from self.feed.eval(self.context, missing))

    def _view(self, history: Sequence[int], window: int | None) -> Sequence[int]:
        """What the cache should hold of `history`, its longest cached prefix kept: all of it, or
        where catching up is windowed and it lacks more than the window, its first and last tokens."""
        window = len(history) if window is None else window
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
