"""LM Studio's models folder, read-only: <publisher>/<repo>/<file>.gguf.

The folder is <home>/models unless moved in LM Studio's settings (downloadsFolder). Its
home is the folder ~/.lmstudio-home-pointer names, else ~/.cache/lm-studio (releases
before 0.3) when it exists, else ~/.lmstudio. LM Studio reads no environment variable
for it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from specrun.hub.profiles import ModelProfile
from specrun.hub.quants import RepoFile, gguf_sets, missing_parts, quant_of
from specrun.hub.spec import has_gguf_magic
from specrun.hub.stores.base import StoredModel, alias_for, family_of


def default_root() -> Path:
    home = lmstudio_home()
    try:
        moved = json.loads((home / "settings.json").read_text(encoding="utf-8")).get("downloadsFolder")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        moved = None
    return Path(moved).expanduser() if isinstance(moved, str) and moved.strip() else home / "models"


def lmstudio_home() -> Path:
    user = Path.home()
    try:
        pointed = (user / ".lmstudio-home-pointer").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        pointed = ""
    if pointed:
        return Path(pointed).expanduser()
    legacy = user / ".cache" / "lm-studio"
    return legacy if legacy.is_dir() else user / ".lmstudio"


class LMStudioStore:
    source = "lmstudio"

    def __init__(self, root: Path) -> None:
        self.root = root

    def models(self, profiles: dict[str, ModelProfile]) -> list[StoredModel]:
        found = []
        for repo_dir in sorted(self.root.glob("*/*")):
            if repo_dir.is_dir() and not any(part.startswith(".") for part in repo_dir.relative_to(self.root).parts):
                found += self._repo_models(repo_dir, profiles)
        return found

    def _repo_models(self, repo_dir: Path, profiles: dict[str, ModelProfile]) -> list[StoredModel]:
        repo = repo_dir.relative_to(self.root).as_posix()
        files = []
        for folder, dirs, names in os.walk(repo_dir):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            for name in names:
                path = Path(folder) / name
                if name.lower().endswith(".gguf") and path.is_file():
                    files.append(RepoFile(path.relative_to(repo_dir).as_posix(), path.stat().st_size))
        models = []
        for parts in gguf_sets(files).values():
            first = repo_dir / parts[0].path
            alias = alias_for(profiles, repo, parts[0].path)
            models.append(
                StoredModel(
                    self.source,
                    f"{repo}/{parts[0].path}",
                    first,
                    size=sum(p.size for p in parts),
                    quant=quant_of(parts[0].path),
                    repo=repo,
                    file=parts[0].path,
                    alias=alias,
                    family=family_of(profiles, alias),
                    parts=tuple(repo_dir / p.path for p in parts),
                    complete=not missing_parts(parts),
                    problem=None if has_gguf_magic(first) else f"{first} is not a GGUF file",
                )
            )
        return models
