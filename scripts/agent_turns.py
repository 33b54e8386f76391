"""Time to first token per turn of a recorded agent session, specrun serve against llama-server (a benchmark, not CI).

An agent resends its whole conversation each turn: a system prompt of a few thousand tokens, then
the user's task, the assistant's calls and the tools' results, one turn longer each time. This
replays such a session (a system prompt of specrun's own docs, tool results of its own source
files, fixed assistant turns, so that both servers read the same text) through
/v1/chat/completions, one token a turn, on `specrun serve` and on llama-server (built from the
llama.cpp that llama-cpp-python vendors, `compare_llama_cpp.build_tools`), same model, threads and
context, interleaved round by round. Per turn it reports each server's time to first token, the
tokens the turn added (`timings.prompt_n`), specrun's time to prefill them after the cached turns
(`timings.prompt_ms`), and its time to prefill them alone (a fresh prompt of the same token ids,
which attends to none of the earlier turns).

    python scripts/agent_turns.py [--llama-bin DIR] [--turns 8] [--rounds 2] [--threads 2]
"""

from __future__ import annotations

import specrun.backend  # noqa: F401  (libllama loads before numpy: backend.library.load_before_numpy)

# isort: split

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from compare_llama_cpp import build_tools
from compare_llama_server import llama_server, post

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from serve_helpers import RunningServer  # noqa: E402

from specrun.config import SessionConfig  # noqa: E402
from specrun.hub.embedded import embedded_model_path  # noqa: E402
from specrun.serve.server import ServeOptions  # noqa: E402

ROOT = Path(__file__).parent.parent
N_CTX = 16384
FILES = ["specrun/core/policy.py", "specrun/drafts/lookup.py", "specrun/serve/jobs.py", "specrun/sequences.py"]


def session(turns: int) -> list[list[dict]]:
    """The conversation as each turn sends it: a system prompt of about 3,000 tokens, a task, then
    the assistant asking for a file and the file's text coming back, turn after turn."""
    system = (ROOT / "docs" / "design.md").read_text()[:12000]
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Review the drafting code for bugs."}]
    sent = [list(messages)]
    for turn in range(1, turns):
        name = FILES[(turn - 1) % len(FILES)]
        text = (ROOT / name).read_text()[:2500]
        messages += [
            {"role": "assistant", "content": f"Let me read {name} first."},
            {"role": "user", "content": f"Contents of {name}:\n{text}"},
        ]
        sent.append(list(messages))
    return sent


def ask(url: str, messages: list[dict]) -> tuple[float, dict]:
    """Seconds to a one-token reply (a first token and its end), and the reply's timings."""
    started = time.perf_counter()
    reply = post(f"{url}/v1/chat/completions", {"messages": messages, "max_tokens": 1, "temperature": 0})
    return time.perf_counter() - started, reply.get("timings", {})


def prefill_alone(url: str, messages: list[dict], new_tokens: int) -> float:
    """specrun's time for a fresh prompt of the tokens the turn added: the rendered conversation's last `new_tokens`."""
    whole = post(f"{url}/apply-template", {"messages": messages})["prompt"]
    ids = post(f"{url}/tokenize", {"content": whole})["tokens"][-new_tokens:]
    started = time.perf_counter()
    post(f"{url}/completion", {"prompt": ids, "n_predict": 1, "temperature": 0})
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-bin", type=Path, help="folder with llama-server (built when left out)")
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    bin_dir, model = args.llama_bin or build_tools(), embedded_model_path()
    turns = session(args.turns)
    log = Path(tempfile.mkdtemp(prefix="specrun-agent-")) / "llama-server.log"
    ours: dict[int, list[float]] = {t: [] for t in range(len(turns))}
    theirs: dict[int, list[float]] = {t: [] for t in range(len(turns))}
    alone: dict[int, list[float]] = {t: [] for t in range(len(turns))}
    prefill: dict[int, list[float]] = {t: [] for t in range(len(turns))}
    added: dict[int, int] = {}
    for _ in range(args.rounds):
        config = SessionConfig(target=model, n_ctx=N_CTX, threads=args.threads, lookup=True, k="auto")
        server = RunningServer(config, ServeOptions(port=0))
        try:
            replies = [ask(server.url, messages) for messages in turns]
            for t, (seconds, timings) in enumerate(replies):
                ours[t].append(seconds)
                prefill[t].append(timings["prompt_ms"] / 1000)
                added[t] = timings["prompt_n"]
            for t in range(1, len(turns)):
                alone[t].append(prefill_alone(server.url, turns[t], added[t]))
        finally:
            server.stop()
        extra = ("-c", str(N_CTX), "-np", "1")
        with llama_server(bin_dir, model, "none", args.threads, log, extra) as url:
            for t, messages in enumerate(turns):
                theirs[t].append(ask(url, messages)[0])
    print("| turn | new tokens | specrun TTFT | its prefill of them | alone | llama-server TTFT | specrun / llama-server |")
    print("|---|---|---|---|---|---|---|")
    for t in range(len(turns)):
        a, b, p = statistics.median(ours[t]), statistics.median(theirs[t]), statistics.median(prefill[t])
        by_alone = f"{statistics.median(alone[t]) * 1000:.0f} ms" if alone[t] else "-"
        print(f"| {t + 1} | {added[t]} | {a * 1000:.0f} ms | {p * 1000:.0f} ms | {by_alone} | {b * 1000:.0f} ms | {a / b:.2f} |")


if __name__ == "__main__":
    main()
