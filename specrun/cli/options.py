"""Option declarations shared by generate, chat and bench, and turning them into a session."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from specrun import rpc
from specrun.cli.app import err_console
from specrun.errors import SpecrunError
from specrun.hub import resolve_pair
from specrun.policy import parse_k
from specrun.sampling import SamplerSettings
from specrun.session import SessionConfig

MODEL_FORMS = "alias[:QUANT], owner/repo[:QUANT], owner/repo/file.gguf or a path"
Target = Annotated[
    Optional[str],
    typer.Option("--target", "-m", help=f"Target model: {MODEL_FORMS} (default: the embedded Gemma 3 270M)."),
]
Draft = Annotated[
    Optional[str], typer.Option("--draft", "-md", help=f"Draft model with the target's vocabulary: {MODEL_FORMS}.")
]
Quant = Annotated[
    Optional[str], typer.Option("--quant", help="Target quant, e.g. Q4_K_M (default: the largest that fits).")
]
DraftQuant = Annotated[Optional[str], typer.Option("--draft-quant", help="Draft quant (default: the largest 8-bit or smaller that fits).")]
Offline = Annotated[bool, typer.Option("--offline", help="Use only models already in the cache; no network.")]
Lookup = Annotated[
    bool, typer.Option("--lookup", help="Draft by prompt lookup (n-grams copied from the context); with --draft: hybrid.")
]
K = Annotated[
    str, typer.Option("--k", help="Most tokens drafted per step: a number, 'auto' (cost-aware), or 'llama.cpp' (draft-max 16, p-min 0.75).")
]
Temp = Annotated[float, typer.Option("--temp", help="Sampling temperature; 0 is greedy.")]
TopK = Annotated[int, typer.Option("--top-k", help="Top-k filter at temperature > 0 (0 disables).")]
TopP = Annotated[float, typer.Option("--top-p", help="Top-p filter at temperature > 0 (1 disables).")]
MinP = Annotated[float, typer.Option("--min-p", help="Min-p filter at temperature > 0 (0 disables).")]
Seed = Annotated[Optional[int], typer.Option("--seed", help="Seed for reproducible sampling.")]
MaxTokens = Annotated[int, typer.Option("--max-tokens", "-n", help="Most tokens to generate.")]
CtxSize = Annotated[int, typer.Option("--ctx-size", "-c", help="Context size in tokens for target and draft.")]
Threads = Annotated[int, typer.Option("--threads", "-t", help="CPU threads (0 = all cores).")]
GpuLayers = Annotated[int, typer.Option("--n-gpu-layers", "-ngl", help="Target layers to offload (-1 = all).")]
DraftGpuLayers = Annotated[
    int, typer.Option("--draft-n-gpu-layers", "-ngld", help="Draft layers to offload (-1 = all).")
]
Rpc = Annotated[
    Optional[str],
    typer.Option("--rpc", help="llama.cpp rpc-servers that take the target's offloaded layers (-ngl): HOST:PORT[,HOST:PORT...].", rich_help_panel="RPC"),
]
DraftRpc = Annotated[
    Optional[str],
    typer.Option("--draft-rpc", help="rpc-servers for the draft's layers too, HOST:PORT[,...] (default: the draft runs locally).", rich_help_panel="RPC"),
]
TensorSplit = Annotated[
    Optional[str],
    typer.Option("--tensor-split", "-ts", help="Share of the target's offloaded layers per device, RPC servers' first in --rpc order, then local GPUs, e.g. 3,1 (default: by free memory).", rich_help_panel="RPC"),
]
RpcTimeout = Annotated[
    float,
    typer.Option("--rpc-timeout", help="Seconds one decode may wait for the rpc-servers before specrun gives up with an error (0 = forever).", rich_help_panel="RPC"),
]


def session_config(
    target: str | None,
    draft: str | None,
    lookup: bool,
    k: str,
    temp: float,
    top_k: int,
    top_p: float,
    min_p: float,
    seed: int | None,
    ctx_size: int,
    threads: int,
    n_gpu_layers: int,
    draft_n_gpu_layers: int,
    quant: str | None = None,
    draft_quant: str | None = None,
    offline: bool = False,
    rpc_servers: str | None = None,
    draft_rpc: str | None = None,
    tensor_split: str | None = None,
    rpc_timeout: float = 300.0,
) -> SessionConfig:
    sampler = SamplerSettings(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
    target_rpc = rpc.parse_endpoints(rpc_servers, "--rpc")
    draft_endpoints = rpc.parse_endpoints(draft_rpc, "--draft-rpc")
    if draft_endpoints and draft is None:
        raise SpecrunError("--draft-rpc places a draft model's layers: give --draft too, or drop --draft-rpc")
    split = rpc.parse_tensor_split(tensor_split)
    if target_rpc or draft_endpoints:  # before any download: a server that is down fails in a second
        from specrun import backend

        backend.check_rpc(tuple(dict.fromkeys(target_rpc + draft_endpoints)))
    # Paths, aliases and hub repos all go through the one resolver; it says which file and why.
    target_model, draft_model = resolve_pair(
        target, draft, quant=quant, draft_quant=draft_quant, offline=offline, report=_report_model, rpc=target_rpc
    )
    return SessionConfig(
        target=target_model.path,
        draft=draft_model.path if draft_model else None,
        lookup=lookup,
        k=parse_k(k),
        sampler=sampler,
        n_ctx=ctx_size,
        threads=threads,
        n_gpu_layers=n_gpu_layers,
        draft_n_gpu_layers=draft_n_gpu_layers,
        rpc=target_rpc,
        draft_rpc=draft_endpoints,
        tensor_split=split,
        rpc_timeout=rpc_timeout,
    )


def _report_model(reason: str) -> None:
    err_console.print(reason, style="dim", markup=False, highlight=False)


def read_prompt(prompt: str | None, prompt_file: Path | None) -> str:
    """The prompt from the argument, --prompt-file, or piped stdin, in that order."""
    if prompt is not None and prompt_file is not None:
        raise SpecrunError("give the prompt either as an argument or with --prompt-file, not both")
    if prompt is not None:
        return prompt
    if prompt_file is not None:
        try:
            return prompt_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise SpecrunError(f"cannot read --prompt-file {prompt_file}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise SpecrunError(f"--prompt-file {prompt_file} is not UTF-8 text") from None
    if not sys.stdin.isatty():
        text = sys.stdin.read()
        if text:
            return text
    raise SpecrunError("no prompt: give PROMPT, --prompt-file PATH, or pipe text on stdin")
