"""The opt-in `specrun` field of stream chunks (docs/cli.md, "The chat page"): the text of each
chunk split by how its tokens came, and the reply's running statistics.

A token's source is the engine's own (`TokenEvent.source`: "draft", "target" or "bonus"); an
accepted draft token also carries the name it was drafted under (`StepEvent.draft_source`), the
name `timings` and /metrics count drafts by, so a token the grammar forced is a draft token
drafted under "grammar". The field is made only for a request that asks for it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from itertools import groupby
from typing import Sequence

from specrun.core.engine import Engine
from specrun.core.events import OnToken, Stats, StepEvent, StopReason, TokenEvent, TokenSource


@dataclass(frozen=True)
class SourcePiece:
    """A run of the reply's text whose tokens came the same way."""

    text: str
    source: TokenSource
    draft_source: str | None  # an accepted draft token's: the name it was drafted under

    def body(self) -> dict:
        body: dict = {"text": self.text, "source": self.source}
        if self.draft_source is not None:
            body["draft_source"] = self.draft_source
        return body


class SourceLabels:
    """How each character of a reply came, kept as the engine emits its tokens, so that the text
    the stop scanner releases later (and in other pieces) is split the same way."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.k = engine.policy.label if engine.drafter is not None else "plain"
        self._labels: list[tuple[TokenSource, str | None]] = []  # one per character of the text so far
        self._released = 0
        self._step: StepEvent | None = None  # the latest step: a step's event comes before its tokens
        self._last_draft: StepEvent | None = None  # the latest step that drafted
        self._first_token_at: float | None = None

    def watching(self, on_token: OnToken) -> OnToken:
        """`on_token`, labelling each token before it sees it (it may release the token's text)."""

        def labelled(event: TokenEvent) -> StopReason | None:
            if self._first_token_at is None:
                self._first_token_at = time.perf_counter()
            draft_source = self._step.draft_source if event.source == "draft" and self._step else None
            self._labels += [(event.source, draft_source)] * len(event.text)
            return on_token(event)

        return labelled

    def step(self, event: StepEvent) -> None:
        self._step = event
        if event.drafted:
            self._last_draft = event

    def pieces(self, text: str) -> list[SourcePiece]:
        """The next `text` the reply released, split by how it came."""
        labels = self._labels[self._released : self._released + len(text)]
        self._released += len(text)
        runs = groupby(zip(text, labels), key=lambda labelled: labelled[1])
        return [SourcePiece("".join(char for char, _ in run), *label) for label, run in runs]

    def stats(self, final: Stats | None = None) -> dict:
        """The reply's statistics so far, or `final` ones once it ended."""
        s = final or self.engine.stats
        return {
            "tokens": s.tokens,
            "tokens_per_s": s.tokens_per_s if final else self._running_rate(s),
            "drafted": s.drafted,
            "accepted": s.accepted,
            "acceptance_rate": s.acceptance_rate,
            "mean_accepted_length": s.mean_accepted_length,
            "k": self.k,
            "last_drafted": self._last_draft.drafted if self._last_draft else None,
            "draft_source": self._last_draft.draft_source if self._last_draft else None,
            "accepted_by_source": dict(s.accepted_by_source),
        }

    def _running_rate(self, s: Stats) -> float | None:
        """Tokens per second since the prefill gave the first token (None before a second one)."""
        if self._first_token_at is None or s.tokens < 2:
            return None
        return s.tokens / max(time.perf_counter() - self._first_token_at, 1e-9)


def join_pieces(pieces: Sequence[SourcePiece]) -> list[SourcePiece]:
    """Neighbouring pieces that came the same way, as one."""
    joined: list[SourcePiece] = []
    for piece in pieces:
        last = joined[-1] if joined else None
        if last is not None and (last.source, last.draft_source) == (piece.source, piece.draft_source):
            joined[-1] = SourcePiece(last.text + piece.text, piece.source, piece.draft_source)
        else:
            joined.append(piece)
    return joined
