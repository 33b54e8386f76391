"""Counters for /metrics in Prometheus' text format, under the names vLLM and llama-server use.

The speculation counters are vLLM's (`spec_decode_num_drafts_total`, ...), which
llama-server also exposes; the prefix is `specrun:` where theirs are `vllm:` and
`llamacpp:`. The worker thread counts what happens on the model and the event loop
counts rejected requests, so updates and reading hold one lock.
"""

from __future__ import annotations

import threading
from collections import Counter

from specrun.engine import Stats, StepEvent

PREFIX = "specrun:"
FINISH_REASONS = ("stop", "length", "abort")


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.finished: Counter[str] = Counter()  # finish reason -> requests
        self.rejected: Counter[str] = Counter()  # why -> requests answered with an error
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0
        self.generation_tokens = 0
        self.drafts = 0  # steps that verified at least one drafted token
        self.draft_tokens = 0
        self.accepted_tokens = 0
        self.accepted_by_position: list[int] = []
        self.draft_tokens_by_source: Counter[str] = Counter()
        self.accepted_by_source: Counter[str] = Counter()

    def step(self, event: StepEvent) -> None:
        if not event.drafted:
            return
        with self._lock:
            self.drafts += 1
            self.draft_tokens += event.drafted
            self.accepted_tokens += event.accepted
            self.draft_tokens_by_source[event.source] += event.drafted
            self.accepted_by_source[event.source] += event.accepted
            grow = event.accepted - len(self.accepted_by_position)
            self.accepted_by_position += [0] * max(grow, 0)
            for position in range(event.accepted):
                self.accepted_by_position[position] += 1

    def finish(self, reason: str, prompt_tokens: int, cached_tokens: int, stats: Stats) -> None:
        with self._lock:
            self.finished[reason] += 1
            self.prompt_tokens += prompt_tokens
            self.cached_prompt_tokens += cached_tokens
            self.generation_tokens += stats.tokens

    def reject(self, why: str) -> None:
        with self._lock:
            self.rejected[why] += 1

    def render(self, gauges: dict[str, tuple[str, float]]) -> str:
        """The exposition text; `gauges` maps a name to (help, current value)."""
        with self._lock:
            lines: list[str] = []
            metric = _Writer(lines)
            metric.counter("request_success_total", "Requests finished, by finish reason (abort: the client left or the server stopped).",
                           {("finished_reason", r): self.finished[r] for r in sorted({*FINISH_REASONS, *self.finished})})
            metric.counter("requests_rejected_total", "Requests answered with an error, by reason.",
                           {("reason", r): n for r, n in sorted(self.rejected.items())})
            metric.counter("prompt_tokens_total", "Prompt tokens of finished requests.", self.prompt_tokens)
            metric.counter("prompt_tokens_cached_total", "Prompt tokens found in the KV cache (not processed again).",
                           self.cached_prompt_tokens)
            metric.counter("generation_tokens_total", "Tokens generated.", self.generation_tokens)
            metric.counter("spec_decode_num_drafts_total", "Steps that verified a draft.", self.drafts)
            metric.counter("spec_decode_num_draft_tokens_total", "Drafted tokens verified.", self.draft_tokens)
            metric.counter("spec_decode_num_accepted_tokens_total", "Drafted tokens accepted.", self.accepted_tokens)
            metric.counter("spec_decode_num_accepted_tokens_per_pos_total", "Drafted tokens accepted, by position in the draft.",
                           {("position", str(i)): n for i, n in enumerate(self.accepted_by_position)})
            metric.counter("spec_decode_draft_tokens_by_source_total", "Drafted tokens verified, by draft source.",
                           {("source", s): n for s, n in sorted(self.draft_tokens_by_source.items())})
            metric.counter("spec_decode_accepted_tokens_by_source_total", "Drafted tokens accepted, by draft source.",
                           {("source", s): n for s, n in sorted(self.accepted_by_source.items())})
        for name, (help_text, value) in gauges.items():
            metric.gauge(name, help_text, value)
        return "\n".join(lines) + "\n"


class _Writer:
    def __init__(self, lines: list[str]):
        self.lines = lines

    def counter(self, name: str, help_text: str, values: int | dict) -> None:
        self._metric(name, help_text, "counter", values)

    def gauge(self, name: str, help_text: str, value: float) -> None:
        self._metric(name, help_text, "gauge", value)

    def _metric(self, name: str, help_text: str, kind: str, values: float | dict) -> None:
        full = PREFIX + name
        self.lines += [f"# HELP {full} {help_text}", f"# TYPE {full} {kind}"]
        if not isinstance(values, dict):
            self.lines.append(f"{full} {_number(values)}")
            return
        for (label, value), count in values.items():
            self.lines.append(f'{full}{{{label}="{_escape(value)}"}} {_number(count)}')


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
