"""What a generation streams (`TokenEvent`, `StepEvent`, `Done`), the counters it keeps (`Stats`),
and the one consumer of its events (`Consumer`).

Steps are counted as llama.cpp counts them: the prefill's decode, which gives the first token,
is not a step; each later target decode is one, and a step that verified a draft is a draft.
So `mean_accepted_length` (1 + accepted / drafts) and `acceptance_rate` (accepted / drafted)
read as llama.cpp's "mean acc len" and "accept" for the same run.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Callable, Literal, Mapping, NamedTuple, Union

TokenSource = Literal["draft", "target", "bonus"]
"""Where an emitted token came from: an accepted guess, the target's own token, or the one
the target adds after a fully accepted draft."""
StopReason = Literal["eog", "max_tokens", "context_full", "stop_string", "interrupted"]
"""Why a generation ended: the model ended it, a limit, or (set by the consumer) a stop
string or an interruption."""


# Named tuples, as a frozen dataclass costs three times as much to make: one of each comes every token.
class TokenLogprobs(NamedTuple):
    """How likely the target's row made a token: the model's own log-probabilities (the log-softmax
    of its logits, before any sampling setting), as llama-server and OpenAI report them."""

    logprob: float  # the emitted token's
    top: tuple[tuple[int, float], ...]  # the row's likeliest tokens, likeliest first, with theirs


class TokenEvent(NamedTuple):
    token: int
    text: str  # decoded text this token completes (may be "" inside a UTF-8 sequence)
    source: TokenSource
    logprobs: TokenLogprobs | None = None  # asked for (Engine's `logprobs`)


class StepEvent(NamedTuple):
    drafted: int
    accepted: int
    draft_source: str | None = None  # the name the draft was proposed under (None for a plain step)


@dataclass
class Stats:
    """Raw counters; rates are properties so nothing can drift out of sync.

    Numbers add up, lists add up by position and dicts by key (`accumulate`), so a new counter
    is one field. Draft sources add their own counters by name (`counters`).
    """

    prompt_tokens: int = 0
    prefilled_tokens: int = 0  # prompt tokens actually decoded (the rest came from the cache)
    tokens: int = 0  # emitted, the prefill's first token included
    prefills: int = 0  # prompts decoded, each giving the first token of its generation
    steps: int = 0  # target decodes after the prefill
    drafts: int = 0  # ... of which verified a draft
    drafted: int = 0
    accepted: int = 0
    drafted_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    accepted_by_source: dict[str, int] = field(default_factory=dict)  # accepted draft tokens, by the name they were drafted under
    counters: dict[str, float] = field(default_factory=dict)  # what the draft sources count (each declares its own)
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0  # the target's verify decodes
    check_s: float = 0.0  # reading the verified logits rows (argmax or filtering) and accept/reject
    generate_s: float = 0.0  # wall time after the prompt was processed
    stop_reason: StopReason | Literal[""] = ""  # "" while it runs

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens a drafted step yields: 1 + accepted per draft (llama.cpp's "mean acc len")."""
        return 1 + self.accepted / self.drafts if self.drafts else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Tokens emitted per target decode after the prefill, drafted or not."""
        return (self.tokens - self.prefills) / self.steps if self.steps else 0.0

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

    def count_step(
        self,
        drafted: int,
        accepted: int,
        source: str | None = None,
        draft_s: float = 0.0,
        verify_s: float = 0.0,
        check_s: float = 0.0,
        counters: Mapping[str, float] | None = None,
    ) -> None:
        """One step after the prefill: `drafted` tokens (from `source`) verified, the first
        `accepted` kept; the seconds it spent drafting, verifying and checking, and what its
        draft source counted."""
        self.steps += 1
        self.draft_s += draft_s
        self.verify_s += verify_s
        self.check_s += check_s
        if counters:
            for name, value in counters.items():
                self.counters[name] = self.counters.get(name, 0.0) + value
        if not drafted:
            return
        self.drafts += 1
        self.drafted += drafted
        self.accepted += accepted
        _add_by_position(self.drafted_by_position, [1] * drafted)
        _add_by_position(self.accepted_by_position, [1] * accepted)
        if source is not None:
            self.accepted_by_source[source] = self.accepted_by_source.get(source, 0) + accepted

    def accumulate(self, other: Stats) -> None:
        """Add another run's counters to these (session totals); a subclass adds its own fields itself."""
        for f in fields(Stats):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, list):
                _add_by_position(mine, theirs)
            elif isinstance(mine, dict):
                for key, value in theirs.items():
                    mine[key] = mine.get(key, 0) + value
            elif f.name == "stop_reason":
                self.stop_reason = theirs or mine
            else:
                setattr(self, f.name, mine + theirs)

    def to_dict(self) -> dict:
        """Every field and rate; the sources' counters by name, beside the others."""
        rates = (
            "acceptance_rate",
            "mean_accepted_length",
            "tokens_per_step",
            "acceptance_by_position",
            "tokens_per_s",
            "overhead_per_step_ms",
        )
        values = {f.name: getattr(self, f.name) for f in fields(Stats) if f.name != "counters"}
        return {**values, **{name: getattr(self, name) for name in rates}, **self.counters}


def _add_by_position(mine: list[int], theirs: list[int]) -> None:
    mine.extend([0] * (len(theirs) - len(mine)))
    for i, count in enumerate(theirs):
        mine[i] += count


@dataclass(frozen=True)
class Generation:
    """What every generation gives at its end, however it ran (`Engine.run`, `Session.generate`,
    a batch's stream, the last event of a stream): the one result the front ends report."""

    tokens: list[int]  # the generated token ids, an end-of-generation token included when one ended it
    text: str  # the tokens' text, decoded all at once (a character split across tokens comes out whole)
    stats: Stats  # counters and timings
    stop_reason: StopReason  # 'eog' (the model ended), 'max_tokens', 'context_full', 'stop_string', 'interrupted'

    def to_dict(self) -> dict:
        """As `--json` and `bench` write it."""
        return {"text": self.text, "tokens": self.tokens, "stats": self.stats.to_dict()}


@dataclass(frozen=True)
class Done:
    """The last event of a stream: the generation's result."""

    generation: Generation

    @property
    def stats(self) -> Stats:
        return self.generation.stats


Event = Union[TokenEvent, StepEvent, Done]


OnToken = Callable[[TokenEvent], "StopReason | None"]
OnStep = Callable[[StepEvent, Stats], "StopReason | None"]


class Consumer:
    """The one consumer of a generation's events, alone or in a batch: it hands each to the
    callbacks and keeps the tokens. A callback that returns a stop reason ends the generation
    there (a stop string, a client gone); otherwise it ends as the generation says."""

    def __init__(self, on_token: OnToken | None = None, on_step: OnStep | None = None):
        self.on_token, self.on_step = on_token, on_step
        self.tokens: list[int] = []

    def token(self, event: TokenEvent) -> StopReason | None:
        self.tokens.append(event.token)
        return self.on_token(event) if self.on_token else None

    def step(self, event: StepEvent, stats: Stats) -> StopReason | None:
        return self.on_step(event, stats) if self.on_step else None

    def result(self, stats: Stats, detokenize: Callable[[list[int]], str]) -> Generation:
        """The generation's result; every generation that ended says why (`stats.stop_reason`)."""
        assert stats.stop_reason, "a finished generation says why it ended"
        return Generation(self.tokens, detokenize(self.tokens), stats, stats.stop_reason)
