"""Resident memory over many generations in one session, and over many session open/close cycles.

Both should stay flat: a leak per generation (a growing cache of pieces, events kept
alive, logits copies) or per session (contexts, batches or models not freed) shows as
growth from the first reading after warm-up to the last. Reported: RSS in MiB after
warm-up, at the end, the largest seen, and the growth in percent (the goal: within 5%).

    python scripts/memory_soak.py                               # embedded Gemma 3 270M, lookup
    python scripts/memory_soak.py --target T.gguf --draft D.gguf --generations 1000 --cycles 50
"""

from __future__ import annotations

import specrun.backend  # noqa: F401  (libllama loads before numpy: backend.library.load_before_numpy)

# isort: split

import argparse
import gc
import os
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specrun.config import SessionConfig  # noqa: E402
from specrun.core.sampling import SamplerSettings  # noqa: E402
from specrun.errors import SpecrunError  # noqa: E402
from specrun.session import Session  # noqa: E402

PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
    "The capital of France is Paris. The capital of Italy is",
    "Once upon a time there was a small village by the sea, and",
    "| name | price |\n| apple | 1.20 |\n| pear | 0.80 |\n| apple |",
]


def rss_mib() -> float:
    """Current resident set size (Linux /proc), else the peak (ru_maxrss) as a stand-in."""
    gc.collect()
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def generate_once(session: Session, index: int, max_tokens: int) -> None:
    session.generate(PROMPTS[index % len(PROMPTS)], max_tokens, seed=index)


def report(name: str, readings: list[tuple[int, float]]) -> None:
    first, last = readings[0][1], readings[-1][1]
    peak = max(value for _, value in readings)
    growth = 100 * (last - first) / first
    print(
        f"{name}: {first:.1f} MiB after warm-up (#{readings[0][0]}), {last:.1f} MiB at #{readings[-1][0]}, "
        f"peak {peak:.1f} MiB, growth {growth:+.2f}% ({'flat' if abs(growth) <= 5 else 'NOT flat'} within 5%)"
    )
    print("  readings: " + ", ".join(f"#{i} {value:.1f}" for i, value in readings))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, help="target GGUF (default: the embedded Gemma 3 270M)")
    parser.add_argument("--draft", type=Path, help="draft GGUF (default: none)")
    parser.add_argument("--lookup", action=argparse.BooleanOptionalAction, default=True, help="prompt lookup (default on)")
    parser.add_argument("--generations", type=int, default=1000)
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=20, help="generations (and cycles) before the first reading")
    parser.add_argument("--temp", type=float, default=0.8)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    if args.target is None:
        from specrun.hub.embedded import embedded_model_path

        args.target = embedded_model_path()
    config = SessionConfig(
        target=args.target,
        draft=args.draft,
        lookup=args.lookup,
        k=4,
        n_ctx=512,
        threads=args.threads,
        sampler=SamplerSettings(temperature=args.temp),
    )
    what = " + ".join(filter(None, [args.draft.name if args.draft else "", "lookup" if args.lookup else ""]))
    print(
        f"target {args.target.name}, drafting {what or 'none'}, {args.max_tokens} tokens per generation, temperature {args.temp}"
    )

    every = max(args.generations // 10, 1)
    with Session(config) as session:
        for i in range(args.warmup):
            generate_once(session, i, args.max_tokens)
        readings = [(0, rss_mib())]
        for i in range(1, args.generations + 1):
            generate_once(session, i, args.max_tokens)
            if i % every == 0:
                readings.append((i, rss_mib()))
    report(f"{args.generations} generations in one session", readings)

    every = max(args.cycles // 10, 1)
    for i in range(args.warmup):
        with Session(config) as session:
            generate_once(session, i, args.max_tokens)
    readings = [(0, rss_mib())]
    for i in range(1, args.cycles + 1):
        with Session(config) as session:
            generate_once(session, i, args.max_tokens)
        if i % every == 0:
            readings.append((i, rss_mib()))
    report(f"{args.cycles} session open/close cycles", readings)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SpecrunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
