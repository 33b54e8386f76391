"""The speculative core: draft, verify in one target decode, accept/reject, roll back.

`Engine.steps` is a generation as a coroutine: it yields the decodes it needs and hands
a `StepEvent` per round and a `TokenEvent` per token to its `Consumer`; rates are derived in
`Stats`. `Engine.run` drives it for one stream (`drive`), a `Batch` for several at once.
Plain decoding is the same loop without a drafter, so every speed-up is measured against the
same code path.
"""

from __future__ import annotations

import codecs
import time
from dataclasses import replace
from functools import partial
from typing import Callable, NamedTuple, Protocol, Sequence
from typing import Generator as PyGenerator

import numpy as np

from specrun.backend import Context
from specrun.core.drafting import CatchUp, Draft, DraftDecode, DraftRequest, DraftRows, DraftSource, Proposal
from specrun.core.driver import drive
from specrun.core.events import (
    Consumer,
    Done,
    Event,
    Generation,
    OnStep,
    OnToken,
    Stats,
    StepEvent,
    StopReason,
    TokenEvent,
    TokenSource,
)
from specrun.core.policy import DraftPolicy, FixedK, StepRecord
from specrun.core.sampling import (
    Distribution,
    Sampler,
    SamplerSettings,
    filtered,
    greedy_verify,
    log_probs,
    verify,
)
from specrun.errors import SpecrunError
from specrun.sequences import History


class OutputConstraint(Protocol):
    """What holds the output to a grammar (specrun.grammar.Constraint): each verified row's
    distribution is masked by the state after the draft tokens before it."""

    def admissible(self, tokens: list[int]) -> int:
        """How many of a draft's tokens it allows in a row (what follows is not verified)."""
        ...

    def restrict(self, dist: Distribution, row: np.ndarray, settings: SamplerSettings, i: int) -> Distribution:
        """Row i's distribution held to it."""
        ...

    def commit(self, accepted: int, emitted: Sequence[int]) -> None:
        """The step emitted `emitted`, the draft's first `accepted` tokens and perhaps one more."""
        ...


class TargetRows(NamedTuple):
    """What a target decode gave a stream: its rows' logits, and the decode's seconds and width
    (rows of every stream in it; None where it held a prompt's rows: its time is no verify's)."""

    logits: np.ndarray
    seconds: float
    width: int | None

    @staticmethod
    def width_of(asks: Sequence[TargetDecode]) -> int | None:
        """The width of a decode of `asks` (every stream's): its rows, or None if it held a prompt's."""
        total = 0
        for ask in asks:
            width = ask.width
            if width is None:
                return None
            total += width
        return total


class TargetDecode(NamedTuple):
    """A stream's part of the next target decode: tokens onto `context` (its sequence of the target's
    cache) after those it holds, logits for the last `rows`; for a verify whose draft may be cut,
    each draft row's expected tokens (`DraftPolicy.chances`): a batch may decode fewer of them, and
    returns a row for each it did. `prompt`: the tokens are a prompt's, not a verify's."""

    context: Context
    tokens: Sequence[int]
    rows: int
    chances: Sequence[float] = ()
    prompt: bool = False

    def cut(self, drafted: int) -> TargetDecode:
        """The verify with only its first `drafted` draft tokens."""
        return self._replace(tokens=self.tokens[: drafted + 1], rows=drafted + 1, chances=self.chances[:drafted])

    @property
    def width(self) -> int | None:
        """The rows it puts in a decode, or None for a prompt's."""
        return None if self.prompt else len(self.tokens)

    def alone(self) -> TargetRows:
        """Run as a decode of its own (one stream)."""
        started = time.perf_counter()
        logits = self.context.eval(self.tokens, self.rows)
        return TargetRows(logits, time.perf_counter() - started, self.width)


EventStream = PyGenerator[Event, None, None]
Steps = PyGenerator["TargetDecode | DraftDecode", "TargetRows | DraftRows", Generation]
NO_DRAFT = Draft()
DEFAULT_K = 8


class Engine:
    """Speculative (or, without a drafter, plain) generation on one target context."""

    def __init__(
        self,
        target: Context,
        drafter: DraftSource | None,
        sampler: Sampler,
        policy: DraftPolicy | None = None,
        eog: frozenset[int] | None = None,
        constraint: OutputConstraint | None = None,
        catch_up: CatchUp = "all",
        logprobs: int | None = None,
    ):
        """`policy`: how many tokens to draft (default: up to DEFAULT_K); `eog`: the tokens that end a
        generation (default: the target model's end-of-generation tokens); `constraint`: the grammar
        the output is held to (each row's distribution masked by it); `catch_up`: how much of the
        text a draft's cache that fell far behind is fed (see DraftRequest); `logprobs`: each
        TokenEvent carries its log-probability and this many of the likeliest (None: none)."""
        policy = policy if policy is not None else FixedK(DEFAULT_K)
        if policy.max_k + 1 > target.n_batch:
            raise SpecrunError(f"k = {policy.max_k} needs a batch of {policy.max_k + 1} rows but n_batch is {target.n_batch}")
        self.target = target
        self.drafter = drafter
        self.eog = target.model.eog_ids if eog is None else eog
        if sampler.settings.ignore_eos:  # as llama.cpp does it, so the drafts see the ban too
            sampler = replace(sampler, settings=sampler.settings.banning(self.eog))
        self.sampler = sampler
        self.policy = policy
        self.constraint = constraint
        self.catch_up = catch_up
        self.logprobs = logprobs
        # a row's argmax is all a check needs
        self._argmax_only = sampler.settings.deterministic and constraint is None and sampler.adjustments is None
        self.stats = Stats()  # the running (or last) generation's counters
        self._scratch = np.empty(target.model.n_vocab, dtype=bool)  # for top-k, reused every row

    def run(
        self, prompt: Sequence[int], max_tokens: int, on_token: OnToken | None = None, on_step: OnStep | None = None
    ) -> Generation:
        """The generation of up to `max_tokens` after `prompt`, each decode alone (one stream).

        `on_token` and `on_step` see each event as it comes; one that returns a stop reason
        ends the generation there (the caches roll back to what was emitted). However the
        loop ends, even by an exception, the generation is closed before this returns.
        """
        return drive(self.steps(prompt, max_tokens, Consumer(on_token, on_step)))

    def stream(self, prompt: Sequence[int], max_tokens: int) -> EventStream:
        """`run`'s generation as a stream of its events, handed out after each decode, and last a
        `Done` with the `Generation`. Closing the stream early closes the generation."""
        events: list[Event] = []
        steps = self.steps(prompt, max_tokens, Consumer(events.append, lambda event, stats: events.append(event)))
        try:
            ask = next(steps)
            while True:
                yield from events  # what the last decode's step handed the consumer
                events.clear()
                ask = steps.send(ask.alone())
        except StopIteration as done:
            yield from events
            yield Done(done.value)
        finally:
            steps.close()

    def steps(
        self, prompt: Sequence[int], max_tokens: int, consumer: Consumer | None = None, other_rows: Callable[[], int] = lambda: 0
    ) -> Steps:
        """The generation as a coroutine: it yields a `TargetDecode` where it needs the target, to be sent
        its `TargetRows` back, and a `DraftDecode` where its draft needs a model's, to be sent
        its `DraftRows`; it hands each event to `consumer` and returns the `Generation`. `drive` runs it
        for one stream; a `Batch` decodes several streams' at once, `other_rows` saying how many
        rows the other streams will put in the target's decode when a stream sizes its draft.

        `prompt` is at least one token and fewer than the context holds, as the session's edge
        (`Session.prompt_tokens`, serve's request) checked it. The prefill decodes the whole
        prompt, so the first token comes with it (as llama.cpp's
        tools do); drafting starts from that token. The target cache ends holding all but the last token.
        """
        consumer = consumer or Consumer()
        history = History(prompt)
        # Also kept on the engine: a generation closed early (Ctrl-C, a cancelled stream) returns no result.
        self.stats = stats = Stats(
            prompt_tokens=len(history), counters=dict.fromkeys(self.drafter.counters if self.drafter else (), 0.0)
        )
        started = time.perf_counter()
        cached = self.target.reuse_prefix(history[:-1])  # the last is decoded for its logits
        prefill = yield TargetDecode(self.target, history[cached:], 1, prompt=True)
        stats.prefilled_tokens, stats.prefills, stats.prefill_s = len(history) - cached, 1, time.perf_counter() - started
        started = time.perf_counter()
        text = codecs.getincrementaldecoder("utf-8")("replace")
        try:
            if not self._stop_reason(stats, max_tokens):  # the first token, from the prefill's last row: no step
                checked_at = time.perf_counter()
                _, emitted = self._accept(NO_DRAFT, prefill.logits, history)
                stats.check_s += time.perf_counter() - checked_at
                self._emit(emitted, prefill.logits, history, text, stats, consumer)
            # A recurrent target can drop again only as many drafted tokens as it keeps snapshots for.
            longest = min(self.policy.max_k, self.target.rollback_limit)
            while not (stop := self._stop_reason(stats, max_tokens)):
                limit = min(max_tokens - stats.tokens - 1, self.target.free_slots - 1, longest)
                event, emitted, logits = yield from self._step(history, limit, other_rows, stats)
                stats.stop_reason = consumer.step(event, stats) or ""
                if not stats.stop_reason:
                    self._emit(emitted, logits, history, text, stats, consumer)
            stats.stop_reason = stop
        finally:
            # Whatever happened (including an abandoned generation), caches hold only history;
            # a generation closed after its session has no caches left to roll back.
            if not self.target.closed:
                self._rollback(history)
            stats.generate_s = time.perf_counter() - started
        return consumer.result(stats, self.target.model.detokenize)

    def _stop_reason(self, stats: Stats, max_tokens: int) -> StopReason | None:
        if stats.stop_reason:
            return stats.stop_reason
        if stats.tokens >= max_tokens:
            return "max_tokens"
        return "context_full" if self.target.free_slots < 1 else None  # the last token needs a slot

    def _step(
        self, history: list[int], limit: int, other_rows: Callable[[], int], stats: Stats
    ) -> PyGenerator[
        TargetDecode | DraftDecode, TargetRows | DraftRows, tuple[StepEvent, list[tuple[int, TokenSource]], np.ndarray]
    ]:
        """One round: draft, verify the last token and the draft in one decode, keep the agreed
        prefix; counted in `stats` and shown to the policy. Its event, the tokens it emits, and
        the verified rows (the i-th emitted token's is row i)."""
        started = time.perf_counter()
        drafting = limit > 0 and self.drafter is not None
        draft = (yield from self._proposed(history, limit, other_rows())) if drafting else NO_DRAFT
        drafted_at = time.perf_counter()
        chances = self.policy.chances(draft.budget, len(draft.tokens), draft.confidences) if draft.budget else ()
        verified = yield TargetDecode(self.target, [history[-1], *draft.tokens], len(draft.tokens) + 1, chances)
        assert isinstance(verified, TargetRows), "a TargetDecode is answered with its TargetRows"
        draft = self._verified_part(draft, len(verified.logits) - 1)
        checked_at = time.perf_counter()
        accepted, emitted = self._accept(draft, verified.logits, history)
        draft_s, check_s, drafted = drafted_at - started, time.perf_counter() - checked_at, len(draft.tokens)
        stats.count_step(drafted, accepted, draft.source, draft_s, verified.seconds, check_s, draft.counters)
        if self.policy.learns:
            self.policy.observe(
                StepRecord(
                    draft.budget,
                    draft.declined,
                    drafted,
                    accepted,
                    draft.confidences,
                    draft_s,
                    verified.seconds + check_s,
                    draft.catch_up_s,
                    verified.width,
                )
            )
        return StepEvent(drafted, accepted, draft.source), emitted, verified.logits

    def _accept(self, draft: Draft, logits: np.ndarray, history: list[int]) -> tuple[int, list[tuple[int, TokenSource]]]:
        """How many of the draft's tokens the target's rows keep, and the tokens to emit: those and
        the target's own next one (none after an accepted end of generation)."""
        if self._argmax_only and draft.dists is None:
            accepted, next_token = greedy_verify(draft.tokens, logits)
        else:
            target_dist = partial(self._target_dist, logits, history, draft.tokens)
            accepted, next_token = verify(draft.tokens, draft.dists, target_dist, self.sampler.rng)
        emitted: list[tuple[int, TokenSource]] = [(t, "draft") for t in draft.tokens[:accepted]]
        if not (emitted and emitted[-1][0] in self.eog):  # nothing follows an accepted end of generation
            emitted.append((next_token, "bonus" if draft.tokens and accepted == len(draft.tokens) else "target"))
        if self.constraint:
            self.constraint.commit(accepted, [token for token, _ in emitted])
        return accepted, emitted

    def _target_dist(self, logits: np.ndarray, history: list[int], drafted: Sequence[int], i: int) -> Distribution:
        """The target's distribution at verified row i, after the history and the draft's first i
        tokens: biased, penalized and filtered as the sampler says, held to the grammar."""
        row = logits[i]
        adjustments = self.sampler.adjustments
        if adjustments:
            row = adjustments.adjusted(row, history, drafted[:i])
        dist = filtered(row, self.sampler.settings, self._scratch)
        return self.constraint.restrict(dist, row, self.sampler.settings, i) if self.constraint else dist

    def _emit(
        self,
        emitted: list[tuple[int, TokenSource]],
        logits: np.ndarray,
        history: list[int],
        text: codecs.IncrementalDecoder,
        stats: Stats,
        consumer: Consumer,
    ) -> None:
        """Add the emitted tokens to the history (the caches roll back to it) and hand them to the
        consumer, which may stop the generation at any of them; the i-th came from row i of `logits`."""
        history += [token for token, _ in emitted]
        if self.drafter or len(self.target.tokens) >= len(history):  # a plain step leaves nothing to drop
            self._rollback(history)
        for i, (token, source) in enumerate(emitted):
            stats.tokens += 1
            scored = log_probs(logits[i], token, self.logprobs) if self.logprobs is not None else None
            stop = consumer.token(TokenEvent(token, text.decode(self.target.model.piece(token)), source, scored))
            if stop:
                stats.stop_reason = stop
                return
        if emitted[-1][0] in self.eog:
            stats.stop_reason = "eog"

    def _proposed(self, history: list[int], limit: int, other_rows: int) -> Proposal:
        """The drafter's draft, checked against the contract and cut to what can be verified."""
        assert self.drafter is not None
        drafting = self.drafter.propose(history, DraftRequest(limit, self.policy, self.sampler, self.catch_up, other_rows))
        if isinstance(drafting, Draft):
            raise SpecrunError(
                f"a draft source ({', '.join(self.drafter.names)}) returned its draft from propose instead of "
                "yielding its decodes: mark a propose that decodes nothing with @without_decodes"
            )
        draft = yield from drafting
        if draft.tokens and (draft.budget is None or draft.budget.k < 1):
            raise SpecrunError(
                f"a draft source ({', '.join(self.drafter.names)}) proposed tokens the policy granted no "
                "budget for: draft under request.policy.offer(...) and return its Budget with the draft"
            )
        return self._verifiable(draft, limit)

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
        return self._cut(draft, cut)

    @classmethod
    def _verified_part(cls, draft: Draft, verified: int) -> Draft:
        """The draft as far as a batch verified it (only the rows that paid). One it verified none
        of counts as the policy declining its source, so old evidence fades and the source is
        tried again, instead of being offered and cut every step without being learned from. (A
        model draft that kept no token stays a draft of nothing: its decode's cost is news.)"""
        if verified >= len(draft.tokens):  # all of it, as every step outside a batch
            return draft
        if verified or draft.budget is None:
            return cls._cut(draft, verified)
        declined = draft.budget._replace(k=0, decision="decline")
        return replace(cls._cut(draft, 0), budget=None, declined=(*draft.declined, declined))

    @staticmethod
    def _cut(draft: Draft, n: int) -> Draft:
        """The draft's first n tokens."""
        if n >= len(draft.tokens):
            return draft
        dists = draft.dists[:n] if draft.dists is not None else None
        confidences = draft.confidences[:n] if draft.confidences is not None else None
        return replace(draft, tokens=draft.tokens[:n], dists=dists, confidences=confidences)
