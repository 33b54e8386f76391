"""How fast plain decoding is, so the panel can state a speed-up it actually measured.

At start a short plain generation (about a second) gives the plain rate. While chatting,
every step that drafted nothing is a plain one-token decode of the current context, so
those steps update the estimate as the conversation (and attention cost) grows.
"""

from __future__ import annotations

import time
from collections import deque

from specrun.engine import Stats, StepEvent, TokenEvent
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
        generator = session.generator(plain=True, seed=0)
        events = generator.generate(session.tokenize(CALIBRATION_TEXT), max_tokens)
        first: tuple[float, int, float] | None = None  # (clock, tokens, verify_s) at the first token
        last = first
        try:
            for event in events:
                if isinstance(event, TokenEvent):
                    s = generator.stats
                    last = (time.perf_counter(), s.tokens, s.verify_s)
                    first = first or last
                    if last[1] >= 4 and last[0] - first[0] > budget_s:
                        break
        finally:
            events.close()
        if first is None or last is None or last[1] == first[1]:
            return cls(0.0, 0.0, 0)
        tokens = last[1] - first[1]
        decode_s = (last[2] - first[2]) / tokens  # plain decoding: one step per token
        overhead_s = max(last[0] - first[0] - (last[2] - first[2]), 0.0) / tokens
        return cls(decode_s, overhead_s, tokens)

    def reset_step_clock(self) -> None:
        """Call before each reply: the generator's counters start again from zero."""
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
