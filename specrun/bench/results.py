"""From timed runs to numbers: per-prompt medians, summary throughput, a recommendation.

Per prompt, a variant's tokens/s is the median over repeats and its speed-up is that
divided by plain's. The summary divides total tokens by total time over all prompts,
each prompt timed at its median speed, and its speed-up is method / plain of those.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from specrun.bench.methods import PLAIN, Variant
from specrun.bench.runner import Run
from specrun.core.events import Stats
from specrun.drafts.translated import TranslationStats

SPEEDUP_DEFINITION = (
    "per prompt: median tokens/s over repeats of the method / the same for plain; summary: total tokens / "
    "total time over all prompts (each prompt at its median speed), method / plain"
)
TOKENS_PER_S_DEFINITION = "generated tokens / wall time after the prompt was processed (prompt processing reported apart)"
NOISE = 0.05  # speed-up margins below this are within run-to-run noise on a shared machine


@dataclass
class Totals(Stats):
    """The engine's raw counters summed over runs, plus how many runs and greedy matches."""

    runs: int = 0
    matches: list[bool] = field(default_factory=list)

    def add(self, stats: Stats, match: bool | None) -> None:
        self.runs += 1
        self.accumulate(stats)
        if match is not None:
            self.matches.append(match)

    def merge(self, other: "Totals") -> None:
        self.runs += other.runs
        self.accumulate(other)
        self.matches += other.matches

    def rates(self) -> dict:
        translation = TranslationStats.of(self.counters)
        return {
            "acceptance_rate": _ratio(self.accepted, self.drafted),
            "mean_accepted_length": self.mean_accepted_length,
            "tokens_per_step": self.tokens_per_step,
            "acceptance_by_position": [_ratio(a, d) for a, d in zip(self.accepted_by_position, self.drafted_by_position)],
            "prefill_tokens_per_s": _ratio(self.prefilled_tokens, self.prefill_s),
            "draft_share": _ratio(self.draft_s, self.generate_s),
            "verify_share": _ratio(self.verify_s, self.generate_s),
            # A draft with another vocabulary: its cache's tokens that came from re-encoding the accepted
            # text (the rest: its own guesses the text confirmed), and the time translating took.
            "reencoded_share": translation.reencoded_share if translation else None,
            "translate_share": _ratio(translation.seconds if translation else 0.0, self.generate_s),
            "matches_plain": _ratio(sum(self.matches), len(self.matches)) if self.matches else None,
            "runs": self.runs,  # the counters below are totals over these runs
            "tokens": self.tokens,
            "steps": self.steps,
            "drafts": self.drafts,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "drafted_by_position": self.drafted_by_position,  # drafts that reached each position: the rates' weights
            "accepted_by_position": self.accepted_by_position,
        }


@dataclass
class Cell:
    """One prompt x one variant, over its repeats."""

    speeds: list[float] = field(default_factory=list)
    totals: Totals = field(default_factory=Totals)
    stop_reasons: list[str] = field(default_factory=list)

    def add(self, run: Run) -> None:
        self.speeds.append(run.stats.tokens_per_s)
        self.totals.add(run.stats, run.matches_plain)
        self.stop_reasons.append(run.stats.stop_reason)

    @property
    def tokens_per_s(self) -> float:
        return statistics.median(self.speeds) if self.speeds else 0.0

    @property
    def mean_tokens(self) -> float:
        return self.totals.tokens / self.totals.runs if self.totals.runs else 0.0


class Results:
    """Accumulates runs; cells[prompt][variant key]."""

    def __init__(self, variants: list[Variant], n_prompts: int):
        self.variants = variants
        self.cells = [{v.key: Cell() for v in variants} for _ in range(n_prompts)]
        self.peak_rss_mb = 0.0

    def add(self, run: Run) -> None:
        self.cells[run.prompt_index][run.variant.key].add(run)
        self.peak_rss_mb = max(self.peak_rss_mb, run.peak_rss_mb)

    @property
    def speculative(self) -> list[Variant]:
        return [v for v in self.variants if v.method != PLAIN]

    def prompt_row(self, index: int, key: str) -> dict:
        cell, plain = self.cells[index][key], self.cells[index][PLAIN]
        row = {"tokens_per_s": cell.tokens_per_s, "speedup": _ratio(cell.tokens_per_s, plain.tokens_per_s)}
        return {**row, **cell.totals.rates(), "stop_reasons": sorted(set(cell.stop_reasons))}

    def summary_row(self, key: str) -> dict:
        totals = Totals()
        for cells in self.cells:
            totals.merge(cells[key].totals)
        speed, plain_speed = self._throughput(key), self._throughput(PLAIN)
        return {"tokens_per_s": speed, "speedup": _ratio(speed, plain_speed), **totals.rates()}

    def _throughput(self, key: str) -> float:
        """Total tokens / total time, each prompt timed as mean tokens at its median speed."""
        tokens = sum(cells[key].mean_tokens for cells in self.cells)
        seconds = sum(_ratio(cells[key].mean_tokens, cells[key].tokens_per_s) for cells in self.cells)
        return _ratio(tokens, seconds)

    def summary(self) -> dict[str, dict]:
        return {v.key: {"method": v.method, "k": v.k, **self.summary_row(v.key)} for v in self.speculative}


def recommend(summary: dict[str, dict]) -> str:
    """One line: the best method and k for this workload, and why."""
    if not summary:
        return "only plain decoding was measured: add --methods lookup (or --draft PATH) to compare"
    ranked = sorted(summary.values(), key=lambda row: row["speedup"], reverse=True)
    best = ranked[0]
    name = f"{best['method']} k={best['k']}"
    # speed-up = tokens per step / cost of a step relative to a plain decode, so the cost follows.
    step_cost = _ratio(best["tokens_per_step"], best["speedup"])
    why = (
        f"{100 * best['acceptance_rate']:.0f}% of drafted tokens accepted, "
        f"{best['tokens_per_step']:.2f} tokens per target decode, each step costing {step_cost:.1f}x a plain "
        f"decode, drafting {100 * best['draft_share']:.0f}% of the time"
    )
    if best["speedup"] < 1 + NOISE:  # a gain inside the noise is not worth drafting for
        return f"plain decoding: no method beat it by {100 * NOISE:.0f}% or more on these prompts (best was {name} at {best['speedup']:.2f}x: {why})"
    verdict = f"{name}: {best['speedup']:.2f}x plain on these prompts ({why})"
    if len(ranked) > 1 and best["speedup"] - ranked[1]["speedup"] < NOISE:
        runner_up = ranked[1]
        verdict += f"; {runner_up['method']} k={runner_up['k']} is within noise of it: confirm with --repeat 3"
    return verdict


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0
