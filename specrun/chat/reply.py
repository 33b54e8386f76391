"""Streaming one reply: stop strings, Ctrl-C, time to first token, and what to keep.

A view (the Rich panel, or plain text for pipes) is fed through the `ReplyView` calls;
it never touches the engine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

from specrun.core.engine import Engine
from specrun.core.events import Generation, Stats, StepEvent, StopReason, TokenEvent, TokenSource

Piece = tuple[str, TokenSource]  # (text, where its tokens came from)


class ReplyView(Protocol):
    def show(self, pieces: list[Piece]) -> None:
        """Text that is final (no longer possibly the start of a stop string)."""

    def step(self, event: StepEvent, stats: Stats) -> None:
        """After each draft/verify round, with the reply's running counters."""


@dataclass(frozen=True)
class Reply(Generation):
    """A chat reply or a server's answer: the generation as far as it is kept. Its `tokens` hold
    no stop string and no end-of-generation token; its `text` may run past `tokens` when a stop
    string began inside a token."""

    pieces: list[Piece]  # the kept text, split by where each token came from
    ttft_s: float | None  # from the turn's start to the first token
    stop: str | None = None  # the stop string that ended it (stop_reason "stop_string")


class StopScanner:
    """Finds stop strings in streamed text, holding back what could still become one."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.text = ""
        self.sources: list[TokenSource] = []  # one source per character of text
        self.released = 0  # characters handed to the view
        self.stop_at: int | None = None  # where the first stop string begins
        self.stop: str | None = None  # which stop string it is

    def feed(self, text: str, source: TokenSource) -> list[Piece]:
        """Add a token's text; return the newly final text."""
        start = max(0, len(self.text) - max((len(s) for s in self.stops), default=0))
        self.text += text
        self.sources += [source] * len(text)
        found = [(i, s) for i, s in ((self.text.find(s, start), s) for s in self.stops) if i >= 0]
        if found:
            self.stop_at, self.stop = min(found, key=lambda place: place[0])
            return self._release(self.stop_at)
        return self._release(len(self.text) - self._held_back())

    def flush(self) -> list[Piece]:
        """Release everything (the reply ended without a stop string)."""
        return self._release(len(self.text) if self.stop_at is None else self.stop_at)

    @property
    def kept_text(self) -> str:
        return self.text if self.stop_at is None else self.text[: self.stop_at]

    def _held_back(self) -> int:
        """Length of the longest tail of the text that starts some stop string."""
        for n in range(min(len(self.text), max((len(s) - 1 for s in self.stops), default=0)), 0, -1):
            if any(s.startswith(self.text[-n:]) for s in self.stops):
                return n
        return 0

    def _release(self, end: int) -> list[Piece]:
        pieces = split_by_source(self.text[self.released : end], self.sources[self.released : end])
        self.released = max(self.released, end)
        return pieces


def split_by_source(text: str, sources: list[TokenSource]) -> list[Piece]:
    pieces: list[Piece] = []
    for char, source in zip(text, sources):
        if pieces and pieces[-1][1] == source:
            pieces[-1] = (pieces[-1][0] + char, source)
        else:
            pieces.append((char, source))
    return pieces


class ReplyStream:
    """A reply as its generation's events come: the stop strings scanned, the view fed, and an
    end where `cancelled` says (Ctrl-C, a server's client gone), within the step in flight.
    `on_token` and `on_step` are the generation's callbacks (`Engine.run`, `Batch.add`);
    `reply` makes the Reply once it ended."""

    def __init__(self, stops: Sequence[str], view: ReplyView, started: float, cancelled: Callable[[], bool] = lambda: False):
        self.scanner = StopScanner(stops)
        self.view, self.started, self.cancelled = view, started, cancelled
        self.emitted: list[tuple[int, int]] = []  # (token, text length after it): one append, so Ctrl-C cannot split them
        self.ttft: float | None = None

    def on_token(self, event: TokenEvent) -> StopReason | None:
        if self.ttft is None:
            self.ttft = time.perf_counter() - self.started
        released = self.scanner.feed(event.text, event.source)
        self.emitted.append((event.token, len(self.scanner.text)))
        self.view.show(released)
        if self.scanner.stop_at is not None:
            return "stop_string"
        return "interrupted" if self.cancelled() else None

    def on_step(self, event: StepEvent, stats: Stats) -> StopReason | None:
        self.view.step(event, stats)
        return "interrupted" if self.cancelled() else None

    def reply(self, stats: Stats, stop_reason: StopReason, eog: frozenset[int]) -> Reply:
        """What was kept of the reply, the stop string's text left out."""
        self.view.show(self.scanner.flush())
        kept = _kept_tokens(self.emitted, len(self.scanner.kept_text), eog)
        text = self.scanner.kept_text
        pieces = split_by_source(text, self.scanner.sources[: len(text)])
        return Reply(kept, text, stats, stop_reason, pieces, self.ttft, self.scanner.stop)


def stream_reply(
    engine: Engine,
    prompt: list[int],
    max_tokens: int,
    stops: Sequence[str],
    view: ReplyView,
    started: float,
    cancelled: Callable[[], bool] = lambda: False,
) -> Reply:
    """Stream the reply to `prompt` into `view`; Ctrl-C ends it early and keeps what was shown.

    `cancelled` is asked after every event: a server's client that went away ends its
    reply as Ctrl-C does, within the step in flight.
    """
    stream = ReplyStream(stops, view, started, cancelled)
    try:
        stop_reason: StopReason = engine.run(prompt, max_tokens, stream.on_token, stream.on_step).stop_reason
    except KeyboardInterrupt:  # run() has closed the engine: the caches hold what was emitted
        stop_reason = "interrupted"
    return stream.reply(engine.stats, stop_reason, engine.eog)


def _kept_tokens(emitted: list[tuple[int, int]], kept_chars: int, eog: frozenset[int]) -> list[int]:
    """The longest token prefix whose text lies within the kept text, without a final EOG token.

    The chat format writes its own end-of-turn marker after the reply.
    """
    tokens = [token for token, end in emitted if end <= kept_chars]  # ends only grow: a prefix
    while tokens and tokens[-1] in eog:
        tokens.pop()
    return tokens


@dataclass
class TurnRecord:
    prompt_tokens: int
    prefilled_tokens: int
    new_tokens: int  # tokens the turn appended to the conversation
    ttft_s: float | None
    tokens: int
    stop_reason: str


@dataclass
class SessionStats(Stats):
    """Totals over the chat's replies, for the panel, /stats and the exit summary."""

    turns: list[TurnRecord] = field(default_factory=list)

    def add(self, reply: Reply, new_tokens: int) -> None:
        s = reply.stats
        self.accumulate(s)
        self.turns.append(TurnRecord(s.prompt_tokens, s.prefilled_tokens, new_tokens, reply.ttft_s, s.tokens, reply.stop_reason))

    def with_running(self, running: Stats, elapsed_s: float) -> Stats:
        """These totals plus a reply in progress for `elapsed_s` (for the live panel)."""
        total = Stats()
        total.accumulate(self)
        total.accumulate(running)
        total.generate_s = self.generate_s + elapsed_s
        return total
