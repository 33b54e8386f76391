"""specrun's prompt lookup against llama-server's n-gram speculation on the same GGUF (benchmark, not CI).

Builds llama-server and llama-lookup from the llama.cpp that the installed llama-cpp-python
vendors, starts one llama-server per speculation type on free loopback ports (no
speculation, ngram-simple, ngram-mod, ngram-map-k; same model, threads and context), and
sends each prompt to its /completion endpoint (cache_prompt false, temperature 0),
reading `timings.predicted_per_second` and `draft_n` / `draft_n_accepted`. Interleaved
per prompt with llama-lookup and with fresh `specrun generate` processes (plain, and
--lookup --k auto), so the machine's drift falls on every method alike. Each round
starts the servers afresh, so ngram-mod's shared pool holds only that round's prompts.

Greedy paths can part after a near-tie, so it reports per prompt whether specrun's text
equals each server's, and compares speeds on the prompts where they are the same.

    python scripts/compare_llama_server.py [--prompts F [F ...]] [--rounds 3] [--tokens 128]
"""

from __future__ import annotations

import specrun.backend  # noqa: F401  (libllama loads before numpy: backend.library.load_before_numpy)

# isort: split

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack, contextmanager
from pathlib import Path

from compare_llama_cpp import build_tools, read_prompts, tool_speed

from specrun.hub.embedded import embedded_model_path

HERE = Path(__file__).parent
SERVER_TYPES = ["none", "ngram-simple", "ngram-mod", "ngram-map-k"]
LOOKUP_N_MAX = [16, 64]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def post(url: str, body: dict, timeout: float = 600) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)


@contextmanager
def llama_server(bin_dir: Path, model: Path, spec_type: str, threads: int, log: Path, extra: tuple[str, ...] = ()):
    """One llama-server on a free loopback port, ready and warmed up; stopped by its process id.
    `extra`: more of its options."""
    port = free_port()
    cmd = [
        bin_dir / "llama-server",
        "-m",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-t",
        str(threads),
        "-tb",
        str(threads),
        "-c",
        "2048",
        "-np",
        "1",
        "--no-webui",
        "--no-repack",
    ]  # as specrun runs
    if spec_type != "none":
        cmd += ["--spec-type", spec_type]
    cmd += extra
    with log.open("a") as out:
        process = subprocess.Popen([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            if process.poll() is not None:
                sys.exit(f"compare_llama_server: llama-server --spec-type {spec_type} exited; see {log}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        post(f"{url}/completion", {"prompt": "Hello", "n_predict": 8, "temperature": 0, "cache_prompt": False})
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def server_run(url: str, prompt: str, tokens: int) -> dict:
    reply = post(f"{url}/completion", {"prompt": prompt, "n_predict": tokens, "temperature": 0, "cache_prompt": False})
    timings = reply["timings"]
    return {
        "tps": timings["predicted_per_second"],
        "text": reply["content"],
        "drafted": timings.get("draft_n", 0),
        "accepted": timings.get("draft_n_accepted", 0),
    }


def specrun_run(model: Path, prompt: str, tokens: int, threads: int, extra: list[str]) -> dict:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "specrun",
            "generate",
            "--target",
            str(model),
            "-n",
            str(tokens),
            "-t",
            str(threads),
            "-c",
            "2048",
            *extra,
            "--json",
        ],
        input=prompt,
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(out.stdout)
    stats = result["stats"]
    return {
        "tps": stats["tokens_per_s"],
        "text": result["text"],
        "drafted": stats["drafted"],
        "accepted": stats["accepted"],
        "steps": stats["steps"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--prompts", type=Path, nargs="+", default=[HERE / "prompts" / "copy_code.txt", HERE / "prompts" / "copy_heavy.txt"]
    )
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--build", type=Path, default=Path(tempfile.gettempdir()) / "llama-tools")
    args = parser.parse_args()
    prompts = [(path.stem, text) for path in args.prompts for text in read_prompts(path)]
    bin_dir, model = build_tools(args.build, ["llama-server", "llama-lookup"]), embedded_model_path()
    specrun_methods = {"specrun plain": [], "specrun auto": ["--lookup", "--k", "auto"]}
    runs: dict[tuple[int, str], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "llama-server.log"
        for _ in range(args.rounds):
            # Every type at once: an idle llama-server waits without spinning.
            with ExitStack() as stack:
                servers = {t: stack.enter_context(llama_server(bin_dir, model, t, args.threads, log)) for t in SERVER_TYPES}
                for i, (_, prompt) in enumerate(prompts):
                    prompt_file = Path(tmp) / f"p{i}.txt"
                    prompt_file.write_text(prompt)
                    for spec_type, url in servers.items():
                        runs.setdefault((i, f"server {spec_type}"), []).append(server_run(url, prompt, args.tokens))
                    for n_max in LOOKUP_N_MAX:
                        tps, _ = tool_speed(
                            [
                                bin_dir / "llama-lookup",
                                "-m",
                                model,
                                "-n",
                                args.tokens,
                                "-t",
                                args.threads,
                                "-c",
                                "2048",
                                "--temp",
                                "0",
                                "--spec-draft-n-max",
                                n_max,
                            ],
                            prompt_file,
                        )
                        runs.setdefault((i, f"llama-lookup k{n_max}"), []).append({"tps": tps})
                    for name, extra in specrun_methods.items():
                        runs.setdefault((i, name), []).append(specrun_run(model, prompt, args.tokens, args.threads, extra))
    report(prompts, runs, args.tokens)


def report(prompts: list[tuple[str, str]], runs: dict, tokens: int) -> None:
    methods = list(dict.fromkeys(name for _, name in runs))
    ngram = [m for m in methods if m.startswith("server ngram")]
    median = {key: statistics.median(r["tps"] for r in rows) for key, rows in runs.items()}
    print(f"{'prompt':16}" + "".join(f"{m.replace('server ', ''):>18}" for m in methods) + "  same text as (servers)")
    for i, (group, _) in enumerate(prompts):
        auto_text = runs[(i, "specrun auto")][0]["text"]
        same = [m.replace("server ", "") for m in methods if m.startswith("server") and runs[(i, m)][0]["text"] == auto_text]
        print(
            f"{group[:12] + ' ' + str(i):16}"
            + "".join(f"{median[(i, m)]:18.1f}" for m in methods)
            + "  "
            + (",".join(same) or "-")
        )
    print("\ndrafts accepted / drafted (first round):")
    for i, (group, _) in enumerate(prompts):
        cells = [
            f"{m.replace('server ', '')} {runs[(i, m)][0]['accepted']}/{runs[(i, m)][0]['drafted']}"
            for m in methods
            if "drafted" in runs[(i, m)][0] and m != "server none" and m != "specrun plain"
        ]
        print(f"  {group[:12]} {i}: " + "; ".join(cells))
    for group in dict.fromkeys(g for g, _ in prompts):
        members = [i for i, (g, _) in enumerate(prompts) if g == group]
        same = [i for i in members if any(runs[(i, m)][0]["text"] == runs[(i, "specrun auto")][0]["text"] for m in ngram)]

        def rate(method: str, which: list[int]) -> float:  # tokens over time, summed over prompts
            return len(which) * tokens / sum(tokens / median[(i, method)] for i in which) if which else 0.0

        print(f"\n{group}: {len(members)} prompts, specrun auto's text equals an n-gram server's on {len(same)}")
        for label, which in (("all prompts", members), ("same-text prompts", same)):
            if not which:
                continue
            best_server = max(ngram, key=lambda m: rate(m, which))
            best_any = max([*ngram, *(m for m in methods if m.startswith("llama-lookup"))], key=lambda m: rate(m, which))
            auto = rate("specrun auto", which)
            print(
                f"  {label}: specrun auto {auto:.1f} tok/s; {auto / rate('specrun plain', which):.2f}x specrun plain; "
                f"{auto / rate(best_server, which):.2f}x the best server type ({best_server}); "
                f"{auto / rate(best_any, which):.2f}x the best of those and llama-lookup ({best_any}); "
                f"server plain {rate('server none', which):.1f} tok/s"
            )


if __name__ == "__main__":
    main()
