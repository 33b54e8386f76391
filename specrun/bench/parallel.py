"""`specrun bench --parallel N`: every method on all the prompts, N at a time in one batch, as a
server with N slots serves a burst of requests: aggregate tokens per second, and how long
each request waited for its first token and for its last."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Sequence

from rich.table import Table

from specrun.bench.methods import PLAIN, Variant, drafter
from specrun.core.events import Generation, TokenEvent
from specrun.core.sampling import SamplerSettings
from specrun.grammar.schemas import Grammar
from specrun.session import Session


@dataclass
class Served:
    """One variant's pass over every prompt: tokens, wall time, and per request its latencies."""

    variant: Variant
    tokens: int = 0
    seconds: float = 0.0
    first_token_s: list[float] = field(default_factory=list)
    done_s: list[float] = field(default_factory=list)
    outputs: dict[int, list[int]] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def serve_all(
    session: Session,
    prompts: Sequence[list[int]],
    variants: Sequence[Variant],
    settings: SamplerSettings,
    max_tokens: int,
    grammars: Sequence[Grammar | None],
) -> list[Served]:
    """Each variant in turn: all prompts arrive at once and run `parallel` at a time, from empty caches."""
    return [_serve(session, prompts, variant, settings, max_tokens, grammars) for variant in variants]


def _serve(
    session: Session,
    prompts: Sequence[list[int]],
    variant: Variant,
    settings: SamplerSettings,
    max_tokens: int,
    grammars: Sequence[Grammar | None],
) -> Served:
    for slot in range(session.config.parallel):
        session.target.sequence(slot).truncate(0)
    if variant.k:
        session.policies.policy(variant.k)  # auto measures verify costs before the clock starts, as a server does at start-up
    served, slots, waiting = Served(variant), session.slots(), list(range(len(prompts)))
    started = time.perf_counter()
    while waiting or slots.busy:
        while waiting and slots.free:
            index = waiting.pop(0)
            slot = slots.slot_for(prompts[index])  # as serve picks a request's slot
            source = drafter(session, variant.method, slot)
            if source is not None:
                source.rollback([])
            engine = session.engine(
                plain=source is None, policy=variant.k, sampler=settings, drafter=source, grammar=grammars[index], slot=slot
            )

            def first(event: TokenEvent, index: int = index) -> None:
                if index not in served.outputs:
                    served.outputs[index] = []
                    served.first_token_s.append(time.perf_counter() - started)

            def done(run: Generation, index: int = index) -> None:
                served.outputs[index] = run.tokens
                served.tokens += len(run.tokens)
                served.done_s.append(time.perf_counter() - started)

            slots.start(slot, index, engine, prompts[index], max_tokens, on_token=first, on_done=done)
        slots.step()
    served.seconds = time.perf_counter() - started
    return served


def table(runs: list[Served], parallel: int) -> Table:
    """Aggregate speed and latency percentiles per variant, against plain decoding's."""
    plain = next(run for run in runs if run.variant.method == PLAIN)
    result = Table(title=f"{parallel} at a time: all prompts arriving at once", title_justify="left")
    # Short headers: the table fits 80 columns. Seconds from the burst's start to each request's
    # first token and to its last; "same": outputs identical to plain decoding's.
    for column in ("method", "k", "tok/s", "speed-up", "1st tok s p50/95", "done s p50/95", "same"):
        result.add_column(column, justify="left" if column == "method" else "right")
    for run in runs:
        same = sum(run.outputs[i] == plain.outputs[i] for i in plain.outputs)
        result.add_row(
            run.variant.method,
            str(run.variant.k or ""),
            f"{run.tokens_per_s:.1f}",
            f"{run.tokens_per_s / plain.tokens_per_s:.2f}x",
            _percentiles(run.first_token_s),
            _percentiles(run.done_s),
            f"{same}/{len(plain.outputs)}",
        )
    return result


def _percentiles(seconds: list[float]) -> str:
    if len(seconds) < 2:
        return f"{seconds[0]:.2f}" if seconds else "-"
    cuts = statistics.quantiles(seconds, n=20, method="inclusive")  # 5% steps: cuts[9] is p50, cuts[18] p95
    return f"{cuts[9]:.2f} / {cuts[18]:.2f}"


def as_json(runs: list[Served]) -> list[dict]:
    return [
        {
            "method": run.variant.method,
            "k": run.variant.k,
            "tokens": run.tokens,
            "seconds": run.seconds,
            "tokens_per_s": run.tokens_per_s,
            "first_token_s": run.first_token_s,
            "done_s": run.done_s,
        }
        for run in runs
    ]
