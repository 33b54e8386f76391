"""The same requests through /v1/messages and /v1/chat/completions: the same text, at the same speed? (a benchmark, not CI)

Starts `specrun serve` on the embedded model with prompt lookup (no store of earlier requests, which
would let the second route copy the first's reply) and sends each prompt of a built-in set through
both routes, B A A B, greedy, reading each reply's text and wall time. A
translation costs microseconds; this checks that nothing in it (the template's turns, the stop
strings, the stream's pieces) makes the copies a Messages client gets slower or different.

    python scripts/messages_vs_chat.py [--set extraction] [--rounds 2] [--tokens 96] [--threads 2]
"""

from __future__ import annotations

import specrun.backend  # noqa: F401  (libllama loads before numpy: backend.library.load_before_numpy)

# isort: split

import argparse
import statistics
import sys
import time
from pathlib import Path

from compare_llama_server import post

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from serve_helpers import RunningServer  # noqa: E402

from specrun.bench.prompts import load_builtin  # noqa: E402
from specrun.config import SessionConfig  # noqa: E402
from specrun.hub.embedded import embedded_model_path  # noqa: E402
from specrun.serve.server import ServeOptions  # noqa: E402


def chat(url: str, prompt: str, tokens: int) -> tuple[float, str]:
    started = time.perf_counter()
    reply = post(f"{url}/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}], "max_tokens": tokens})
    return time.perf_counter() - started, reply["choices"][0]["message"]["content"]


def messages(url: str, prompt: str, tokens: int) -> tuple[float, str]:
    started = time.perf_counter()
    reply = post(f"{url}/v1/messages", {"messages": [{"role": "user", "content": prompt}], "max_tokens": tokens})
    return time.perf_counter() - started, "".join(block["text"] for block in reply["content"] if block["type"] == "text")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", default="extraction", help="a built-in prompt set")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    prompts = [p.text for p in load_builtin([args.set]) if p.text is not None]
    # No store of earlier requests: the route asked second would find the first's reply there and copy it whole.
    config = SessionConfig(target=embedded_model_path(), lookup=True, k="auto", n_ctx=4096, threads=args.threads, store_tokens=0)
    server = RunningServer(config, ServeOptions(port=0))
    ratios, same = [], 0
    try:
        for prompt in prompts:
            times: dict[str, list[float]] = {"chat": [], "messages": []}
            texts = {}
            routes = [("chat", chat), ("messages", messages)]
            for round_ in range(args.rounds):
                for name, route in routes if round_ % 2 else routes[::-1]:  # B A, A B, ...: neither always goes first
                    seconds, texts[name] = route(server.url, prompt, args.tokens)
                    times[name].append(seconds)
            if texts["chat"] == texts["messages"]:
                same += 1
                ratios.append(statistics.median(times["chat"]) / statistics.median(times["messages"]))
    finally:
        server.stop()
    print(f"{same} of {len(prompts)} prompts wrote the same text through both routes")
    print(
        f"messages speed / chat speed, per prompt: {' / '.join(f'{r:.2f}' for r in ratios)}; median {statistics.median(ratios):.3f}"
    )


if __name__ == "__main__":
    main()
