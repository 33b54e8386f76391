"""What the chat page's stream field costs the server: tokens/s with `"specrun": {"pieces": true}`
against without, in one interleaved run (docs/benchmarks.md, "The chat page's stream field").

Starts `specrun serve` on a free loopback port (the embedded Gemma 3 270M by default), streams
the same greedy completions with the field off and on, alternating which goes first each round
so drift falls on both alike, and stops the server by its pid. Reports, per mode, the server's
own generation speed (`timings.predicted_per_second`) and what the client saw (tokens over the
time from sending the request to `[DONE]`), as medians over every request; and, since prompts
differ in speed far more than the field could, the on/off ratio of each pair (the same prompt
in the same round), their median and range.

    python scripts/bench_page_field.py --rounds 5
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import statistics
import subprocess
import sys
import time

import httpx

from specrun.hub.embedded import embedded_model_path

PROMPTS = [
    "The history of the printing press begins",
    "def merge_sorted(a, b):\n    result = []\n",
    "Once upon a time, in a village by the sea, there lived",
    "The three laws of thermodynamics are",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(target: str, threads: int, k: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [sys.executable, "-m", "specrun", "serve", "--target", target, "--port", str(port), "--k", k]
    process = subprocess.Popen([*command, "--threads", str(threads), "--parallel", "1"], stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    process.kill()
    raise SystemExit("the server did not become ready")


def one_request(client: httpx.Client, prompt: str, max_tokens: int, field: bool) -> tuple[float, float, int]:
    """(the server's tokens/s, the client's tokens/s, tokens) of one streamed greedy completion."""
    body: dict = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    if field:
        body["specrun"] = {"pieces": True}
    started = time.perf_counter()
    timings = None
    with client.stream("POST", "/v1/completions", json=body) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                timings = json.loads(line[6:]).get("timings") or timings
    wall = time.perf_counter() - started
    assert timings is not None, "the stream ended without timings"
    return timings["predicted_per_second"], timings["predicted_n"] / wall, timings["predicted_n"]


def run(url: str, rounds: int, max_tokens: int) -> dict[bool, list[tuple[float, float, int]]]:
    """Every prompt with the field off and on, once per round; the order alternates by round."""
    results: dict[bool, list[tuple[float, float, int]]] = {False: [], True: []}
    with httpx.Client(base_url=url, timeout=300) as client:
        for prompt in PROMPTS:  # a warm-up of each prompt, not counted: caches and auto's costs settle
            one_request(client, prompt, max_tokens, False)
        for round_ in range(rounds):
            for prompt in PROMPTS:
                for field in (False, True) if round_ % 2 == 0 else (True, False):
                    results[field].append(one_request(client, prompt, max_tokens, field))
    return results


def report(results: dict[bool, list[tuple[float, float, int]]]) -> None:
    for field, rows in results.items():
        server, client = statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows)
        low, high = min(r[0] for r in rows), max(r[0] for r in rows)
        name = "field on " if field else "field off"
        print(
            f"{name}: server {server:.1f} tok/s (range {low:.1f}-{high:.1f}), client {client:.1f} tok/s, "
            f"{len(rows)} requests, {sum(r[2] for r in rows)} tokens"
        )
    for i, name in enumerate(("server", "client")):
        ratios = sorted(on[i] / off[i] for on, off in zip(results[True], results[False]))
        print(
            f"on/off, {name}, {len(ratios)} pairs: median {statistics.median(ratios):.3f}x, "
            f"middle half {ratios[len(ratios) // 4]:.3f}-{ratios[-(len(ratios) // 4) - 1]:.3f}x, "
            f"range {ratios[0]:.3f}-{ratios[-1]:.3f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=None, help="a GGUF (default: the embedded Gemma 3 270M)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    # a fixed k by default: auto would size drafts by what it learns as the run goes, on and off alike but not in step
    parser.add_argument("--k", default="4")
    args = parser.parse_args()
    process, url = start_server(args.target or str(embedded_model_path()), args.threads, args.k)
    try:
        report(run(url, args.rounds, args.max_tokens))
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)


if __name__ == "__main__":
    main()
