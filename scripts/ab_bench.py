"""`specrun bench` as two checkouts have it, run in turn (A B A B ...) on the same sets (benchmark, not CI).

Each round runs `python -m specrun bench --json` in each checkout's folder, so each runs its
own code on the same model, prompts and threads; alternating the two spreads the machine's
drift over both. Prints, per method and k, each checkout's speed-up over its own plain
decoding (total tokens / total time over the rounds) and the ratio of their tok/s, plain
included, and how many prompts gave the same greedy text in both (not with `--parallel N`,
whose runs report only each method's totals).

    git worktree add /tmp/before REV
    python scripts/ab_bench.py /tmp/before . --rounds 2 [-- any bench arguments]
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def run_bench(checkout: Path, extra: list[str], out: Path) -> dict:
    command = [sys.executable, "-m", "specrun", "bench", "--json", str(out), *extra]
    result = subprocess.run(command, cwd=checkout, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"ab_bench: `{' '.join(command)}` in {checkout} failed:\n{result.stderr[-2000:]}")
    return json.loads(out.read_text())


def totals(documents: list[dict]) -> dict[str, tuple[int, float]]:
    """Per result key (plain included): generated tokens and seconds over every prompt and round."""
    summed: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for document in documents:
        for run in document.get("runs", []):  # --parallel N: each method's pass over all prompts
            key = "plain" if run["method"] == "plain" else f"{run['method']}_k{run['k']}"
            summed[key][0] += run["tokens"]
            summed[key][1] += run["seconds"]
        for prompt in document.get("prompts", []):
            for key, row in {"plain": prompt["plain"], **prompt["results"]}.items():
                summed[key][0] += row["tokens"]
                summed[key][1] += row["tokens"] / row["tokens_per_s"] if row["tokens_per_s"] else 0.0
    return {key: (int(n), s) for key, (n, s) in summed.items()}


def same_text(a: list[dict], b: list[dict]) -> tuple[int, int]:
    """Prompts whose every method wrote plain decoding's text in both checkouts, of all prompts."""

    def matching(document: dict) -> list[bool]:
        return [
            all(row.get("matches_plain") in (True, None) for row in prompt["results"].values()) for prompt in document["prompts"]
        ]

    both = [x and y for x, y in zip(matching(a[-1]), matching(b[-1]))]
    return sum(both), len(both)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path, help="the first checkout (the baseline)")
    parser.add_argument("b", type=Path, help="the second checkout")
    parser.add_argument("--rounds", type=int, default=2)
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])  # what follows -- goes to bench whole (argparse may take its options)
    args.bench = argv[cut + 1 :]
    runs: dict[Path, list[dict]] = {args.a: [], args.b: []}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for checkout in (args.a, args.b):
                print(f"round {round_ + 1}: {checkout}", file=sys.stderr, flush=True)
                runs[checkout].append(run_bench(checkout.resolve(), args.bench, Path(tmp) / "bench.json"))
    a, b = totals(runs[args.a]), totals(runs[args.b])
    print(f"{'method':18} {'A x plain':>10} {'B x plain':>10} {'B/A tok/s':>10}")
    for key in a:
        rate_a, rate_b = a[key][0] / a[key][1], b[key][0] / b[key][1]
        print(
            f"{key:18} {rate_a / (a['plain'][0] / a['plain'][1]):10.2f} {rate_b / (b['plain'][0] / b['plain'][1]):10.2f} "
            f"{rate_b / rate_a:10.3f}"
        )
    if "prompts" in runs[args.a][-1]:
        matched, prompts = same_text(runs[args.a], runs[args.b])
        print(f"prompts where every method wrote plain decoding's text in both: {matched} of {prompts}")


if __name__ == "__main__":
    main()
