"""`pair derive --auto`: pick the layer subset by measuring acceptance and cost.

Acceptance is measured teacher-forced: the target decodes each sample prompt greedily,
then each candidate reads prompt + that continuation in one batch; with greedy drafting
a draft token is accepted exactly when the draft's argmax equals the target's at that
position, so the agreement rate along the target's own output is the per-token
acceptance rate. Cost is the measured time of one-token decode steps, draft over target
(the fastest step of each: other work on the machine only ever adds time).
The predicted speed-up combines both with the Leviathan formula (see cost.py).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from specrun import settings
from specrun.backend import Context, ContextOptions, Model, ModelOptions
from specrun.headers.read import ModelFacts, facts_from_reader, open_reader
from specrun.pair.cost import best_k, decode_cost
from specrun.pair.derive import BLOCK_TENSOR, describe_layers, write_subset

SAMPLE_PROMPTS = (
    "The history of the printing press begins in the fifteenth century, when",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "Shopping list for the week:\n1. Milk\n2. Eggs\n3.",
)
TIMING_STEPS = 12  # one-token decodes timed per candidate; the fastest is kept


@dataclass(frozen=True)
class Measured:
    layers: tuple[int, ...]
    acceptance: float  # draft argmax == target argmax along the target's greedy output
    cost_ratio: float  # fastest draft step time / fastest target step time
    bytes_ratio: float  # the cost model's ratio (weights read per token), for comparison
    k: int
    speedup: float


def candidate_subsets(n_layers: int) -> list[tuple[int, ...]]:
    """Layer subsets of 1/3, 1/2, 2/3 and 5/6 of the target, in three shapes: first and
    last layers (keeps the input and output ends), the first layers, and evenly spaced."""
    subsets: dict[tuple[int, ...], None] = {}
    sizes = {max(1, n_layers * num // den) for num, den in ((1, 3), (1, 2), (2, 3), (5, 6))}
    for size in sorted(sizes):
        if size >= n_layers:
            continue
        head = (size + 1) // 2
        subsets[tuple(range(head)) + tuple(range(n_layers - (size - head), n_layers))] = None
        subsets[tuple(range(size))] = None
        subsets[tuple(int(i) for i in np.linspace(0, n_layers - 1, size).round())] = None
    return [s for s in subsets if len(set(s)) == len(s)]


class Probe:
    """One loaded model with a context: greedy decoding, batch argmax and step timing."""

    def __init__(self, path: Path, n_ctx: int, threads: int):
        self.model = Model(path, ModelOptions(n_gpu_layers=0), role="candidate")
        self.ctx = Context(self.model, ContextOptions(n_ctx=n_ctx, n_batch=n_ctx, n_threads=threads))

    def close(self) -> None:
        self.ctx.close()
        self.model.close()

    def greedy(self, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
        """n greedy tokens after prompt, and the seconds each one-token step took."""
        self.ctx.truncate(0)
        logits = self.ctx.eval(prompt)
        tokens, seconds = [], []
        for _ in range(n):
            tokens.append(int(np.argmax(logits[-1])))
            start = time.perf_counter()
            logits = self.ctx.eval([tokens[-1]])
            seconds.append(time.perf_counter() - start)
        return tokens, seconds

    def argmax_along(self, prompt: list[int], continuation: list[int]) -> np.ndarray:
        """The model's argmax at each continuation position, fed the target's tokens."""
        self.ctx.truncate(0)
        rows = len(continuation)
        logits = self.ctx.eval(prompt + continuation[:-1], logits_rows=rows)
        return np.argmax(logits, axis=1)


def measure(
    target: Path, n_tokens: int = 24, threads: int = 0, report: Callable[[str], None] = lambda line: None
) -> list[Measured]:
    """Acceptance, cost ratio and predicted speed-up of each candidate subset."""
    settings.check(threads=threads)
    reader = open_reader(target)
    arch = str(reader.fields["general.architecture"].contents())
    n_layers = int(reader.fields[f"{arch}.block_count"].contents())
    probe = Probe(target, n_ctx=512, threads=threads)
    try:
        prompts = [probe.model.tokenize(text) for text in SAMPLE_PROMPTS]
        runs = [probe.greedy(p, n_tokens) for p in prompts]
    finally:
        probe.close()
    target_step = min(s for _, seconds in runs for s in seconds)
    facts = facts_from_reader(reader, str(target), target.stat().st_size)
    results = []
    with tempfile.TemporaryDirectory(prefix="specrun-auto-") as tmp:
        for layers in candidate_subsets(n_layers):
            path = Path(tmp) / "candidate.gguf"
            write_subset(reader, arch, n_layers, list(layers), target.name, path)
            result = _measure_one(path, layers, prompts, runs, target_step, threads, subset_bytes_ratio(facts, layers))
            report(
                f"layers {_short(layers)}: acceptance {result.acceptance:.0%}, "
                f"cost {result.cost_ratio:.2f}, predicted {result.speedup:.2f}x"
            )
            results.append(result)
            path.unlink()
    return results


def _measure_one(
    path: Path,
    layers: tuple[int, ...],
    prompts: list[list[int]],
    runs: list[tuple[list[int], list[float]]],
    target_step: float,
    threads: int,
    bytes_ratio: float,
) -> Measured:
    probe = Probe(path, n_ctx=512, threads=threads)
    try:
        agree = total = 0
        for prompt, (continuation, _) in zip(prompts, runs):
            predicted = probe.argmax_along(prompt, continuation)
            agree += int(np.sum(predicted == np.asarray(continuation)))
            total += len(continuation)
        _, seconds = probe.greedy(prompts[0], TIMING_STEPS)
    finally:
        probe.close()
    acceptance = agree / total
    cost = min(seconds) / target_step
    k, speedup = best_k(acceptance, cost)
    return Measured(layers, acceptance, cost, bytes_ratio, k, speedup)


def subset_bytes_ratio(target: ModelFacts, layers: tuple[int, ...]) -> float:
    """Weights read per token by the subset over the target's (cost.py's model)."""
    kept = set(layers)
    dropped = sum(t.n_bytes for t in target.tensors if (m := BLOCK_TENSOR.fullmatch(t.name)) and int(m.group(1)) not in kept)
    full = decode_cost(target).per_token_bytes
    return (full - dropped) / full


def _short(layers: tuple[int, ...]) -> str:
    return describe_layers(list(layers))
