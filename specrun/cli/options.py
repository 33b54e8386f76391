"""Option declarations shared by generate, chat and bench, and turning them into a session."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from specrun.default_model import embedded_model_path
from specrun.errors import SpecrunError
from specrun.sampling import SamplerSettings
from specrun.session import SessionConfig

Target = Annotated[
    Optional[str], typer.Option("--target", "-m", help="Target GGUF (default: the embedded Gemma 3 270M).")
]
Draft = Annotated[Optional[str], typer.Option("--draft", "-md", help="Draft GGUF with the target's vocabulary.")]
Lookup = Annotated[bool, typer.Option("--lookup", help="Draft by prompt lookup (n-grams copied from the context).")]
K = Annotated[int, typer.Option("--k", help="Tokens drafted per step.")]
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


def resolve_model_arg(spec: str | None) -> Path:
    """A model argument as a local GGUF path; no argument means the embedded default."""
    return embedded_model_path() if spec is None else Path(spec).expanduser()


def session_config(
    target: str | None,
    draft: str | None,
    lookup: bool,
    k: int,
    temp: float,
    top_k: int,
    top_p: float,
    min_p: float,
    seed: int | None,
    ctx_size: int,
    threads: int,
    n_gpu_layers: int,
    draft_n_gpu_layers: int,
) -> SessionConfig:
    sampler = SamplerSettings(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
    return SessionConfig(
        target=resolve_model_arg(target),
        draft=Path(draft).expanduser() if draft else None,
        lookup=lookup,
        k=k,
        sampler=sampler,
        n_ctx=ctx_size,
        threads=threads,
        n_gpu_layers=n_gpu_layers,
        draft_n_gpu_layers=draft_n_gpu_layers,
    )


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
