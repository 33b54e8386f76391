"""Counters for /metrics, kept and written out by prometheus_client under the names vLLM and
llama-server use.

The speculation counters are vLLM's (`spec_decode_num_drafts_total`, ...), which llama-server
also exposes; the prefix is `specrun:` where theirs are `vllm:` and `llamacpp:`. Each server
has its own registry, so servers in one process (tests) count apart. prometheus_client's
metrics are thread-safe: the worker thread counts what happens on the model and the event loop
counts rejected requests.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from specrun.engine import Stats, StepEvent

PREFIX = "specrun:"
FINISH_REASONS = ("stop", "length", "abort")
MEDIA_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()

        def counter(name: str, help_text: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(PREFIX + name, help_text, labels, registry=self.registry)

        def gauge(name: str, help_text: str) -> Gauge:
            return Gauge(PREFIX + name, help_text, registry=self.registry)

        self.finished = counter("request_success", "Requests finished, by finish reason (abort: the client left or the server stopped).",
                                ("finished_reason",))
        for reason in FINISH_REASONS:  # shown at 0 before the first request, as vLLM does
            self.finished.labels(reason)
        self.rejected = counter("requests_rejected", "Requests answered with an error, by reason.", ("reason",))
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of finished requests.")
        self.cached_prompt_tokens = counter("prompt_tokens_cached", "Prompt tokens found in the KV cache (not processed again).")
        self.generation_tokens = counter("generation_tokens", "Tokens generated.")
        self.drafts = counter("spec_decode_num_drafts", "Steps that verified a draft.")
        self.draft_tokens = counter("spec_decode_num_draft_tokens", "Drafted tokens verified.")
        self.accepted_tokens = counter("spec_decode_num_accepted_tokens", "Drafted tokens accepted.")
        self.accepted_by_position = counter("spec_decode_num_accepted_tokens_per_pos", "Drafted tokens accepted, by position in the draft.",
                                            ("position",))
        self.draft_tokens_by_source = counter("spec_decode_draft_tokens_by_source", "Drafted tokens verified, by draft source.",
                                              ("source",))
        self.accepted_by_source = counter("spec_decode_accepted_tokens_by_source", "Drafted tokens accepted, by draft source.",
                                          ("source",))
        self.running = gauge("num_requests_running", "Requests on the model now.")
        self.waiting = gauge("num_requests_waiting", "Requests waiting in the queue.")
        self.store_tokens = gauge("ngram_store_tokens", "Tokens of earlier requests held for drafting.")

    def step(self, event: StepEvent) -> None:
        if not event.drafted:
            return
        self.drafts.inc()
        self.draft_tokens.inc(event.drafted)
        self.accepted_tokens.inc(event.accepted)
        self.draft_tokens_by_source.labels(event.source).inc(event.drafted)
        self.accepted_by_source.labels(event.source).inc(event.accepted)
        for position in range(event.accepted):
            self.accepted_by_position.labels(str(position)).inc()

    def finish(self, reason: str, prompt_tokens: int, cached_tokens: int, stats: Stats) -> None:
        self.finished.labels(reason).inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.cached_prompt_tokens.inc(cached_tokens)
        self.generation_tokens.inc(stats.tokens)

    def reject(self, why: str) -> None:
        self.rejected.labels(why).inc()

    def render(self, running: int, waiting: int, store_tokens: int) -> bytes:
        """The exposition text (media type MEDIA_TYPE), with the gauges at their current values."""
        self.running.set(running)
        self.waiting.set(waiting)
        self.store_tokens.set(store_tokens)
        return generate_latest(self.registry)
