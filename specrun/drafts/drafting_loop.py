"""What every source that drafts with a model shares (a draft model, translated or not, an MTP head).

- `FeedCost` times feeding the draft's cache and so sizes the window a cache far behind the
  text catches up on;
- `Picker` picks a draft token from a logits row (sampled with its q, or the argmax);
- `guessed` is the drafting loop: pick a token, ask the policy to extend the draft, decode
  the token for the next row. A source says only how it decodes its next position.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np

from specrun.backend import Context
from specrun.core.drafting import CatchUp, Draft, DraftDecode, DraftRequest, NeedsDecodes
from specrun.core.policy import Budget, ema
from specrun.core.sampling import Distribution, Sampler, filtered

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

    def eval(self, context: Context, tokens: Sequence[int]) -> NeedsDecodes[np.ndarray]:
        """Feed `tokens` (a decode yielded to the caller), timing it; until both costs are known, a
        batch goes in as all but its last token and then that one alone, which times each at no
        extra cost. A decode that held other streams' tokens too is charged its tokens' share."""
        timing = not self.measured and len(tokens) > TIMED_BATCH
        for part in (tokens[:-1], tokens[-1:]) if timing else (tokens,):
            decoded = yield DraftDecode(context, part)
            seconds = decoded.share_s(len(part))
            if len(part) == 1:
                self.one_s = ema(self.one_s, seconds, 0.2, not self.one_s)
            elif len(part) >= TIMED_BATCH:
                self.batched_s = ema(self.batched_s, seconds / len(part), 0.2, not self.batched_s)
        return decoded.logits

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


@dataclass
class Guess:
    """A model's draft tokens of one step, with the q each was sampled from (when sampled) and the
    model's confidence at each (see `Picker.pick`)."""

    tokens: list[int] = field(default_factory=list)
    dists: list[Distribution] = field(default_factory=list)
    confidences: list[float] = field(default_factory=list)

    def draft(self, budget: Budget, sampled: bool, wants_confidence: bool, catch_up_s: float = 0.0) -> Draft:
        """The guess as the draft of a source of the target's vocabulary."""
        confidences = self.confidences if sampled or wants_confidence else None
        return Draft(self.tokens, budget, dists=self.dists if sampled else None, confidences=confidences, catch_up_s=catch_up_s)


NextRow = Callable[[int], NeedsDecodes[np.ndarray]]
"""NeedsDecodes a drafted token onto the source's cache: the logits row for the token after it."""


def decoded_rows(rows: Iterable[np.ndarray]) -> NextRow:
    """The next rows of a block drafter, which decoded them all at once: each drafted token's
    next row is the block's next, and asks for no decode."""
    following = iter(rows)

    def next_row(token: int) -> NeedsDecodes[np.ndarray]:
        yield from ()
        return next(following)

    return next_row


def guessed(
    row: np.ndarray,
    budget: Budget,
    request: DraftRequest,
    picker: Picker,
    sample: bool,
    next_row: NextRow,
    allowed: Callable[[int], bool] | None = None,
    ends: Callable[[int], bool] | None = None,
    text: Sequence[int] = (),
    targets_vocabulary: bool = True,
) -> NeedsDecodes[Guess]:
    """Up to `budget.k` tokens drafted one at a time from `row` (the logits after `text`, in the
    source's vocabulary): each picked under the sampler's logit bias (where the source's
    vocabulary is the target's) and repetition penalties, as the target's rows are, so that more
    of the draft is kept; kept while the policy extends the draft (and `allowed` takes it), and
    decoded for the next one's row, except the last and one that `ends` the draft."""
    guess = Guess()
    kept = budget
    adjustments = request.sampler.adjustments
    recent = adjustments.window(text) if adjustments else []  # taken now: a source's cache may grow as it drafts
    for i in range(budget.k):
        if adjustments:
            row = adjustments.adjusted(row, recent, guess.tokens, bias=targets_vocabulary)
        token, q, confidence = picker.pick(row, request.sampler, sample, request.policy.wants_confidence)
        extended = request.policy.extend(kept, confidence) if allowed is None or allowed(token) else None
        if extended is None:
            break
        kept = extended
        guess.tokens.append(token)
        guess.confidences.append(confidence)
        if q is not None:
            guess.dists.append(q)
        if i == budget.k - 1 or (ends is not None and ends(token)):
            break
        row = yield from next_row(token)
    return guess
