"""The CPU threads a draft model's and an MTP head's context decode on (a benchmark, not CI).

The target decodes on the session's polling pool (backend/threads.py). The drafting context
gets one of:
- `shared`: the target's pool, which it decodes in turn with (what specrun does);
- `polling`: a pool of its own with llama.cpp's default polling (50), as the target's;
- `sleeping`: a pool of its own whose threads sleep as soon as a graph is done (polling 0);
- `none`: no pool, as llama.cpp gives its draft and MTP contexts: ggml starts and joins
  threads - 1 threads for every graph.
Each variant runs in a process of its own, the variants in turn (A B C D, B C D A, ...), greedy,
on the generated models of scripts/generated_models.py (`cpu`, `cpu-small`: a llama drafted by
its first layer, and a qwen35 with its MTP head) or on Gemma 3 270M drafted by SmolLM2-135M
(`gemma`, translated text). Prints, per set-up and variant, tokens/s over all rounds and each
round's ratio to `polling`, and the CPU time the process spent per token (every thread's: a
pool's polling shows there); a variant that wrote other tokens than the rest is named.

    python scripts/thread_pools.py [--size cpu-small|cpu|gpu|gemma] [--rounds 4] [--threads 2]
"""

from __future__ import annotations

import specrun.backend  # noqa: F401  (libllama loads before numpy: backend.library.load_before_numpy)

# isort: split

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from generated_models import SIZES, write_models

VARIANTS = ("polling", "sleeping", "none", "shared")  # polling first: the ratios' baseline
PROMPT = "the cat sat on the mat and the cat sat on the mat , then the dog was there and the cat"
GEMMA_PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def child(variant: str, setup: str, args: argparse.Namespace) -> None:
    """One process: the drafting contexts get `variant`'s threads; prints tokens/s and the tokens."""
    from specrun.core.events import Done, TokenEvent
    from specrun.session import Session

    install(variant)
    config, prompt = session_config(setup, args.size, args.models, args.threads)
    with Session(config) as session:
        session.generate(prompt, max_tokens=16)  # warm up: page cache, first graphs
        seconds, made, text = 0.0, 0, []
        cpu_at = os.times()
        for _ in range(args.repeats):
            start = None
            for event in session.stream(prompt, args.tokens, plain=False, k="3" if setup == "mtp" else "4"):
                if isinstance(event, TokenEvent):
                    start = start or time.perf_counter()
                    text.append(event.token)
                if isinstance(event, Done):
                    seconds += time.perf_counter() - start
                    made += event.stats.tokens - 1
        cpu = sum(os.times()[:2]) - sum(cpu_at[:2])  # every thread's, the pools' spinning included
    print(json.dumps({"tok/s": made / seconds, "cpu ms/token": 1000 * cpu / made, "tokens": text[: args.tokens]}))


def install(variant: str) -> None:
    """Give the drafting contexts (a draft model's, an MTP head's) `variant`'s threads."""
    import ctypes

    from specrun.backend import ThreadPool, context, mtp
    from specrun.backend.library import ThreadPoolParams, ggml, thread_pool_calls

    role, calls = ["target"], thread_pool_calls()
    attach_shared = ThreadPool.attach

    def attach(pool: ThreadPool, handle) -> None:
        if role[0] == "target" or variant == "shared":
            return attach_shared(pool, handle)
        if variant in ("polling", "sleeping"):  # a pool of its own, stopped when the process ends
            params = ThreadPoolParams()
            ggml().ggml_threadpool_params_init(ctypes.byref(params), pool.n_threads)
            params.poll = params.poll if variant == "polling" else 0
            calls.attach(handle, calls.new(ctypes.byref(params)), None)

    ThreadPool.attach = attach
    context._LlamaContext.__init__ = _setting_role(context._LlamaContext.__init__, role, lambda model: model.role)
    mtp._HeadContext.__init__ = _setting_role(mtp._HeadContext.__init__, role, lambda target: "mtp")


def _setting_role(init, role: list, role_of):
    """`init` that first records the role of the context it makes (its first argument's)."""

    def wrapped(self, first, *args):
        role[0] = role_of(first)
        init(self, first, *args)

    return wrapped


def session_config(setup: str, size: str, folder: Path, threads: int):
    from specrun.config import SessionConfig

    if size == "gemma":
        from specrun.hub.embedded import embedded_model_path

        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from smollm2 import fetch

        return SessionConfig(target=embedded_model_path(), draft=fetch(), n_ctx=2048, threads=threads), GEMMA_PROMPT
    models = write_models(folder, size)
    if setup == "mtp":
        return SessionConfig(target=models["q35"], n_ctx=2048, threads=threads, sources=("mtp",)), PROMPT
    return SessionConfig(target=models["target"], draft=models["draft"], n_ctx=2048, threads=threads), PROMPT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=(*SIZES, "gemma"), default="cpu-small")
    parser.add_argument("--models", type=Path, default=Path("/tmp/specrun-host-time"), help="folder of the generated models")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3, help="generations per process and round")
    parser.add_argument("--child", nargs=2, metavar=("VARIANT", "SETUP"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(*args.child, args)
    setups = ("draft",) if args.size == "gemma" else ("draft", "mtp")
    speeds: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    cpu: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    tokens: dict[tuple[str, str], list] = {}
    for round_ in range(args.rounds):
        order = VARIANTS[round_ % len(VARIANTS) :] + VARIANTS[: round_ % len(VARIANTS)]
        for setup in setups:
            for variant in order:
                command = [
                    sys.executable,
                    __file__,
                    "--size",
                    args.size,
                    "--models",
                    str(args.models),
                    "--threads",
                    str(args.threads),
                ]
                command += ["--tokens", str(args.tokens), "--repeats", str(args.repeats), "--child", variant, setup]
                out = subprocess.run(command, capture_output=True, text=True)
                if out.returncode != 0:
                    sys.exit(f"thread_pools.py: {variant} {setup} failed:\n{out.stderr[-2000:]}")
                result = json.loads(out.stdout.strip().splitlines()[-1])
                speeds[setup, variant].append(result["tok/s"])
                cpu[setup, variant].append(result["cpu ms/token"])
                tokens.setdefault((setup, variant), result["tokens"])
                print(f"round {round_ + 1} {setup} {variant}: {result['tok/s']:.1f} tok/s", file=sys.stderr, flush=True)
    print(f"| set-up | variant | tok/s (mean) | / polling, per round | CPU ms/token | size {args.size}, {args.threads} threads |")
    print("|---|---|---|---|---|---|")
    for setup in setups:
        for variant in VARIANTS:
            mine, polling = speeds[setup, variant], speeds[setup, "polling"]
            ratios = " / ".join(f"{a / b:.3f}" for a, b in zip(mine, polling))
            same = "" if tokens[setup, variant] == tokens[setup, "polling"] else "other tokens"
            busy = sum(cpu[setup, variant]) / len(cpu[setup, variant])
            print(f"| {setup} | {variant} | {sum(mine) / len(mine):.1f} | {ratios} | {busy:.2f} | {same} |")


if __name__ == "__main__":
    main()
