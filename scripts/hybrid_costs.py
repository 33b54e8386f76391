"""What rolling back a hybrid target's recurrent state costs (a benchmark, not CI).

On one GGUF of a hybrid architecture llama.cpp rolls back (qwen35, nemotron_h, lfm2, ...),
with 2 threads by default, after a prompt, rounds of each of these, interleaved:

- plain step: one token decoded, as plain decoding does;
- verify + rollback: the last token and k drafts in one decode, then all k drafts dropped
  again through llama.cpp's snapshots (16, as `--k auto` keeps; the worst case: nothing accepted);
- the same verify in a context without snapshots (n_rs_seq 0), which cannot roll back: what
  keeping the snapshots adds to a decode;
- a draft model's way back: a checkpoint of the state, k one-token decodes, then back to the
  checkpoint (restored, nothing decoded again).

Prints the median of each in ms, the verify's cost in plain steps, and the recurrent state's
memory with 0, k and 16 snapshots, as `specrun pair check` counts it (1 + n_rs_seq copies of
the state; tests/test_pair_hybrid.py checks the count against llama.cpp's own).

    python scripts/hybrid_costs.py MODEL.gguf [--k 4] [--rounds 20] [--threads 2]
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time
from pathlib import Path

from specrun.backend import Context, ContextOptions, Model, ModelOptions
from specrun.headers.arch import state_bytes
from specrun.headers.read import read_keys

PROMPT_TOKENS = 64


def timed(work) -> float:
    started = time.perf_counter()
    work()
    return (time.perf_counter() - started) * 1000


def context(model: Model, rollback: int, threads: int) -> Context:
    """A context keeping `rollback` snapshots."""
    ctx = Context(model, ContextOptions(n_ctx=1024, n_batch=64, n_threads=threads, rollback=rollback))
    assert ctx.rollback_limit == rollback, f"asked for {rollback} snapshots, llama.cpp keeps {ctx.rollback_limit}"
    return ctx


def one_round(snap: Context, bare: Context, tokens: list[int], at: int, k: int) -> dict[str, float]:
    """Each measurement once, from `at` tokens held; both contexts end holding `at` + 2."""
    drafts = tokens[at + 1 : at + 2 + k]
    ms = {
        "plain step": timed(lambda: snap.eval(tokens[at : at + 1], 1)),
        "verify": timed(lambda: snap.eval(drafts, k + 1)),
        "rollback": timed(lambda: snap.truncate(at + 2)),
    }
    bare.eval(tokens[at : at + 1], 1)  # it cannot drop the drafts again: it keeps them, which costs the same
    ms["verify, no snapshots"] = timed(lambda: bare.eval(drafts, k + 1))
    ms["checkpoint"] = timed(snap.checkpoint)
    ms["k one-token decodes"] = timed(lambda: [snap.eval([t], 1) for t in tokens[at + 2 : at + 2 + k]])
    ms["back to checkpoint"] = timed(lambda: snap.truncate(at + 2))
    return ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path)
    parser.add_argument("--k", type=int, default=4, help="drafted tokens per verify (default 4)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    k = args.k
    model = Model(args.model, ModelOptions(), "target")
    if not model.recurrent:
        raise SystemExit(f"hybrid_costs: {args.model.name} ({model.architecture}) keeps no recurrent state")
    tokens = [3 + (i * 7919) % (model.n_vocab - 3) for i in range(PROMPT_TOKENS + (k + 1) * args.rounds * 4)]
    snap, bare = context(model, 16, args.threads), context(model, 0, args.threads)
    for ctx in (snap, bare):
        ctx.eval(tokens[:PROMPT_TOKENS], 1)
    at = PROMPT_TOKENS
    times: dict[str, list[float]] = collections.defaultdict(list)  # in one_round's order
    for _ in range(args.rounds):
        for name, seconds in one_round(snap, bare, tokens, at, k).items():
            times[name].append(seconds)
        at += 2
    median = {name: statistics.median(values) for name, values in times.items()}
    step = median["plain step"]
    print(f"{args.model.name} ({model.architecture}), {args.threads} threads, k {k}, {args.rounds} rounds; median ms:")
    for name, value in median.items():
        print(f"  {name:24} {value:9.3f}  ({value / step:.2f} plain steps)")
    both = median["verify"] + median["rollback"]
    print(
        f"  verify + rollback        {both:9.3f}  ({both / step:.2f} plain steps; "
        f"{median['verify'] / median['verify, no snapshots']:.3f}x the verify without snapshots)"
    )
    copy = state_bytes(read_keys(args.model).meta)
    if copy is not None:
        print(
            f"recurrent state, one copy per sequence: {copy / 2**20:.2f} MiB; with n_rs_seq snapshots, "
            + ", ".join(f"{n}: {copy * (1 + n) / 2**20:.1f} MiB" for n in (0, k, 16))
        )


if __name__ == "__main__":
    main()
