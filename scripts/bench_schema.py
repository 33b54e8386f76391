"""Schema-constrained requests: specrun serve against llama-server on the agent workload (benchmark, not CI).

Every request of bench_serve.py's agent workload (a document, one line of JSON with a person's
details) carries the record's JSON schema in llama-server's `json_schema` field, which both
servers take, and is sent to each server in turn, greedy, after one warm-up request each.
The set-ups: llama-server without speculation and with its n-gram types, specrun serve, and
specrun serve --no-grammar-drafts. Reported per set-up: how many outputs parse and validate
against the schema (jsonschema), tok/s over the generated tokens (the server's own
`timings.predicted_ms`), the same on the requests where every set-up wrote the same text, and
for specrun the share of generated tokens that came from drafts of what the grammar forced.

    python scripts/bench_schema.py --requests 200 [--target SmolLM2.gguf] [--without-copies]
"""

from __future__ import annotations

import specrun.backend  # noqa: F401  (libllama loads before numpy: backend.library.load_before_numpy)

# isort: split

import argparse
import json
import tempfile
from pathlib import Path

import jsonschema
from bench_serve import FIELDS, Running, Setup, client, llama_server_setups, timed_stream
from bench_serve import agent_prompts as records
from compare_llama_cpp import build_tools

from specrun.hub.embedded import embedded_model_path

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "occupation": {"type": "string"},
        "city": {"type": "string"},
        "employer": {"type": "string"},
        "start_year": {"type": "integer"},
    },
    "required": list(FIELDS),
    "additionalProperties": False,
}


def setups(bin_dir: Path, without_copies: bool) -> list[Setup]:
    found = llama_server_setups(bin_dir) + [
        Setup("specrun", "specrun"),
        Setup("specrun --no-grammar-drafts", "specrun", ("--no-grammar-drafts",)),
    ]
    if without_copies:  # nothing copied from the prompt or earlier requests: what the grammar drafts alone give
        copies_off = ("--no-lookup", "--store-tokens", "0")
        found += [
            Setup("specrun, grammar drafts only", "specrun", copies_off),
            Setup("specrun, no drafts", "specrun", (*copies_off, "--no-grammar-drafts")),
        ]
    return found


def prompts(count: int) -> list[str]:
    """The agent workload, each document again with its round's number after the first 20."""
    base = records(20)
    return [f"Request {i + 1}.\n{base[i % 20]}" if i >= 20 else base[i] for i in range(count)]


def valid(text: str) -> bool:
    try:
        jsonschema.validate(json.loads(text), SCHEMA)
        return True
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, default=None, help="GGUF (default: the embedded Gemma 3 270M)")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--build", type=Path, default=Path(tempfile.gettempdir()) / "llama-tools")
    parser.add_argument(
        "--without-copies", action="store_true", help="also specrun without lookup and store, with and without grammar drafts"
    )
    args = parser.parse_args()
    bin_dir = build_tools(args.build, ["llama-server"])
    model = args.target or embedded_model_path()
    with tempfile.TemporaryDirectory() as logs:
        servers = {
            s.name: Running(s, bin_dir, model, args.threads, 4096, Path(logs) / f"{i}.log")
            for i, s in enumerate(setups(bin_dir, args.without_copies))
        }
        try:
            runs = replay(servers, prompts(args.requests), args.max_tokens)
        finally:
            for server in servers.values():
                server.stop()
    report(runs)


def replay(servers: dict, workload: list[str], max_tokens: int) -> dict[str, list]:
    runs: dict[str, list] = {name: [] for name in servers}
    with client() as http:
        for server in servers.values():
            timed_stream(http, f"{server.url}/v1/completions", {"prompt": workload[0], "json_schema": SCHEMA}, 8, [])
        for prompt in workload:
            for name, server in servers.items():
                body = {"prompt": prompt, "json_schema": SCHEMA}
                runs[name].append(timed_stream(http, f"{server.url}/v1/completions", body, max_tokens, ["\n"]))
    return runs


def report(runs: dict[str, list]) -> None:
    n = len(next(iter(runs.values())))
    same = [i for i in range(n) if len({runs[name][i].text for name in runs}) == 1]
    print(f"{'set-up':32} {'valid':>9} {'tok/s':>7} {'tok/s same text':>16} {'forced':>7}")
    for name, rows in runs.items():
        speed = sum(r.tokens for r in rows) / (sum(r.timings.get("predicted_ms", 0) for r in rows) / 1000)
        same_rows = [rows[i] for i in same]
        same_speed = (
            sum(r.tokens for r in same_rows) / (sum(r.timings.get("predicted_ms", 0) for r in same_rows) / 1000)
            if same_rows
            else float("nan")
        )
        forced = sum(r.timings.get("draft_n_grammar", 0) for r in rows) / max(sum(r.tokens for r in rows), 1)
        print(f"{name:32} {sum(valid(r.text) for r in rows):>4} / {n:<3} {speed:7.1f} {same_speed:16.1f} {forced:7.0%}")
    print(f"requests where every set-up wrote the same text: {len(same)} of {n}")


if __name__ == "__main__":
    main()
