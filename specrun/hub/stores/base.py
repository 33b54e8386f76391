"""What every store lists: one model file as the tool that keeps it names it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specrun.hub.profiles import ModelProfile
from specrun.hub.quants import pattern_regex

# Where a model lies, for messages: "... already on disk in LM Studio's models".
SOURCE_LABELS = {
    "hf": "the Hugging Face cache",
    "ollama": "Ollama's store",
    "lmstudio": "LM Studio's models",
    "llama.cpp": "llama.cpp's cache",
}


@dataclass(frozen=True)
class StoredModel:
    source: str  # a SOURCE_LABELS key
    name: str  # what the owning tool calls it: owner/repo, llama3.2:1b, publisher/repo/file.gguf
    path: Path | None  # the GGUF to load (first part of a split set); None when unusable
    size: int = 0
    quant: str | None = None
    repo: str | None = None  # owner/name on the hub, when the store records it
    file: str | None = None  # the file's path inside that repository, when known
    alias: str | None = None
    family: str | None = None
    parts: tuple[Path, ...] = ()
    complete: bool = True
    problem: str | None = None  # why specrun cannot load it

    @property
    def usable(self) -> bool:
        return self.path is not None and self.complete and self.problem is None

    @property
    def where(self) -> str:
        return SOURCE_LABELS[self.source]

    def as_json(self) -> dict:
        return {
            "source": self.source,
            "name": self.name,
            "alias": self.alias,
            "family": self.family,
            "repo": self.repo,
            "file": self.file,
            "quant": self.quant,
            "size": self.size,
            "path": str(self.path) if self.path else None,
            "parts": len(self.parts),
            "complete": self.complete,
            "usable": self.usable,
            "problem": self.problem,
        }


def alias_for(profiles: dict[str, ModelProfile], repo: str | None, path: str | None) -> str | None:
    """The profile alias of a repository's file; by repository alone when the file is unknown."""
    if repo is None:
        return None
    for profile in profiles.values():
        if profile.repo.lower() != repo.lower():
            continue
        if path is None or pattern_regex(profile.file_pattern).fullmatch(path):
            return profile.alias
    return None


def family_of(profiles: dict[str, ModelProfile], alias: str | None) -> str | None:
    return profiles[alias].family if alias in profiles else None
