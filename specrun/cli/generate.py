"""`specrun generate`: one prompt, streamed, with speculative statistics."""

from __future__ import annotations

import json
import sys
from contextlib import closing
from pathlib import Path
from typing import Annotated, Optional

import typer

from specrun.cli import options as o
from specrun.cli.app import app, err_console
from specrun.engine import Done, Stats, TokenEvent
from specrun.session import Session


@app.command()
def generate(
    prompt: Annotated[Optional[str], typer.Argument(help="Text to continue (default: --prompt-file, else standard input).")] = None,
    prompt_file: Annotated[Optional[Path], typer.Option("--prompt-file", "-f", help="Read the prompt from a file (default: PROMPT, else standard input).")] = None,
    target: o.Target = None,
    draft: o.Draft = None,
    quant: o.Quant = None,
    draft_quant: o.DraftQuant = None,
    offline: o.Offline = False,
    lookup: o.Lookup = False,
    k: o.K = "auto",
    temp: o.Temp = 0.0,
    top_k: o.TopK = 40,
    top_p: o.TopP = 0.95,
    min_p: o.MinP = 0.05,
    seed: o.Seed = None,
    max_tokens: o.MaxTokens = 256,
    ctx_size: o.CtxSize = 4096,
    threads: o.Threads = 0,
    ubatch_size: o.UbatchSize = 0,
    n_gpu_layers: o.GpuLayers = -1,
    draft_n_gpu_layers: o.DraftGpuLayers = -1,
    rpc: o.Rpc = None,
    draft_rpc: o.DraftRpc = None,
    tensor_split: o.TensorSplit = None,
    rpc_timeout: o.RpcTimeout = 300.0,
    compare_plain: Annotated[bool, typer.Option("--compare-plain", help="Also decode plainly; report speed-up and match.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of streaming text.")] = False,
) -> None:
    """Continue PROMPT with the target, drafting by --draft model and/or --lookup."""
    text = o.read_prompt(prompt, prompt_file)
    config = o.session_config(
        target, draft, lookup, k, temp, top_k, top_p, min_p, seed, ctx_size, threads, n_gpu_layers, draft_n_gpu_layers,
        quant=quant, draft_quant=draft_quant, offline=offline,
        rpc_servers=rpc, draft_rpc=draft_rpc, tensor_split=tensor_split, rpc_timeout=rpc_timeout, ubatch_size=ubatch_size,
    )
    with Session(config) as session:
        if config.draft is None and not config.lookup:
            err_console.print("[dim]no --draft or --lookup: plain decoding[/]")
        tokens = session.tokenize(text)
        spec_tokens, spec_stats = _run(session.stream(tokens, max_tokens), echo=not as_json)
        result = {"text": session.target_model.detokenize(spec_tokens), "tokens": spec_tokens, "stats": spec_stats.to_dict()}
        if compare_plain:
            plain_tokens, plain_stats = _run(session.stream(tokens, max_tokens, plain=True), echo=False)
            result["plain"] = {
                "text": session.target_model.detokenize(plain_tokens),
                "tokens_per_s": plain_stats.tokens_per_s,
                "stats": plain_stats.to_dict(),
            }
            result["speedup"] = spec_stats.tokens_per_s / plain_stats.tokens_per_s if plain_stats.tokens_per_s else 0.0
            result["matches_plain"] = plain_tokens == spec_tokens
    if as_json:
        print(json.dumps(result))
    else:
        _report(result)


def _run(events, echo: bool) -> tuple[list[int], Stats]:
    tokens: list[int] = []
    # Closed here, even on Ctrl-C: its rollback must run before the session frees the caches.
    with closing(events):
        for event in events:
            if isinstance(event, TokenEvent):
                tokens.append(event.token)
                if echo:
                    sys.stdout.write(event.text)
                    sys.stdout.flush()
            elif isinstance(event, Done):
                if echo:
                    sys.stdout.write("\n")
                return tokens, event.stats
    raise AssertionError("the event stream ended without Done")


def _report(result: dict) -> None:
    s = result["stats"]
    err_console.print(
        f"[dim]{s['tokens']} tokens in {s['steps']} steps, {s['tokens_per_s']:.1f} tok/s; "
        f"accepted {s['accepted']}/{s['drafted']} drafts ({100 * s['acceptance_rate']:.0f}%), "
        f"{s['mean_accepted_length']:.2f} tokens/step; prompt {s['prompt_tokens']} tokens in "
        f"{s['prefill_s']:.2f}s; stop: {s['stop_reason']}[/]"
    )
    if "plain" in result:
        match = "identical" if result["matches_plain"] else "different"
        err_console.print(
            f"[dim]plain: {result['plain']['tokens_per_s']:.1f} tok/s; speed-up {result['speedup']:.2f}x; "
            f"output {match}[/]"
        )
