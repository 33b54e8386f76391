"""Counters for /metrics under the names vLLM and llama-server use, written out by
prometheus_client.

The speculation counters are vLLM's (`spec_decode_num_drafts_total`, ...), which llama-server
also exposes; the prefix is `specrun:` where theirs are `vllm:` and `llamacpp:`. The counts
are plain numbers under one lock, updated on every step by the model thread (a
prometheus_client Counter per draft position would take its own lock and label lookup for
each position, every step), and handed to
prometheus_client as metric families when /metrics is read. The event loop counts rejected
requests. Each server has its own registry, so servers in one process (tests) count apart.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from specrun.core.events import Stats, StepEvent
from specrun.drafts.translated import TranslationStats

PREFIX = "specrun:"
FINISH_REASONS = ("stop", "length", "tool_calls", "abort")
MEDIA_TYPE = CONTENT_TYPE_LATEST

COUNTERS = (  # name, help, the Metrics attribute that counts, and the label of counts by kind ("": one count)
    (
        "request_success",
        "Requests finished, by finish reason (abort: the client left or the server stopped).",
        "finished",
        "finished_reason",
    ),
    ("requests_rejected", "Requests answered with an error, by reason.", "rejected", "reason"),
    ("prompt_tokens", "Prompt tokens of finished requests.", "prompt_tokens", ""),
    ("prompt_tokens_cached", "Prompt tokens found in the KV cache (not processed again).", "cached_prompt_tokens", ""),
    ("generation_tokens", "Tokens generated.", "generation_tokens", ""),
    ("spec_decode_num_drafts", "Steps that verified a draft.", "drafts", ""),
    ("spec_decode_num_draft_tokens", "Drafted tokens verified.", "draft_tokens", ""),
    ("spec_decode_num_accepted_tokens", "Drafted tokens accepted.", "accepted_tokens", ""),
    (
        "spec_decode_num_accepted_tokens_per_pos",
        "Drafted tokens accepted, by position in the draft.",
        "accepted_by_position",
        "position",
    ),
    ("spec_decode_draft_tokens_by_source", "Drafted tokens verified, by draft source.", "draft_tokens_by_source", "source"),
    ("spec_decode_accepted_tokens_by_source", "Drafted tokens accepted, by draft source.", "accepted_by_source", "source"),
    ("spec_decode_translate_seconds", "Seconds a draft with another vocabulary spent translating.", "translate_s", ""),
    (
        "spec_decode_translated_cache_tokens",
        "Tokens fed to a translated draft's cache: re-encoded from the accepted text, or kept (its own guesses the text confirmed).",
        "translated_cache_tokens",
        "how",
    ),
    ("decodes", "Target decodes (each verifies every running request's rows).", "decodes", ""),
    ("decode_rows", "Rows of those decodes (rows per decode: this over decodes).", "decode_rows", ""),
)
GAUGES = {
    "slots": "Requests the model runs at once (--parallel).",
    "num_requests_running": "Requests on the model now (busy slots).",
    "num_requests_waiting": "Requests waiting in the queue.",
    "ngram_store_tokens": "Tokens of earlier requests held for drafting.",
}


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.finished: Counter[str] = Counter({reason: 0 for reason in FINISH_REASONS})  # finish reason -> requests
        self.rejected: Counter[str] = Counter()  # why -> requests answered with an error
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0
        self.generation_tokens = 0
        self.drafts = 0  # steps that verified at least one drafted token
        self.draft_tokens = 0
        self.accepted_tokens = 0
        self.accepted_by_position: list[int] = []
        self.translate_s = 0.0  # a draft with another vocabulary: time converting between the vocabularies
        self.translated_cache_tokens: Counter[str] = Counter({"reencoded": 0, "kept": 0})  # fed to its cache, by how
        self.draft_tokens_by_source: Counter[str] = Counter()
        self.accepted_by_source: Counter[str] = Counter()
        self.decodes = 0  # target decodes, every running request's rows in each
        self.decode_rows = 0
        self._gauges = {"num_requests_running": 0, "num_requests_waiting": 0, "ngram_store_tokens": 0, "slots": 0}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def step(self, event: StepEvent) -> None:
        if not event.drafted:
            return
        with self._lock:
            self.drafts += 1
            self.draft_tokens += event.drafted
            self.accepted_tokens += event.accepted
            if event.draft_source is not None:  # always, for a step that drafted: a draft is granted under a name
                self.draft_tokens_by_source[event.draft_source] += event.drafted
                self.accepted_by_source[event.draft_source] += event.accepted
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
            translation = TranslationStats.of(stats.counters)
            if translation is not None:
                self.translate_s += translation.seconds
                self.translated_cache_tokens["reencoded"] += translation.reencoded
                self.translated_cache_tokens["kept"] += translation.kept

    def decoded(self, rows: int) -> None:
        """One target decode of `rows` rows (every running request's), for rows per decode."""
        if rows:
            with self._lock:
                self.decodes += 1
                self.decode_rows += rows

    def reject(self, why: str) -> None:
        with self._lock:
            self.rejected[why] += 1

    def render(self, running: int, waiting: int, store_tokens: int, slots: int) -> bytes:
        """The exposition text (media type MEDIA_TYPE), with the gauges at these values."""
        with self._lock:
            self._gauges = {
                "num_requests_running": running,
                "num_requests_waiting": waiting,
                "ngram_store_tokens": store_tokens,
                "slots": slots,
            }
        return generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        """prometheus_client's collector interface: the counts as metric families."""
        with self._lock:
            for name, help_text, attribute, label in COUNTERS:
                yield _counter(name, help_text, getattr(self, attribute), label)
            for name, help_text in GAUGES.items():
                yield GaugeMetricFamily(PREFIX + name, help_text, value=self._gauges[name])


def _counter(name: str, help_text: str, values: float | dict[str, int] | list[int], label: str) -> CounterMetricFamily:
    """A counter family: one value, or one per value of `label` (a list's: its positions)."""
    if isinstance(values, list):
        values = {str(i): n for i, n in enumerate(values)}
    if not isinstance(values, dict):
        return CounterMetricFamily(PREFIX + name, help_text, value=values)
    family = CounterMetricFamily(PREFIX + name, help_text, labels=[label])
    for key, count in sorted(values.items()):
        family.add_metric([key], count)
    return family
