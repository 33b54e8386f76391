"""What checking a row's argmax before masking the whole vocabulary saves (benchmark, not CI).

Greedy decoding held to bench_schema.py's record schema over the agent workload's documents,
one token at a time: each row's argmax is asked of llama.cpp's grammar sampler first, and only
where the grammar forbids it is the whole vocabulary masked (what specrun does). Every row is
also masked whole, timed, as llama-server's sampler chain does for each token it samples.

    python scripts/grammar_mask_cost.py [--target SmolLM2.gguf] [--documents 20]
"""

from __future__ import annotations

import specrun.backend  # noqa: F401  (libllama loads before numpy: backend.library.load_before_numpy)

# isort: split

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
from bench_schema import SCHEMA
from bench_serve import agent_prompts

from specrun import grammar_from_json_schema
from specrun.backend import Context, ContextOptions, Model
from specrun.backend.grammar import GrammarState
from specrun.hub.embedded import embedded_model_path


def timed(fn, *args):
    started = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - started


def constrained_rows(model: Model, prompt: str, gbnf: str, max_tokens: int) -> list[tuple[bool, float, float]]:
    """Per generated token: whether the argmax was allowed, seconds to ask about it, seconds to mask the row."""
    context = Context(model, ContextOptions(n_ctx=1024, n_threads=2))
    state, rows = GrammarState(model, gbnf), []
    try:
        row = np.array(context.eval(model.tokenize(prompt))[-1])
        for _ in range(max_tokens):
            top = int(np.argmax(row))
            allowed, check_s = timed(state.allows, np.array([top]))
            masked, mask_s = timed(state.mask, row)
            token = top if allowed[0] else int(np.argmax(masked))
            rows.append((bool(allowed[0]), check_s, mask_s))
            if token in model.eog_ids:
                break
            state.accept(token)
            row = np.array(context.eval([token])[-1])
    finally:
        state.close()
        context.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, default=None, help="GGUF (default: the embedded Gemma 3 270M)")
    parser.add_argument("--documents", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args()
    model = Model(args.target or embedded_model_path())
    gbnf = grammar_from_json_schema(SCHEMA).gbnf
    n_vocab = model.n_vocab
    try:
        rows = [r for prompt in agent_prompts(args.documents) for r in constrained_rows(model, prompt, gbnf, args.max_tokens)]
    finally:
        model.close()
    fast = [r for r in rows if r[0]]
    check_s = statistics.median(r[1] for r in rows)
    mask_s = statistics.median(r[2] for r in rows)
    first = sum(r[1] + (0 if r[0] else r[2]) for r in rows) / len(rows)
    always = sum(r[2] for r in rows) / len(rows)
    print(f"{len(rows)} rows, n_vocab {n_vocab}: argmax allowed on {len(fast)} ({len(fast) / len(rows):.0%})")
    print(f"asking about the argmax: {check_s * 1e6:.0f} us; masking the whole row: {mask_s * 1e3:.2f} ms (medians)")
    print(f"per token: {first * 1e3:.2f} ms checking first, {always * 1e3:.2f} ms masking every row ({always / first:.0f}x)")


if __name__ == "__main__":
    main()
