"""How fast plain decoding is, so the panel can state a speed-up it actually measured.

At start a short plain generation (about a second) gives the plain rate. While chatting,
every step that drafted nothing is a plain one-token decode of the current context, so
those steps update the estimate as the conversation (and attention cost) grows.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import replace

from specrun.core.events import Stats, StepEvent, StopReason, TokenEvent
from specrun.session import Session

CALIBRATION_TEXT = "The history of the city begins"
RECENT_STEPS = 64  # undrafted steps kept for the running estimate
MIN_RECENT = 8  # undrafted steps needed before they replace the start-up figure


class PlainRate:
    def __init__(self, decode_s: float, overhead_s: float, calibration_tokens: int):
        self._start_decode_s = decode_s  # one plain target decode, measured at start
        self._overhead_s = overhead_s  # per-token loop time besides the decode (sampling, bookkeeping)
        self.calibration_tokens = calibration_tokens
        self._recent: deque[float] = deque(maxlen=RECENT_STEPS)
        self._last_verify_s = 0.0

    @classmethod
    def calibrate(cls, session: Session, budget_s: float = 1.0, max_tokens: int = 48) -> "PlainRate":
        """Plain-decode for about `budget_s` seconds and time the steps after the first.

        The first decode of a context also sets up llama.cpp's compute graph, so it is left out.
        """
        engine = session.engine(plain=True, sampler=replace(session.config.sampler, seed=0))
        marks: list[tuple[float, int, float]] = []  # (clock, tokens, verify_s) at the first and the latest token

        def on_token(event: TokenEvent) -> StopReason | None:
            s = engine.stats
            marks[1:] = [(time.perf_counter(), s.tokens, s.verify_s)]
            first, last = marks[0], marks[-1]
            return "max_tokens" if last[1] >= 4 and last[0] - first[0] > budget_s else None  # timed enough

        engine.run(session.tokenize(CALIBRATION_TEXT), max_tokens, on_token)
        if len(marks) < 2:
            return cls(0.0, 0.0, 0)
        (first_clock, first_tokens, first_verify), (last_clock, last_tokens, last_verify) = marks
        tokens = last_tokens - first_tokens
        decode_s = (last_verify - first_verify) / tokens  # plain decoding: one step per token
        overhead_s = max(last_clock - first_clock - (last_verify - first_verify), 0.0) / tokens
        return cls(decode_s, overhead_s, tokens)

    def reset_step_clock(self) -> None:
        """Call before each reply: the engine's counters start again from zero."""
        self._last_verify_s = 0.0

    def observe(self, event: StepEvent, stats: Stats) -> None:
        """Record the decode time of a step that drafted nothing (a plain step)."""
        step_verify_s = stats.verify_s - self._last_verify_s
        self._last_verify_s = stats.verify_s
        if event.drafted == 0:
            self._recent.append(step_verify_s)

    @property
    def updated_steps(self) -> int:
        return len(self._recent) if len(self._recent) >= MIN_RECENT else 0

    @property
    def tokens_per_s(self) -> float:
        decode_s = sum(self._recent) / len(self._recent) if self.updated_steps else self._start_decode_s
        per_token = decode_s + self._overhead_s
        return 1.0 / per_token if per_token > 0 else 0.0

    @property
    def how(self) -> str:
        if self.updated_steps:
            return f"calibrated at start, updated from {self.updated_steps} undrafted steps"
        return f"calibrated at start on {self.calibration_tokens} tokens"
