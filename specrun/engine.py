"""The speculative core: draft, verify in one target decode, accept/reject, roll back.

`Generator.generate` yields `TokenEvent`s and `StepEvent`s and ends with one `Done`
carrying raw counters; rates are derived in `Stats`. Plain decoding is the same loop
without a drafter, so every speed-up is measured against the same code path.
"""

from __future__ import annotations

import codecs
import time
from dataclasses import dataclass, field
from typing import Iterator, Sequence, Union

import numpy as np

from specrun.backend import Context
from specrun.drafters import Draft, DraftPolicy, DraftSource
from specrun.errors import SpecrunError
from specrun.policy import FixedK
from specrun.sampling import Distribution, SamplerSettings, filtered, verify


@dataclass(frozen=True)
class TokenEvent:
    token: int
    text: str  # decoded text this token completes (may be "" inside a UTF-8 sequence)
    source: str  # "draft" (accepted guess), "target" (target's own sample), "bonus"


@dataclass(frozen=True)
class StepEvent:
    drafted: int
    accepted: int
    source: str = ""  # the drafter that proposed ("" for a plain step)


@dataclass
class Stats:
    """Raw counters; rates are properties so nothing can drift out of sync."""

    prompt_tokens: int = 0
    prefilled_tokens: int = 0  # prompt tokens actually decoded (the rest came from the cache)
    tokens: int = 0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    drafted_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0  # the target's verify decodes
    check_s: float = 0.0  # reading the verified logits rows (argmax or filtering) and accept/reject
    generate_s: float = 0.0  # wall time after the prompt was processed
    stop_reason: str = ""

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per target decode (accepted drafts + the target's own token)."""
        return self.tokens / self.steps if self.steps else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_by_position, self.drafted_by_position)]

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.generate_s if self.generate_s > 0 else 0.0

    @property
    def overhead_per_step_ms(self) -> float:
        """The loop's own time: neither drafting, the verify decode nor the check of its rows."""
        rest = self.generate_s - self.draft_s - self.verify_s - self.check_s
        return 1000 * rest / self.steps if self.steps else 0.0

    def count_step(self, drafted: int, accepted: int) -> None:
        self.steps += 1
        self.drafted += drafted
        self.accepted += accepted
        grow = drafted - len(self.drafted_by_position)
        if grow > 0:
            self.drafted_by_position += [0] * grow
            self.accepted_by_position += [0] * grow
        for i in range(drafted):
            self.drafted_by_position[i] += 1
        for i in range(accepted):
            self.accepted_by_position[i] += 1

    def accumulate(self, other: "Stats") -> None:
        """Add another run's counters to these (session totals)."""
        for name in ("prompt_tokens", "prefilled_tokens", "tokens", "steps", "drafted", "accepted",
                     "prefill_s", "draft_s", "verify_s", "check_s", "generate_s"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("drafted_by_position", "accepted_by_position"):
            mine, theirs = getattr(self, name), getattr(other, name)
            mine.extend([0] * (len(theirs) - len(mine)))
            for i, count in enumerate(theirs):
                mine[i] += count
        self.stop_reason = other.stop_reason or self.stop_reason

    def to_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "prefilled_tokens": self.prefilled_tokens,
            "tokens": self.tokens,
            "steps": self.steps,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted_length": self.mean_accepted_length,
            "acceptance_by_position": self.acceptance_by_position,
            "tokens_per_s": self.tokens_per_s,
            "prefill_s": self.prefill_s,
            "draft_s": self.draft_s,
            "verify_s": self.verify_s,
            "check_s": self.check_s,
            "generate_s": self.generate_s,
            "overhead_per_step_ms": self.overhead_per_step_ms,
            "stop_reason": self.stop_reason,
        }


@dataclass(frozen=True)
class Done:
    stats: Stats


Event = Union[TokenEvent, StepEvent, Done]


class Generator:
    """Speculative (or, without a drafter, plain) generation on one target context."""

    def __init__(
        self,
        target: Context,
        drafter: DraftSource | None,
        settings: SamplerSettings,
        k: int | DraftPolicy = 8,
        rng: np.random.Generator | None = None,
    ):
        """`k` is a fixed draft length or a policy (FixedK, PMinPolicy, AutoK)."""
        self.policy = FixedK(k) if isinstance(k, int) else k
        if self.policy.max_k + 1 > target.n_batch:
            raise SpecrunError(f"k = {self.policy.max_k} needs a batch of {self.policy.max_k + 1} rows but n_batch is {target.n_batch}")
        self.target = target
        self.drafter = drafter
        self.settings = settings
        self.rng = rng if rng is not None else np.random.default_rng(settings.seed)
        self.eog = target.model.eog_ids
        self.stats = Stats()  # the running (or last) generation's counters
        self._scratch = np.empty(target.model.n_vocab, dtype=bool)  # for top-k, reused every row

    def generate(self, prompt: Sequence[int], max_tokens: int) -> Iterator[Event]:
        """Stream the continuation of `prompt`; the target cache ends holding all but the last token.

        The prefill decodes the whole prompt, so the first token comes with it (as llama.cpp's
        tools do); drafting starts from that token.
        """
        history = self._checked_prompt(prompt)
        # Also kept on the generator: a consumer that stops early (stop string, Ctrl-C) never sees Done.
        self.stats = stats = Stats(prompt_tokens=len(history))
        started = time.perf_counter()
        stats.prefilled_tokens, prompt_logits = self._prefill(history)
        stats.prefill_s = time.perf_counter() - started
        started = time.perf_counter()
        text = codecs.getincrementaldecoder("utf-8")("replace")
        try:
            while not stats.stop_reason:
                room = self.target.free_slots  # the last token needs a slot, each draft one more
                if stats.tokens >= max_tokens:
                    stats.stop_reason = "max_tokens"
                elif room < 1:
                    stats.stop_reason = "context_full"
                else:
                    limit = min(max_tokens - stats.tokens - 1, room - 1, self.policy.max_k)
                    source, drafted, accepted, emitted = self._step(history, limit, stats, prompt_logits)
                    prompt_logits = None
                    yield StepEvent(drafted, accepted, source)
                    for token, source in emitted:
                        stats.tokens += 1
                        yield TokenEvent(token, text.decode(self.target.model.piece(token)), source)
                    if emitted[-1][0] in self.eog:
                        stats.stop_reason = "eog"
        finally:
            # Whatever happened (including an abandoned generator), caches hold only history;
            # a generator closed after its session has no caches left to roll back.
            if not self.target.closed:
                self._rollback(history)
            stats.generate_s = time.perf_counter() - started
        yield Done(stats)

    def _checked_prompt(self, prompt: Sequence[int]) -> list[int]:
        if not prompt:
            raise SpecrunError("the prompt is empty: give some text to continue")
        if len(prompt) >= self.target.n_ctx:
            raise SpecrunError(
                f"the prompt has {len(prompt)} tokens but the context holds {self.target.n_ctx}: "
                "shorten the prompt or raise --ctx-size"
            )
        return list(prompt)

    def _prefill(self, history: list[int]) -> tuple[int, np.ndarray]:
        """Put the prompt in the cache (reusing what is there); return how many tokens were
        decoded and the logits of its last position, which give the first new token at once."""
        cached = min(self.target.reuse_prefix(history), len(history) - 1)  # the last is decoded for its logits
        self.target.truncate(cached)
        return len(history) - cached, self.target.eval(history[cached:], logits_rows=1)

    def _step(self, history: list[int], limit: int, stats: Stats,
              prompt_logits: np.ndarray | None = None) -> tuple[str, int, int, list[tuple[int, str]]]:
        """One round: draft, verify last token + drafts in one decode, keep the agreed prefix.

        The first round samples from `prompt_logits`, the prefill's last row, without a draft.
        """
        started = time.perf_counter()
        first = prompt_logits is not None
        draft = self.drafter.propose(history, limit, self.rng, self.policy) if limit > 0 and self.drafter and not first else Draft("")
        drafted_at = time.perf_counter()
        tokens = self._cut_after_eog(draft.tokens[:limit])
        dists = draft.dists[: len(tokens)] if draft.dists is not None else None
        logits = prompt_logits if first else self.target.eval([history[-1], *tokens], logits_rows=len(tokens) + 1)
        verified_at = time.perf_counter()

        def target_dist(i: int) -> Distribution:
            return filtered(logits[i], self.settings, self._scratch)

        accepted, next_token = verify(tokens, dists, target_dist, self.rng)
        checked_at = time.perf_counter()
        stats.count_step(len(tokens), accepted)
        stats.draft_s += drafted_at - started
        stats.verify_s += verified_at - drafted_at
        stats.check_s += checked_at - verified_at
        if not first:  # the prefill's decode says nothing of verify costs
            self.policy.observe(draft.source, len(tokens), accepted, draft.confidences, drafted_at - started,
                                checked_at - drafted_at)
        emitted = [(t, "draft") for t in tokens[:accepted]]
        if not (emitted and emitted[-1][0] in self.eog):  # nothing follows an accepted end of generation
            emitted.append((next_token, "bonus" if tokens and accepted == len(tokens) else "target"))
        history += [token for token, _ in emitted]
        self._rollback(history)
        return draft.source, len(tokens), accepted, emitted

    def _rollback(self, history: list[int]) -> None:
        """Drop rejected drafts: the target holds all but the last token, the drafter no more than history."""
        self.target.truncate(len(history) - 1)
        if self.drafter:
            self.drafter.rollback(history)

    def _cut_after_eog(self, tokens: list[int]) -> list[int]:
        """Drafts past an end-of-generation token could never be emitted: don't verify them."""
        for i, token in enumerate(tokens):
            if token in self.eog:
                return tokens[: i + 1]
        return tokens
