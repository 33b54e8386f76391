"""Option declarations shared by generate, chat, bench and serve, and turning them into a session."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Callable, Optional, Sequence

import typer

from specrun.api import resolve
from specrun.backend import rpc
from specrun.cli.app import err_console
from specrun.config import SessionConfig
from specrun.core.sampling import SamplerSettings
from specrun.drafts import registry
from specrun.errors import SpecrunError
from specrun.files import decode_utf8, read_text
from specrun.settings import BATCH


def option_name(param: typer.CallbackParam) -> str:
    """The option as users write it: its longest spelling (--max-tokens, not -n)."""
    return max(param.opts, key=len) if param.opts else (param.name or "")  # (an option always has opts)


def checked_endpoints(param: typer.CallbackParam, value: str | None) -> str | None:
    rpc.parse_endpoints(value, option_name(param))  # syntax only: the servers are reached later
    return value


def checked_split(param: typer.CallbackParam, value: str | None) -> str | None:
    rpc.parse_tensor_split(value)
    return value


MODEL_FORMS = "alias[:QUANT], owner/repo[:QUANT], owner/repo/file.gguf, ollama:NAME[:TAG] or a path"
Target = Annotated[
    Optional[str],
    typer.Option("--target", "-m", help=f"Target model: {MODEL_FORMS} (default: the embedded Gemma 3 270M)."),
]
Draft = Annotated[
    Optional[str],
    typer.Option(
        "--draft",
        "-md",
        help=f"Draft model: {MODEL_FORMS}; one with another vocabulary drafts translated through text; mtp: the target's own MTP layers (default: none).",
    ),
]
DraftTranslation = Annotated[
    str,
    typer.Option(
        "--draft-translation",
        help="How a draft with another vocabulary reaches the target: 'text' (its text tokenized by the target) or 'tokens' (only tokens both vocabularies have, exact p/q sampling).",
    ),
]
Quant = Annotated[Optional[str], typer.Option("--quant", help="Target quant, e.g. Q4_K_M (default: the largest that fits).")]
DraftQuant = Annotated[
    Optional[str], typer.Option("--draft-quant", help="Draft quant (default: the largest 8-bit or smaller that fits).")
]
Offline = Annotated[bool, typer.Option("--offline", help="Use only models already in the cache; no network.")]
Lookup = Annotated[
    bool, typer.Option("--lookup", help="Draft by prompt lookup (n-grams copied from the context); with --draft: hybrid.")
]
Source = Annotated[
    Optional[list[str]],
    typer.Option(
        "--source",
        help=f"Also draft with a registered source, by name: {', '.join(registry.names())} (repeatable; asked after --lookup and the store, before --draft; default: none).",
    ),
]
K = Annotated[
    str,
    typer.Option(
        "--k", help="Most tokens drafted per step: a number, 'auto' (cost-aware), or 'llama.cpp' (draft-max 16, p-min 0.75)."
    ),
]
Temp = Annotated[float, typer.Option("--temp", help="Sampling temperature; 0 is greedy.")]
TopK = Annotated[int, typer.Option("--top-k", help="Top-k filter at temperature > 0 (0 disables).")]
TopNSigma = Annotated[
    float,
    typer.Option("--top-nsigma", help="Keep tokens whose logit is within N standard deviations of the top one (<= 0 disables)."),
]
Typical = Annotated[
    float, typer.Option("--typical", help="Locally typical sampling: keep the most typical tokens up to this mass (1 disables).")
]
TopP = Annotated[float, typer.Option("--top-p", help="Top-p filter at temperature > 0 (1 disables).")]
MinP = Annotated[float, typer.Option("--min-p", help="Min-p filter at temperature > 0 (0 disables).")]
RepeatPenalty = Annotated[
    float, typer.Option("--repeat-penalty", help="Divide the logits of recent tokens by this (1 disables; llama.cpp's rule).")
]
FrequencyPenalty = Annotated[
    float, typer.Option("--frequency-penalty", help="Lower a recent token's logit this much per time it occurs (0 disables).")
]
PresencePenalty = Annotated[
    float, typer.Option("--presence-penalty", help="Lower the logit of any token that occurs recently this much (0 disables).")
]
RepeatLastN = Annotated[
    int,
    typer.Option(
        "--repeat-last-n", help="How many of the last tokens, the prompt's included, the penalties look at (0 disables)."
    ),
]
LogitBias = Annotated[
    Optional[list[str]],
    typer.Option(
        "--logit-bias",
        "-l",
        metavar="TOKEN_ID(+/-)BIAS",
        help="Add BIAS to a token's logit, as llama.cpp's: 15043+1 raises token 15043, 15043-inf bans it (repeatable; default: none).",
    ),
]
XtcProbability = Annotated[
    float,
    typer.Option("--xtc-probability", help="How often XTC drops the likeliest tokens at or above --xtc-threshold (0 disables)."),
]
XtcThreshold = Annotated[
    float, typer.Option("--xtc-threshold", help="The probability a token needs for XTC to drop it (above 0.5 disables XTC).")
]
DynatempRange = Annotated[
    float,
    typer.Option(
        "--dynatemp-range", help="Dynamic temperature: each token's within --temp -/+ this, by its entropy (0 disables)."
    ),
]
DynatempExp = Annotated[float, typer.Option("--dynatemp-exp", help="Dynamic temperature's exponent on the normalized entropy.")]
IgnoreEos = Annotated[
    bool,
    typer.Option("--ignore-eos", help="Ban the end-of-generation tokens, so the text runs to --max-tokens (llama.cpp's option)."),
]
Seed = Annotated[Optional[int], typer.Option("--seed", help="Seed for reproducible sampling (default: a random seed).")]
MaxTokens = Annotated[int, typer.Option("--max-tokens", "-n", help="Most tokens to generate.")]
CtxSize = Annotated[int, typer.Option("--ctx-size", "-c", help="Context size in tokens for target and draft.")]
Threads = Annotated[int, typer.Option("--threads", "-t", help="CPU threads (0 = all cores).")]
UbatchSize = Annotated[
    int,
    typer.Option(
        "--ubatch-size",
        "-ub",
        help=f"Rows llama.cpp computes in one pass (0 = {BATCH}). On CPU, 6 or fewer make batched verification give the logits of one-token decoding, so greedy output equals plain decoding's, at a cost in speed (docs/benchmarks.md).",
    ),
]
GpuLayers = Annotated[int, typer.Option("--n-gpu-layers", "-ngl", help="Target layers to offload (-1 = all).")]
DraftGpuLayers = Annotated[int, typer.Option("--draft-n-gpu-layers", "-ngld", help="Draft layers to offload (-1 = all).")]
Rpc = Annotated[
    Optional[str],
    typer.Option(
        "--rpc",
        callback=checked_endpoints,
        help="llama.cpp rpc-servers that take the target's offloaded layers (-ngl): HOST:PORT[,HOST:PORT...] (default: none, the target stays on this machine).",
        rich_help_panel="RPC",
    ),
]
DraftRpc = Annotated[
    Optional[str],
    typer.Option(
        "--draft-rpc",
        callback=checked_endpoints,
        help="rpc-servers for the draft's layers too, HOST:PORT[,...] (default: the draft runs locally).",
        rich_help_panel="RPC",
    ),
]
TensorSplit = Annotated[
    Optional[str],
    typer.Option(
        "--tensor-split",
        "-ts",
        callback=checked_split,
        help="Share of the target's offloaded layers per device, RPC servers' first in --rpc order, then local GPUs, e.g. 3,1 (default: by free memory).",
        rich_help_panel="RPC",
    ),
]
RpcTimeout = Annotated[
    float,
    typer.Option(
        "--rpc-timeout",
        help="Seconds one decode may wait for the rpc-servers before specrun gives up with an error (0 = forever).",
        rich_help_panel="RPC",
    ),
]
StoreTokens = Annotated[
    int,
    typer.Option(
        "--store-tokens", help="Also draft from n-grams of earlier prompts and outputs, keeping up to N tokens (0 disables)."
    ),
]
ChatFormat = Annotated[
    Optional[str],
    typer.Option(
        "--chat-format",
        help="llama-cpp-python chat format (e.g. chatml, gemma, llama-3) or 'plain'; default: the model's template.",
    ),
]


def parse_logit_bias(given: Sequence[str]) -> dict[int, float]:
    """--logit-bias's values (llama.cpp's TOKEN_ID+BIAS or TOKEN_ID-BIAS) as the library's logit
    bias; a token given twice keeps its last bias, as a request's would."""
    bias = {}
    for value in given:
        match = re.fullmatch(r"\s*(\d+)\s*([+-])\s*(inf|\d+(?:\.\d*)?(?:e[+-]?\d+)?)\s*", value, re.IGNORECASE)
        if match is None:
            raise SpecrunError(
                f"--logit-bias takes TOKEN_ID+BIAS or TOKEN_ID-BIAS, such as 15043+1 or 15043-inf, but is {value!r}"
            )
        token, sign, amount = match.groups()
        bias[int(token)] = float(amount) * (-1 if sign == "-" else 1)
    return bias


@dataclass(frozen=True)
class ModelOptions:
    """The model, sampling and runtime options that generate, chat, bench and serve share,
    declared once: `model_options` gives them to a command, which receives them as `model`."""

    target: Target = None
    draft: Draft = None
    quant: Quant = None
    draft_quant: DraftQuant = None
    draft_translation: DraftTranslation = "text"
    source: Source = None
    offline: Offline = False
    temp: Temp = 0.0
    top_k: TopK = 40
    top_n_sigma: TopNSigma = -1.0
    typical: Typical = 1.0
    top_p: TopP = 0.95
    min_p: MinP = 0.05
    repeat_penalty: RepeatPenalty = 1.0
    frequency_penalty: FrequencyPenalty = 0.0
    presence_penalty: PresencePenalty = 0.0
    repeat_last_n: RepeatLastN = 64
    logit_bias: LogitBias = None
    ignore_eos: IgnoreEos = False
    xtc_probability: XtcProbability = 0.0
    xtc_threshold: XtcThreshold = 0.1
    dynatemp_range: DynatempRange = 0.0
    dynatemp_exp: DynatempExp = 1.0
    seed: Seed = None
    ctx_size: CtxSize = 4096
    threads: Threads = 0
    ubatch_size: UbatchSize = 0
    n_gpu_layers: GpuLayers = -1
    draft_n_gpu_layers: DraftGpuLayers = -1
    rpc: Rpc = None
    draft_rpc: DraftRpc = None
    tensor_split: TensorSplit = None
    rpc_timeout: RpcTimeout = 300.0

    def __post_init__(self) -> None:
        # The library checks each setting; asking it here fails before any prompt is read or model resolved.
        self.sampler()
        registry.check_names(self.source or ())
        SessionConfig.check_settings({**self._llama_settings(), "translation": self.draft_translation})

    def sampler(self) -> SamplerSettings:
        return SamplerSettings(
            temperature=self.temp,
            top_k=self.top_k,
            top_n_sigma=self.top_n_sigma,
            typical_p=self.typical,
            top_p=self.top_p,
            min_p=self.min_p,
            seed=self.seed,
            repeat_penalty=self.repeat_penalty,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
            repeat_last_n=self.repeat_last_n,
            logit_bias=parse_logit_bias(self.logit_bias or ()),
            ignore_eos=self.ignore_eos,
            xtc_probability=self.xtc_probability,
            xtc_threshold=self.xtc_threshold,
            dynatemp_range=self.dynatemp_range,
            dynatemp_exponent=self.dynatemp_exp,
        )

    def _llama_settings(self) -> dict:
        return dict(
            n_ctx=self.ctx_size,
            threads=self.threads,
            n_gpu_layers=self.n_gpu_layers,
            draft_n_gpu_layers=self.draft_n_gpu_layers,
            rpc_timeout=self.rpc_timeout,
            n_ubatch=self.ubatch_size,
        )

    def session_config(
        self, lookup: bool = False, k: str = "auto", store_tokens: int = 0, use_draft: bool = True, sources: tuple[str, ...] = ()
    ) -> SessionConfig:
        """`use_draft` False leaves --draft and --draft-rpc out (bench methods that need none);
        `sources`: registered sources the command asks for besides --source's."""
        draft, draft_rpc = (self.draft, self.draft_rpc) if use_draft else (None, None)
        draft_endpoints = rpc.parse_endpoints(draft_rpc, "--draft-rpc")
        if draft_endpoints and draft is None:
            raise SpecrunError("--draft-rpc places a draft model's layers: give --draft too, or drop --draft-rpc")
        # Paths, aliases and hub repos all go through the library's one resolver; it says which file and why.
        return resolve(
            self.target,
            draft,
            quant=self.quant,
            draft_quant=self.draft_quant,
            offline=self.offline,
            on_resolve=_report_model,
            lookup=lookup,
            k=k,
            sampler=self.sampler(),
            rpc=rpc.parse_endpoints(self.rpc, "--rpc"),
            draft_rpc=draft_endpoints,
            tensor_split=rpc.parse_tensor_split(self.tensor_split),
            store_tokens=store_tokens,
            sources=tuple(dict.fromkeys([*(self.source or ()), *sources])),
            translation=self.draft_translation,
            **self._llama_settings(),
        )


_OPTION_TYPES = typing.get_type_hints(ModelOptions, include_extras=True)  # the Annotated[..., typer.Option] above
_SHARED = [
    inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=_OPTION_TYPES[f.name])
    for f in dataclasses.fields(ModelOptions)
]


def model_options(command: Callable) -> Callable:
    """Add ModelOptions' options to a Typer command after its own, passed to it as `model`."""
    own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != "model"]

    @functools.wraps(command)
    def run(**values):
        shared = {p.name: values.pop(p.name) for p in _SHARED}
        return command(model=ModelOptions(**shared), **values)

    signature = inspect.Signature(own + _SHARED)
    # What Typer reads, through inspect.signature(); typeshed gives functions no __signature__ attribute.
    run.__signature__ = signature  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
    return run


def _report_model(reason: str) -> None:
    err_console.print(reason, style="dim", markup=False, highlight=False)


def read_prompt(prompt: str | None, prompt_file: Path | None) -> str:
    """The prompt from the argument, --prompt-file, or piped stdin, in that order; never empty."""
    if prompt is not None and prompt_file is not None:
        raise SpecrunError("give the prompt either as an argument or with --prompt-file, not both")
    if prompt is not None:
        text, where = prompt, "PROMPT"
    elif prompt_file is not None:
        text, where = read_text(prompt_file, "--prompt-file"), f"--prompt-file {prompt_file}"
    elif not sys.stdin.isatty():
        text, where = _read_stdin(), "standard input"
    else:
        raise SpecrunError("no prompt: give PROMPT, --prompt-file PATH, or pipe text on stdin")
    if not text.strip():
        raise SpecrunError(f"no prompt: {where} is empty; give some text to continue")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes from the command line arrive as surrogates
        raise SpecrunError(f"{where} is not UTF-8 text") from None
    return text


def _read_stdin() -> str:
    stream = getattr(sys.stdin, "buffer", None)
    return decode_utf8(stream.read(), "standard input") if stream is not None else sys.stdin.read()
