"""Timed runs: every prompt, plain then each method x k, repeated, interleaved.

`measure` yields one `Run` per timed generation so the caller can show progress; it
knows nothing about terminals or files. Caches are reset (not recreated) before each
run so every run pays the same prompt processing and no run reloads a model.
"""

from __future__ import annotations

import resource
import sys
from dataclasses import dataclass, replace
from typing import Generator, Sequence

from specrun.bench.methods import PLAIN, Variant, drafter
from specrun.core.events import Stats
from specrun.core.sampling import SamplerSettings
from specrun.errors import SpecrunError
from specrun.grammar.schemas import Grammar
from specrun.session import Session


@dataclass(frozen=True)
class Run:
    prompt_index: int
    repeat: int
    variant: Variant
    stats: Stats
    matches_plain: bool | None  # greedy only: same tokens as this repeat's plain run
    peak_rss_mb: float  # the process's peak resident memory so far


def peak_rss_mb() -> float:
    """Peak resident set size of this process (ru_maxrss: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def tokenize_all(session: Session, texts: Sequence[str], sources: Sequence[str]) -> list[list[int]]:
    """Tokenize every prompt up front, so a prompt that cannot fit fails before any timing."""
    limit = session.target.n_ctx - 1
    token_lists = []
    for text, source in zip(texts, sources):
        tokens = session.tokenize(text)
        if len(tokens) > limit:
            raise SpecrunError(
                f"{source}: the prompt has {len(tokens)} tokens but the context holds {session.target.n_ctx}: "
                "shorten it or raise --ctx-size"
            )
        token_lists.append(tokens)
    return token_lists


def measure(
    session: Session,
    prompts: Sequence[list[int]],
    variants: Sequence[Variant],
    settings: SamplerSettings,
    max_tokens: int,
    repeat: int = 1,
    warmup: int = 0,
    grammars: Sequence[Grammar | None] | None = None,
) -> Generator[Run, None, None]:
    """Warm up on the first prompt (untimed), then for each prompt and repeat run every
    variant in order (A B C A B C ...) so slow drift hits all of them alike.

    With a session store, each prompt and its plain output are stored after all its runs:
    the store method drafts from the earlier prompts of the run, never from this one's.
    `grammars[i]` holds every method's output for prompt i to a grammar (plain's too).
    """
    grammars = grammars or [None] * len(prompts)
    seed = settings.seed if settings.seed is not None else 0  # the CLI always sets one at temperature > 0
    for _ in range(warmup):
        for variant in variants:
            run_variant(session, variant, prompts[0], settings, seed, max_tokens, grammars[0])
    for index, prompt in enumerate(prompts):
        for rep in range(repeat):
            plain_tokens: list[int] | None = None
            for variant in variants:
                tokens, stats = run_variant(session, variant, prompt, settings, seed, max_tokens, grammars[index])
                if variant.method == PLAIN:
                    plain_tokens = tokens
                match = tokens == plain_tokens if settings.deterministic and variant.method != PLAIN else None
                yield Run(index, rep, variant, stats, match, peak_rss_mb())
        if plain_tokens is None:  # plan_variants puts plain first in every bench
            raise ValueError("measure() needs the plain variant: the store keeps each prompt's plain output")
        session.remember(prompt + plain_tokens)


def run_variant(
    session: Session,
    variant: Variant,
    prompt: list[int],
    settings: SamplerSettings,
    seed: int,
    max_tokens: int,
    grammar: Grammar | None = None,
) -> tuple[list[int], Stats]:
    """One timed generation of `variant` from empty caches: its tokens and stats."""
    source = drafter(session, variant.method)
    # Empty the KV caches so no run reuses the previous run's prompt.
    session.target.truncate(0)
    if source is not None:
        source.rollback([])
    # Same seed for every method, so at temperature > 0 all start from the same stream;
    # auto measures verify costs once per session.
    engine = session.engine(
        plain=source is None, policy=variant.k, sampler=replace(settings, seed=seed), drafter=source, grammar=grammar
    )
    run = engine.run(prompt, max_tokens)
    return run.tokens, run.stats
