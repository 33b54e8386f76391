"""What a running request's reply reports to its job: text pieces (a reasoning model's thinking
apart from its answer; through the call reader when tools may be called; split by how they came;
with their log probabilities), steps to the metrics, and at the end its `Outcome`."""

from __future__ import annotations

from specrun.chat.reply import Piece, Reply
from specrun.core.events import Stats, StepEvent
from specrun.serve.jobs import Job, Text
from specrun.serve.logprobs import LogprobWatch
from specrun.serve.metrics import Metrics
from specrun.serve.reasoning import ReasoningReader, Thought
from specrun.serve.responses import Outcome
from specrun.serve.sources import SourceLabels
from specrun.serve.tool_calls import CallPiece, CallReader

FINISH_REASONS = {"eog": "stop", "stop_string": "stop", "max_tokens": "length", "context_full": "length", "interrupted": "abort"}


class Reporter:
    """The reply's view: text pieces go to the client (through the call reader when tools may be
    called; split by how they came, with the running statistics, when `labels` are kept; with the
    tokens they complete, when `scores` are kept), steps to the metrics."""

    def __init__(
        self,
        job: Job,
        metrics: Metrics,
        reader: CallReader | None,
        labels: SourceLabels | None = None,
        scores: LogprobWatch | None = None,
        thoughts: ReasoningReader | None = None,
    ):
        """`thoughts`: a reasoning model's thinking is told apart from its answer (never with
        `labels` or `scores`, which report the reply's text as it came)."""
        self.job, self.metrics, self.reader, self.labels, self.scores = job, metrics, reader, labels, scores
        self.thoughts = thoughts

    def show(self, pieces: list[Piece]) -> None:
        text = "".join(text for text, _ in pieces)
        if not text:
            return
        if self.thoughts is not None:
            self._answer(self.thoughts.feed(text))
            return
        logprobs = self.scores.release(len(text)) if self.scores is not None else None
        if self.labels is not None:  # never with tools: the API refuses `specrun.pieces` with them
            self.job.report(Text(text, tuple(self.labels.pieces(text)), self.labels.stats(), logprobs))
        elif self.reader is None:
            self.job.report(Text(text, logprobs=logprobs))
        else:  # never with logprobs: the API refuses them with tools
            self._report(self.reader.feed(text))

    def step(self, event: StepEvent, stats: Stats) -> None:
        self.metrics.step(event)
        if self.labels is not None:
            self.labels.step(event)

    def _answer(self, pieces: list[str | Thought]) -> None:
        """Reasoning as it is; the answer through the call reader, where tools may be called."""
        for piece in pieces:
            if isinstance(piece, Thought):
                self.job.report(Text(piece.text, reasoning=True))
            elif self.reader is None:
                self.job.report(Text(piece))
            else:
                self._report(self.reader.feed(piece))

    def finish(self) -> None:
        """After the reply: the text the readers held back (the call reader's, if no calls came)."""
        if self.thoughts is not None:
            self._answer(self.thoughts.finish())
        if self.reader is not None:
            self._report(self.reader.finish())

    def outcome(self, reply: Reply, prompt_tokens: int) -> Outcome:
        finish_reason = FINISH_REASONS.get(reply.stop_reason, "stop")
        if self.reader is None:
            if self.scores is not None:
                self.scores.release(0)  # a last token whose bytes never made a character: it has no text to wait for
            logprobs = tuple(self.scores.released) if self.scores is not None else None
            return Outcome(
                reply.text if self.thoughts is None else self.thoughts.answer,
                finish_reason,
                prompt_tokens,
                reply.stats,
                logprobs=logprobs,
                stop=reply.stop,
                tokens=tuple(reply.tokens),
                reasoning=self._reasoning,
            )
        calls = tuple(self.reader.calls)
        if calls and finish_reason == "stop":
            finish_reason = "tool_calls"
        return Outcome(
            self.reader.content, finish_reason, prompt_tokens, reply.stats, calls, stop=reply.stop, reasoning=self._reasoning
        )

    @property
    def _reasoning(self) -> str | None:
        return self.thoughts.reasoning or None if self.thoughts is not None else None

    def _report(self, pieces: list[str | CallPiece]) -> None:
        for piece in pieces:
            self.job.report(Text(piece) if isinstance(piece, str) else piece)
