"""specrun's translated drafts against llama.cpp's own, on a pair with two vocabularies (benchmark, not CI).

llama.cpp translated drafts between vocabularies through text from March 2025 until May 2026
(`--spec-replace`); the llama.cpp vendored by llama-cpp-python 0.3.16 still has it. This builds
its `llama-speculative-simple` from that sdist (once) and runs it and `specrun generate` on the
same target, draft, prompts, threads and fixed draft length (llama.cpp's `--draft-max K`,
specrun's `--k K`), interleaved per prompt and round, repacking off on both. llama.cpp is
run at its default `--draft-p-min 0.75` and at 0 (which drafts K tokens every step, as
`--k K` does); specrun's plain decoding and `--k auto` run beside them. Reported per run kind:
tokens per second of generation (prompt processing left out), accepted drafted tokens per
step, and how many prompts gave the same greedy text as specrun's plain decoding.

    python scripts/compare_translated.py --draft ~/.cache/specrun-ci/SmolLM2-135M-Instruct.Q4_1.gguf --rounds 2
"""

from __future__ import annotations

import specrun.backend  # noqa: F401  (libllama loads before numpy: backend.library.load_before_numpy)

# isort: split

import argparse
import collections
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from compare_llama_cpp import build_tools

from specrun.hub.embedded import embedded_model_path

HERE = Path(__file__).parent
PROMPTS = [
    "The history of the city begins with a small settlement on the river, where",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "Q: What are the three states of matter?\nA:",
    "Dear Sam,\n\nThank you for the letter you sent last week. I",
]
DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
COUNTS = re.compile(r"n_(predict|drafted|accept)\s*=\s*(\d+)")


def llama_run(
    binary: Path, target: Path, draft: Path, prompt: Path, tokens: int, threads: int, k: int, p_min: float | None
) -> dict:
    command = [
        binary,
        "-m",
        target,
        "-md",
        draft,
        "-f",
        prompt,
        "-n",
        tokens,
        "-t",
        threads,
        "-c",
        2048,
        "--temp",
        0,
        "--draft-max",
        k,
        "--no-repack",
    ]
    if p_min is not None:
        command += ["--draft-p-min", p_min]
    out = subprocess.run([*map(str, command)], capture_output=True, text=True, check=True)
    decoded = DECODED.search(out.stderr)
    counts = {name: int(value) for name, value in COUNTS.findall(out.stderr)}
    steps = counts["predict"] - counts["accept"]  # each step emits its accepted tokens and one of the target's
    text = out.stdout.split(prompt.read_text(), 1)[-1]
    return {"tok_s": int(decoded[1]) / float(decoded[2]), "accepted_per_step": counts["accept"] / steps, "text": text}


def specrun_run(target: Path, draft: Path, prompt: str, tokens: int, threads: int, k: str | None) -> dict:
    options = ["--draft", draft, "--k", k] if k else []
    command = [
        sys.executable,
        "-m",
        "specrun",
        "generate",
        "--target",
        target,
        *options,
        "-n",
        tokens,
        "-t",
        threads,
        "-c",
        2048,
        "--json",
    ]
    out = subprocess.run([*map(str, command)], input=prompt, capture_output=True, text=True, check=True, cwd=HERE.parent)
    result = json.loads(out.stdout)
    stats = result["stats"]
    return {"tok_s": stats["tokens_per_s"], "accepted_per_step": stats["accepted"] / stats["steps"], "text": result["text"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, default=None, help="target GGUF (default: the embedded Gemma 3 270M)")
    parser.add_argument("--draft", type=Path, required=True, help="draft GGUF with another vocabulary")
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--build", type=Path, default=Path(tempfile.gettempdir()) / "llama-tools-0.3.16")
    args = parser.parse_args()
    target = args.target or embedded_model_path()
    binary = build_tools(args.build, ["llama-speculative-simple"], "0.3.16") / "llama-speculative-simple"
    kinds = {
        "specrun plain": lambda p, f: specrun_run(target, args.draft, p, args.tokens, args.threads, None),
        f"specrun --k {args.k}": lambda p, f: specrun_run(target, args.draft, p, args.tokens, args.threads, str(args.k)),
        "specrun --k auto": lambda p, f: specrun_run(target, args.draft, p, args.tokens, args.threads, "auto"),
        f"llama.cpp --draft-max {args.k}": lambda p, f: llama_run(
            binary, target, args.draft, f, args.tokens, args.threads, args.k, None
        ),
        f"llama.cpp --draft-max {args.k} --draft-p-min 0": lambda p, f: llama_run(
            binary, target, args.draft, f, args.tokens, args.threads, args.k, 0
        ),
    }
    runs: dict[str, list[dict]] = collections.defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for i, prompt in enumerate(PROMPTS):
                file = Path(tmp) / f"p{i}.txt"
                file.write_text(prompt)
                for name, run in kinds.items():
                    runs[name].append({"prompt": i, **run(prompt, file)})
    report(runs)
    pair = (f"specrun --k {args.k}", f"llama.cpp --draft-max {args.k} --draft-p-min 0")
    texts = [{run["prompt"]: run["text"] for run in runs[name]} for name in pair]
    same = sorted(i for i in texts[0] if _same(texts[0][i], texts[1][i]))
    print(f"prompts where {pair[0]} and {pair[1]} wrote the same text: {same or 'none'}")


def report(runs: dict[str, list[dict]]) -> None:
    plain_text = {run["prompt"]: run["text"] for run in runs["specrun plain"]}
    print(f"{'':40} {'tok/s':>7} {'accepted/step':>14} {'same text as plain':>19}")
    for name, rows in runs.items():
        rate = sum(r["tok_s"] for r in rows) / len(rows)
        accepted = sum(r["accepted_per_step"] for r in rows) / len(rows)
        same = {r["prompt"] for r in rows if _same(r["text"], plain_text[r["prompt"]])}
        print(f"{name:40} {rate:7.1f} {accepted:14.2f} {len(same):>10} of {len(plain_text)}")
    for key, what in (("tok_s", "tok/s"), ("accepted_per_step", "accepted per step")):
        print(f"per prompt ({what}, mean over rounds):")
        for name, rows in runs.items():
            by_prompt = collections.defaultdict(list)
            for r in rows:
                by_prompt[r["prompt"]].append(r[key])
            print(f"  {name:38} " + " ".join(f"{sum(v) / len(v):6.2f}" for _, v in sorted(by_prompt.items())))


def _same(a: str, b: str) -> bool:
    """Whether two greedy texts agree as far as both go (the tools stop at slightly different counts)."""
    n = min(len(a), len(b))
    return n > 0 and a[:n] == b[:n]


if __name__ == "__main__":
    main()
