"""specrun's own time per token as the history grows (a benchmark, not CI).

A draft's cache follows the generation's history every step; anything that compares the
whole history costs per step in proportion to its length, which a long agent context makes
tens of thousands of tokens. This runs each kind of drafting on the generated `cpu-small`
models (scripts/generated_models.py) with `llama_decode` a no-op, after a prompt of 1,000 and
of 30,000 tokens, so what is timed is specrun's loop alone (and the llama.cpp calls other than
decoding, such as a cache's rollback), per token over 300 tokens. The last run is four streams
of one batch, each with its own prompt of that length: there each cache also looks for a longer
prefix of its history in the other streams' sequences every step; its time per token is that of
300 tokens a stream less that of 1 (the prefills), over the 1,200 tokens.

    python scripts/long_history_cost.py [--models /tmp/specrun-host-time] [--lengths 1000,30000]
"""

from __future__ import annotations

import specrun.backend  # noqa: F401  (libllama loads before numpy: backend.library.load_before_numpy)

# isort: split

import argparse
import random
import time
from pathlib import Path

from generated_models import write_models
from host_time import llama_decode_as, skip_decode

from specrun.config import SessionConfig
from specrun.session import Session

TOKENS = 300


def per_token(session: Session, prompt: list[int], k: str | None) -> float:
    """Seconds a token after the first (the prefill's), `llama_decode` a no-op."""
    with llama_decode_as(skip_decode):
        started = None
        for _ in session.stream(prompt, TOKENS + 1, plain=k is None, k=k):
            started = started or time.perf_counter()
        assert started is not None
        return (time.perf_counter() - started) / TOKENS


def per_token_batched(session: Session, prompts: list[list[int]], k: str | None) -> float:
    """Seconds a token of `prompts` run together as streams of one batch, after their prefills,
    `llama_decode` a no-op."""

    def run(max_tokens: int) -> float:
        batch = session.batch()
        started = time.perf_counter()
        for slot, prompt in enumerate(prompts):
            batch.add(session.engine(plain=k is None, policy=k, slot=slot), prompt, max_tokens)
        while batch.streams:
            batch.step()
        return time.perf_counter() - started

    with llama_decode_as(skip_decode):
        return (run(TOKENS + 1) - run(1)) / (len(prompts) * TOKENS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=Path("/tmp/specrun-host-time"), help="folder of the generated models")
    parser.add_argument("--lengths", default="1000,30000", help="comma-separated prompt lengths in tokens")
    args = parser.parse_args()
    models = write_models(args.models, "cpu-small")
    lengths = [int(n) for n in args.lengths.split(",")]
    runs = {
        "plain": ({}, None),
        "lookup k 8": ({"lookup": True}, "8"),
        "suffix copy k 8": ({"sources": ("suffix",)}, "8"),
        "draft model k 4": ({"draft": models["draft"]}, "4"),
        "translated draft k 4": ({"draft": models["translated"]}, "4"),
        "draft model and lookup k 4": ({"draft": models["draft"], "lookup": True}, "4"),
    }
    rng = random.Random(0)
    print("| run | " + " | ".join(f"history {n}, us a token" for n in lengths) + " |")
    print("|---" * (len(lengths) + 1) + "|")
    for name, (sources, k) in runs.items():
        config = SessionConfig(target=models["target"], n_ctx=max(lengths) + 2 * TOKENS + 64, threads=2, **sources)
        with Session(config) as session:
            session.generate("the cat sat on the mat", 8, plain=k is None, k=k)  # a real decode: its logits stay in place
            vocab = session.target_model.n_vocab
            costs = [per_token(session, [rng.randrange(3, vocab) for _ in range(n)], k) for n in lengths]
        print(f"| {name} | " + " | ".join(f"{1e6 * c:.1f}" for c in costs) + " |")
    streams = 4
    config = SessionConfig(
        target=models["target"],
        n_ctx=streams * (max(lengths) + 2 * TOKENS + 64),
        threads=2,
        draft=models["draft"],
        parallel=streams,
    )
    with Session(config) as session:
        session.generate("the cat sat on the mat", 8, k="4")  # a real decode: its logits stay in place
        vocab = session.target_model.n_vocab
        costs = [
            per_token_batched(session, [[rng.randrange(3, vocab) for _ in range(n)] for _ in range(streams)], "4")
            for n in lengths
        ]
    print(f"| {streams} streams, draft model k 4 | " + " | ".join(f"{1e6 * c:.1f}" for c in costs) + " |")


if __name__ == "__main__":
    main()
