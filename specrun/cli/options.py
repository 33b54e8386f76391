"""Option declarations shared by generate, chat and bench, and turning them into a session."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

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
StoreTokens = Annotated[
    int, typer.Option("--store-tokens", help="Also draft from n-grams of earlier prompts and outputs, keeping up to N tokens (0 disables).")
]
ChatFormat = Annotated[
    Optional[str],
    typer.Option("--chat-format", help="llama-cpp-python chat format (e.g. chatml, gemma, llama-3) or 'plain'; default: the model's template."),
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
) -> SessionConfig:
    sampler = SamplerSettings(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
    # Paths, aliases and hub repos all go through the one resolver; it says which file and why.
    target_model, draft_model = resolve_pair(
        target, draft, quant=quant, draft_quant=draft_quant, offline=offline, report=_report_model
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
