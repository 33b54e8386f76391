"""The speculative core: draft, verify in one target decode, accept/reject, roll back.

`Generator.generate` yields a `StepEvent` per round and a `TokenEvent` per token and
ends with one `Done` carrying raw counters; rates are derived in `Stats`. `Generator.run`
is the one consumer of that stream that every front end uses. Plain decoding is the same
loop without a drafter, so every speed-up is measured against the same code path.
"""

from __future__ import annotations

import codecs
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator, Literal, Sequence, Union

import numpy as np

from specrun.backend import Context
from specrun.constrain import Constraint
from specrun.drafters import Draft, DraftSource
from specrun.errors import SpecrunError
from specrun.policy import DraftPolicy, FixedK, Source, StepRecord
from specrun.sampling import Distribution, Sampler, filtered, verify

TokenSource = Literal["draft", "target", "bonus"]
"""Where an emitted token came from: an accepted guess, the target's own token, or the one
the target adds after a fully accepted draft."""
StopReason = Literal["eog", "max_tokens", "context_full", "stop_string", "interrupted"]
"""Why a generation ended: the model ended it, a limit, or (set by the consumer) a stop
string or an interruption."""


@dataclass(frozen=True)
class TokenEvent:
    token: int
    text: str  # decoded text this token completes (may be "" inside a UTF-8 sequence)
    source: TokenSource


@dataclass(frozen=True)
class StepEvent:
    drafted: int
    accepted: int
    draft_source: Source | None = None  # the source that proposed (None for a plain step)


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
    translate_s: float = 0.0  # a draft with another vocabulary: keeping its text in step with the target's (in draft_s)
    draft_tokens_reencoded: int = 0  # ... draft tokens fed to its cache by re-encoding a window of the accepted text
    draft_tokens_kept: int = 0  # ... its own guesses that the accepted text confirmed
    grammar_tokens: int = 0  # tokens the grammar forced and its draft proposed, accepted
    generate_s: float = 0.0  # wall time after the prompt was processed
    stop_reason: StopReason | Literal[""] = ""  # "" while it runs

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
    def translated_feed(self) -> int:
        """Draft tokens a draft with another vocabulary fed its cache, however they came."""
        return self.draft_tokens_reencoded + self.draft_tokens_kept

    @property
    def reencoded_share(self) -> float:
        """Of the draft tokens a translated draft fed its cache, the share re-encoded from the accepted text."""
        return self.draft_tokens_reencoded / self.translated_feed if self.translated_feed else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.generate_s if self.generate_s > 0 else 0.0

    @property
    def overhead_per_step_ms(self) -> float:
        """The loop's own time: neither drafting, the verify decode nor the check of its rows."""
        rest = self.generate_s - self.draft_s - self.verify_s - self.check_s
        return 1000 * rest / self.steps if self.steps else 0.0

    def count_step(self, drafted: int, accepted: int) -> None:
        """One draft-and-verify round: `drafted` tokens verified, the first `accepted` kept."""
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
                     "prefill_s", "draft_s", "verify_s", "check_s", "generate_s", "translate_s",
                     "draft_tokens_reencoded", "draft_tokens_kept", "grammar_tokens"):
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
            "translate_s": self.translate_s,
            "draft_tokens_reencoded": self.draft_tokens_reencoded,
            "draft_tokens_kept": self.draft_tokens_kept,
            "reencoded_share": self.reencoded_share,
            "grammar_tokens": self.grammar_tokens,
            "overhead_per_step_ms": self.overhead_per_step_ms,
            "stop_reason": self.stop_reason,
        }


@dataclass(frozen=True)
class Done:
    stats: Stats


Event = Union[TokenEvent, StepEvent, Done]


@dataclass(frozen=True)
class Step:
    """What one round did: the draft, how much of it the target kept, the tokens it emits."""

    draft: Draft
    accepted: int
    emitted: list[tuple[int, TokenSource]]
    draft_s: float  # proposing the draft
    verify_s: float  # the target's decode of the last token and the draft
    check_s: float  # reading the verified rows and accepting or rejecting

    @property
    def event(self) -> StepEvent:
        return StepEvent(len(self.draft.tokens), self.accepted, self.draft.source)


@dataclass(frozen=True)
class RunResult:
    """A generation driven to its end by `Generator.run`."""

    tokens: list[int]  # every emitted token, an end-of-generation token included
    stats: Stats
    stop_reason: StopReason


OnToken = Callable[[TokenEvent], "StopReason | None"]
OnStep = Callable[[StepEvent, Stats], "StopReason | None"]
NO_DRAFT = Draft(None)
DEFAULT_K = 8


class Generator:
    """Speculative (or, without a drafter, plain) generation on one target context."""

    def __init__(self, target: Context, drafter: DraftSource | None, sampler: Sampler, policy: DraftPolicy | None = None,
                 eog: frozenset[int] | None = None, constraint: Constraint | None = None):
        """`policy`: how many tokens to draft (default: up to DEFAULT_K); `eog`: the tokens that end a
        generation (default: the target model's end-of-generation tokens); `constraint`: the grammar
        the output is held to (each row's distribution masked by it)."""
        policy = policy if policy is not None else FixedK(DEFAULT_K)
        if policy.max_k + 1 > target.n_batch:
            raise SpecrunError(f"k = {policy.max_k} needs a batch of {policy.max_k + 1} rows but n_batch is {target.n_batch}")
        self.target = target
        self.drafter = drafter
        self.sampler = sampler
        self.policy = policy
        self.eog = target.model.eog_ids if eog is None else eog
        self.constraint = constraint
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
            while not (stop := self._stop_reason(stats, max_tokens)):
                limit = min(max_tokens - stats.tokens - 1, self.target.free_slots - 1, self.policy.max_k)
                step = self._step(history, limit, prompt_logits)
                prompt_logits = None
                self._count(step, stats)
                history += [token for token, _ in step.emitted]
                self._rollback(history)
                yield step.event
                for token, source in step.emitted:
                    stats.tokens += 1
                    yield TokenEvent(token, text.decode(self.target.model.piece(token)), source)
                if step.emitted[-1][0] in self.eog:
                    stats.stop_reason = "eog"
            stats.stop_reason = stop
        finally:
            # Whatever happened (including an abandoned generator), caches hold only history;
            # a generator closed after its session has no caches left to roll back.
            if not self.target.closed:
                self._rollback(history)
            stats.generate_s = time.perf_counter() - started
        yield Done(stats)

    def run(self, prompt: Sequence[int], max_tokens: int, on_token: OnToken | None = None,
            on_step: OnStep | None = None) -> RunResult:
        """Drive `generate` to its end: the one consumer of the event stream.

        `on_token` and `on_step` see each event as it comes; one that returns a stop reason
        ends the generation there (the caches roll back to what was emitted). However the
        loop ends, even by an exception, the generator is closed before this returns.
        """
        tokens: list[int] = []
        events = self.generate(prompt, max_tokens)
        try:
            for event in events:
                if isinstance(event, Done):
                    return RunResult(tokens, event.stats, event.stats.stop_reason)
                if isinstance(event, TokenEvent):
                    tokens.append(event.token)
                    stop = on_token(event) if on_token else None
                else:
                    stop = on_step(event, self.stats) if on_step else None
                if stop:
                    return RunResult(tokens, self.stats, stop)
        finally:
            events.close()
        raise SpecrunError("the generation ended without its Done event")  # generate() always yields one

    def _stop_reason(self, stats: Stats, max_tokens: int) -> StopReason | None:
        if stats.stop_reason:
            return stats.stop_reason
        if stats.tokens >= max_tokens:
            return "max_tokens"
        return "context_full" if self.target.free_slots < 1 else None  # the last token needs a slot

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

    def _step(self, history: list[int], limit: int, prompt_logits: np.ndarray | None) -> Step:
        """One round: draft, verify last token + drafts in one decode, keep the agreed prefix.

        The first round samples from `prompt_logits`, the prefill's last row, without a draft.
        """
        started = time.perf_counter()
        first = prompt_logits is not None
        drafting = limit > 0 and self.drafter is not None and not first
        draft = self.drafter.propose(history, limit, self.policy, self.sampler) if drafting else NO_DRAFT
        draft = self._verifiable(draft, limit)
        drafted_at = time.perf_counter()
        logits = prompt_logits if first else self.target.eval([history[-1], *draft.tokens], logits_rows=len(draft.tokens) + 1)
        verified_at = time.perf_counter()

        def target_dist(i: int) -> Distribution:
            dist = filtered(logits[i], self.sampler.settings, self._scratch)
            return self.constraint.restrict(dist, logits[i], self.sampler.settings, i) if self.constraint else dist

        accepted, next_token = verify(draft.tokens, draft.dists, target_dist, self.sampler.rng)
        emitted: list[tuple[int, TokenSource]] = [(t, "draft") for t in draft.tokens[:accepted]]
        if not (emitted and emitted[-1][0] in self.eog):  # nothing follows an accepted end of generation
            emitted.append((next_token, "bonus" if draft.tokens and accepted == len(draft.tokens) else "target"))
        if self.constraint:
            self.constraint.commit(accepted, [token for token, _ in emitted])
        step = Step(draft, accepted, emitted, drafted_at - started, verified_at - drafted_at, time.perf_counter() - verified_at)
        if not first:  # the prefill's decode says nothing of verify costs
            self.policy.observe(StepRecord(draft.source, len(draft.tokens), accepted, draft.confidences, step.draft_s,
                                           step.verify_s + step.check_s, draft.catch_up_s))
        return step

    @staticmethod
    def _count(step: Step, stats: Stats) -> None:
        stats.count_step(len(step.draft.tokens), step.accepted)
        stats.draft_s += step.draft_s
        stats.verify_s += step.verify_s
        stats.check_s += step.check_s
        if step.draft.source == "grammar":
            stats.grammar_tokens += step.accepted
        if step.draft.translation is not None:
            stats.translate_s += step.draft.translation.seconds
            stats.draft_tokens_reencoded += step.draft.translation.reencoded
            stats.draft_tokens_kept += step.draft.translation.kept

    def _rollback(self, history: list[int]) -> None:
        """Drop rejected drafts: the target holds all but the last token, the drafter no more than history."""
        self.target.truncate(len(history) - 1)
        if self.drafter:
            self.drafter.rollback(history)

    def _verifiable(self, draft: Draft, limit: int) -> Draft:
        """The draft within `limit`, cut after an end-of-generation token (what follows one could
        never be emitted) and before a token the grammar forbids, so neither is verified."""
        tokens = draft.tokens[:limit]
        cut = next((i + 1 for i, token in enumerate(tokens) if token in self.eog), len(tokens))
        if self.constraint:
            cut = self.constraint.admissible(tokens[:cut])
        if cut == len(draft.tokens):
            return draft
        dists = draft.dists[:cut] if draft.dists is not None else None
        confidences = draft.confidences[:cut] if draft.confidences is not None else None
        return replace(draft, tokens=tokens[:cut], dists=dists, confidences=confidences)
