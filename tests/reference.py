"""Independent answers for the tests (not a test module itself).

`FreshContexts` gives the logits a brand-new llama.cpp context computes for a history,
with no drafting, rejection or rollback behind it: what any cache the engine rolled
back must still give for the same history. `record_reads` keeps every logits row a
context handed out, with the tokens it held, so a test can check them all afterwards.
`chi_square_p` is the goodness-of-fit test for sampled tokens against exact
probabilities (the regularized gamma function, so no scipy).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from specrun.backend import Context, ContextOptions, Model, ModelOptions

# Batched and one-token decodes differ in floating point: on the tiny float32 models by
# up to ~0.006 after 60 tokens of drafting and rollback (up to ~1.3 on Gemma 3 270M
# Q4_K_M). One wrong, missing or stale token in a tiny model's cache moves its logits
# by 0.33 to 1.1 (measured at several positions), so 0.05 tells the two apart.
TINY_ATOL = 0.05
CONFIDENT_ATOL = 0.5  # the "confident" tiny model's logits are 10x larger, and so are both effects
# Gemma's Q4_K kernels differ more between batch widths (1.4 seen on an AVX2 CPU, 1.6 on
# AVX-512) than one wrong token moves its logits at some positions (1.9), so its cache checks
# compute one row at a time (n_ubatch 1) on both sides, where batching changes nothing.
GEMMA_ATOL = 1e-3


class FreshContexts:
    def __init__(self, path: str | Path, n_ctx: int, n_ubatch: int = 0):
        """`n_ubatch`: rows llama.cpp computes at once (0: the whole decode), as the cache checked did."""
        self.model = Model(path, ModelOptions(n_gpu_layers=0), role="reference")
        self.n_ctx, self.n_ubatch = n_ctx, n_ubatch
        self._rows: dict[tuple[int, ...], np.ndarray] = {}

    def logits(self, history: Sequence[int]) -> np.ndarray:
        """The last position's logits after feeding `history` to a new context."""
        self.prefetch([history])
        return self._rows[tuple(history)]

    def prefetch(self, histories: Sequence[Sequence[int]]) -> None:
        """Compute many histories at once: one new context per history that is not a prefix
        of another, decoding it whole with logits for every position (each its prefix's)."""
        wanted = sorted({tuple(h) for h in histories} - self._rows.keys(), key=len, reverse=True)
        for history in wanted:
            if history in self._rows:
                continue  # a prefix of one decoded before
            options = ContextOptions(n_ctx=self.n_ctx, n_batch=max(len(history), 8), n_ubatch=self.n_ubatch)
            context = Context(self.model, options)
            try:
                rows = context.eval(list(history), logits_rows=len(history))
                for end in range(1, len(history) + 1):
                    self._rows.setdefault(history[:end], np.array(rows[end - 1]))
            finally:
                context.close()

    def close(self) -> None:
        self.model.close()

    def __enter__(self) -> "FreshContexts":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def record_reads(context: Context) -> list[tuple[list[int], np.ndarray]]:
    """Wrap context.eval: for each eval that returns logits, keep (tokens held after it, rows)."""
    reads: list[tuple[list[int], np.ndarray]] = []
    original = context.eval

    def eval_and_record(tokens, logits_rows=1):
        logits = original(tokens, logits_rows)
        if logits is not None:
            reads.append((list(context.tokens), np.array(logits)))
        return logits

    context.eval = eval_and_record
    return reads


def assert_reads_match(reads, fresh: FreshContexts, atol: float = TINY_ATOL) -> int:
    """Every row a cache gave equals a fresh context's for the same history; returns rows checked."""
    fresh.prefetch([tokens for tokens, _ in reads])
    checked = 0
    for tokens, rows in reads:
        for i, row in enumerate(rows):
            history = tokens[: len(tokens) - len(rows) + 1 + i]
            expected = fresh.logits(history)
            worst = float(np.max(np.abs(row - expected)))
            assert worst <= atol, f"logits after {len(history)} tokens differ from a fresh context's by {worst:.3g}"
            checked += 1
    return checked


def assert_greedy_choice(logits: np.ndarray, token: int, atol: float = TINY_ATOL) -> None:
    """`token` is the argmax of `logits`, or within `atol` of it (a floating-point tie)."""
    assert logits[token] >= logits.max() - atol, f"token {token} is not the argmax {int(np.argmax(logits))}"


def chi_square_p(counts: Mapping, probs: Mapping, min_expected: float = 5.0) -> float:
    """p-value of observing `counts` under `probs` (Pearson's chi-square).

    Outcomes expected fewer than `min_expected` times are pooled into one bucket; an
    outcome with probability 0 that was observed gives p = 0.
    """
    return chi_square_sf(*chi_square_statistic(counts, probs, min_expected))


def chi_square_statistic(counts: Mapping, probs: Mapping, min_expected: float = 5.0) -> tuple[float, int]:
    """`chi_square_p`'s statistic and degrees of freedom (infinite where an outcome of probability
    0 was observed): independent tests add up, statistics and degrees alike."""
    n = sum(counts.values())
    if any(count and probs.get(outcome, 0.0) <= 0 for outcome, count in counts.items()):
        return math.inf, 1
    buckets: list[tuple[float, float]] = []  # (observed, expected)
    pooled_obs = pooled_exp = 0.0
    for outcome, p in probs.items():
        expected, observed = p * n, counts.get(outcome, 0)
        if expected >= min_expected:
            buckets.append((observed, expected))
        else:
            pooled_obs, pooled_exp = pooled_obs + observed, pooled_exp + expected
    if pooled_exp > 0:
        buckets.append((pooled_obs, pooled_exp))
    return sum((o - e) ** 2 / e for o, e in buckets), len(buckets) - 1


def chi_square_two_sample_p(a: Mapping, b: Mapping, min_expected: float = 5.0) -> float:
    """p-value that two samples come from one distribution (chi-square test of homogeneity).

    Outcomes either sample is expected to show fewer than `min_expected` times are pooled.
    """
    n_a, n_b = sum(a.values()), sum(b.values())
    share_a = n_a / (n_a + n_b)
    buckets, pooled = [], [0, 0]
    for outcome in set(a) | set(b):
        count_a, count_b = a.get(outcome, 0), b.get(outcome, 0)
        total = count_a + count_b
        if min(total * share_a, total * (1 - share_a)) >= min_expected:
            buckets.append((count_a, count_b))
        else:
            pooled = [pooled[0] + count_a, pooled[1] + count_b]
    if sum(pooled):
        buckets.append(tuple(pooled))
    statistic = 0.0
    for count_a, count_b in buckets:
        total = count_a + count_b
        expected_a, expected_b = total * share_a, total * (1 - share_a)
        statistic += (count_a - expected_a) ** 2 / expected_a + (count_b - expected_b) ** 2 / expected_b
    return chi_square_sf(statistic, len(buckets) - 1)


def chi_square_sf(x: float, df: int) -> float:
    """P(X >= x) for X ~ chi-square(df): Q(df/2, x/2), the regularized upper gamma function."""
    if df < 1:
        return 1.0
    if math.isinf(x):
        return 0.0
    a, x = df / 2.0, x / 2.0
    if x <= 0:
        return 1.0
    log_front = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1:  # series for the lower function P
        term = total = 1.0 / a
        n = a
        while abs(term) > abs(total) * 1e-15:
            n += 1
            term *= x / n
            total += term
        return max(0.0, 1.0 - total * math.exp(log_front))
    # Continued fraction for Q (modified Lentz).
    tiny = 1e-300
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return math.exp(log_front) * h
