"""Models already on disk: the Hugging Face cache and other tools' stores, read-only.

Each store's layout is known by its own module (ollama, lmstudio, llamacpp; the hub's
cache by specrun.hub.cache). Nothing here writes into a store: files are listed, their
headers read, and they are loaded where they lie.
"""

from __future__ import annotations

from pathlib import Path

from specrun.hub.profiles import ModelProfile
from specrun.hub.quants import pattern_regex
from specrun.hub.stores import llamacpp, lmstudio, ollama
from specrun.hub.stores.base import SOURCE_LABELS, StoredModel

__all__ = ["SOURCE_LABELS", "StoredModel", "foreign_stores", "matching", "ollama_model", "store_roots", "stored_models"]


def foreign_stores() -> list[ollama.OllamaStore | lmstudio.LMStudioStore | llamacpp.LlamaCppStore]:
    """The stores of Ollama, LM Studio and llama.cpp at their current places."""
    return [
        ollama.OllamaStore(ollama.default_root()),
        lmstudio.LMStudioStore(lmstudio.default_root()),
        llamacpp.LlamaCppStore(llamacpp.default_root()),
    ]


def store_roots() -> dict[str, Path]:
    # Lazy like the cache below: specrun.hub.download brings huggingface_hub, slow to import
    # (docs/benchmarks.md, "Small costs behind the code").
    from specrun.hub.download import hub_cache_dir

    return {"hf": hub_cache_dir(), **{store.source: store.root for store in foreign_stores()}}


def stored_models(profiles: dict[str, ModelProfile], include_hf: bool = True) -> list[StoredModel]:
    """Every model file the stores hold, usable or with the reason it is not."""
    found = []
    if include_hf:
        # huggingface_hub's cache scanner is slow to import (docs/benchmarks.md, "Small costs
        # behind the code"): kept off the start of commands that never list the cache.
        from specrun.hub.cache import cached_models

        found += cached_models(profiles)
    for store in foreign_stores():
        found += store.models(profiles)
    return found


def ollama_model(name: str, profiles: dict[str, ModelProfile]) -> StoredModel:
    """The model an `ollama:NAME[:TAG]` spec names; one line saying why when it cannot be used."""
    return ollama.OllamaStore(ollama.default_root()).find(name, profiles)


def matching(
    models: list[StoredModel], repo: str, filename: str | None = None, file_pattern: str | None = None
) -> list[StoredModel]:
    """Usable models of `repo`: the named file, or the files a profile's pattern matches.

    A store that does not record the file name (Ollama's hf.co models) matches by
    repository alone.
    """
    regex = pattern_regex(file_pattern)
    found = []
    for model in models:
        if not model.usable or model.repo is None or model.repo.lower() != repo.lower():
            continue
        if filename is not None and model.file != filename:
            continue
        if filename is None and model.file is not None and not regex.fullmatch(model.file):
            continue
        found.append(model)
    return found
