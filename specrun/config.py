"""What a `Session` loads and how it drafts, samples and runs (`SessionConfig`), each setting
checked by the library's rules when the config is made."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from specrun.core.sampling import SamplerSettings
from specrun.drafts.translated import TRANSLATIONS, Mode
from specrun.errors import SpecrunError
from specrun.settings import SettingError, check, parse_k

CHECKED_FIELDS = ("n_ctx", "threads", "n_ubatch", "n_gpu_layers", "draft_n_gpu_layers", "rpc_timeout", "store_tokens", "parallel")
MIN_SLOT_CTX = 256  # the fewest tokens a stream's share of the context may hold


@dataclass(frozen=True)
class SessionConfig:
    """Which models a `Session` loads and how it drafts, samples and runs them.

    `target` and `draft` are GGUF files; `specrun.load` resolves aliases, hub repos and
    `ollama:` names to them.
    """

    target: Path
    draft: Path | None = None  # a draft GGUF; None with lookup=False means plain only
    lookup: bool = False  # prompt-lookup drafting; with a draft too, hybrid (lookup first)
    k: int | str = "auto"  # tokens drafted per step, "auto" (cost-aware) or "llama.cpp" (p-min rule)
    sampler: SamplerSettings = field(default_factory=SamplerSettings)
    draft_sampling: bool = True  # at temperature > 0, sample drafts and verify with p/q
    translation: Mode = "text"  # a draft with another vocabulary: its text re-encoded for the target, or "tokens" (TLI)
    lookup_ngram: tuple[int, int] = (2, 4)  # n-gram sizes prompt lookup matches, longest first
    store_tokens: int = 0  # > 0: also draft from up to this many tokens of earlier prompts and outputs
    sources: tuple[str, ...] = ()  # further draft sources by registered name (specrun.drafts.registry), after lookup and store
    n_ctx: int = 4096  # context size in tokens, for target and draft alike, split evenly between the streams
    parallel: int = 1  # streams run at once (generate_many, serve's slots), each on its own sequence
    threads: int = 0  # 0 = all cores
    n_gpu_layers: int = -1  # target layers offloaded to GPUs or RPC servers; -1 = all, 0 = none
    draft_n_gpu_layers: int = -1  # the draft's
    flash_attn: int = -1  # -1 auto, 0 off, 1 on
    repack: bool = False  # CPU weight repacking: off keeps batched verification closest to one-token decoding
    n_ubatch: int = 0  # rows llama.cpp computes at once (0: all BATCH); 6 makes CPU verification bit-exact, at a cost
    rpc: tuple[str, ...] = ()  # HOST:PORT of llama.cpp rpc-servers for the target's layers
    draft_rpc: tuple[str, ...] = ()  # the draft's; empty keeps the draft local
    tensor_split: tuple[float, ...] = ()  # the target's layers per device, RPC devices first
    rpc_timeout: float = 300.0  # seconds a decode may wait for the RPC servers before giving up

    def __post_init__(self) -> None:
        # Paths given as strings are paths all the same.
        object.__setattr__(self, "target", Path(self.target))
        if self.draft is not None:
            object.__setattr__(self, "draft", Path(self.draft))
        for name in ("rpc", "draft_rpc", "tensor_split", "sources"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "k", parse_k(self.k))  # "4" from a command line is the draft length 4
        self.check_settings({f.name: getattr(self, f.name) for f in fields(self) if f.name != "k"})

    @staticmethod
    def check_settings(options: dict[str, Any]) -> None:
        """Check the settings among `options` (SessionConfig's field names) before anything is
        resolved or loaded: a SettingError names the first one that is out of range."""
        if "k" in options:
            parse_k(options["k"])
        if options.get("translation", "text") not in TRANSLATIONS:
            raise SettingError("translation", "'text' or 'tokens'", options["translation"])
        check(**{name: options[name] for name in CHECKED_FIELDS if name in options})
        parallel, n_ctx = options.get("parallel", 1), options.get("n_ctx", SessionConfig.n_ctx)
        if parallel > 1 and n_ctx // parallel < MIN_SLOT_CTX:
            raise SpecrunError(
                f"--parallel {parallel} gives each stream {n_ctx // parallel} tokens of context, "
                f"fewer than the {MIN_SLOT_CTX} a stream needs: raise --ctx-size"
            )
