"""llama.cpp's `-hf` downloads, read-only.

Current llama.cpp keeps them in the Hugging Face cache layout: in the hub's own cache
(listed as that) or, with LLAMA_CACHE set, under that folder in the same layout. Older
releases wrote one flat folder (LLAMA_CACHE, else ~/.cache/llama.cpp; ~/Library/Caches/
llama.cpp on macOS, %LOCALAPPDATA%\\llama.cpp on Windows): each file as
<owner>_<repo>_<path in the repo, / as _>, beside manifest=<owner>=<repo>=<tag>.json, the
hub's answer for `-hf owner/repo:tag`, whose ggufFile.rfilename names the file it chose.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from specrun.errors import SpecrunError
from specrun.hub.containment import check_name, inside
from specrun.hub.profiles import ModelProfile
from specrun.hub.quants import RepoFile, gguf_sets, missing_parts, quant_of
from specrun.hub.spec import has_gguf_magic, is_repo_id
from specrun.hub.stores.base import StoredModel, alias_for, family_of

MANIFEST_PREFIX = "manifest="


def default_root() -> Path:
    configured = os.environ.get("LLAMA_CACHE")
    if configured:
        return Path(configured).expanduser()
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "llama.cpp"
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local") / "llama.cpp"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llama.cpp"


class LlamaCppStore:
    source = "llama.cpp"

    def __init__(self, root: Path) -> None:
        self.root = root

    def models(self, profiles: dict[str, ModelProfile]) -> list[StoredModel]:
        if not self.root.is_dir():
            return []
        found = []
        if any(self.root.glob("models--*")):
            from specrun.hub.cache import cached_models  # huggingface_hub's scanner: slow to import, as in stored_models

            found += cached_models(profiles, self.root, source=self.source)
        return found + self._flat_models(profiles)

    def _flat_models(self, profiles: dict[str, ModelProfile]) -> list[StoredModel]:
        files = [
            RepoFile(p.name, p.stat().st_size)
            for p in sorted(self.root.iterdir())
            if p.name.lower().endswith(".gguf") and p.is_file()
        ]
        chosen = self._manifest_choices()
        models = []
        for parts in gguf_sets(files).values():
            first = self.root / parts[0].path
            repo, file, tag = chosen.get(parts[0].path, (None, None, None))
            alias = alias_for(profiles, repo, file)
            models.append(
                StoredModel(
                    self.source,
                    f"{repo}:{tag}" if repo else parts[0].path,
                    first,
                    size=sum(p.size for p in parts),
                    quant=quant_of(file or parts[0].path),
                    repo=repo,
                    file=file,
                    alias=alias,
                    family=family_of(profiles, alias),
                    parts=tuple(self.root / p.path for p in parts),
                    complete=not missing_parts(parts),
                    problem=None if has_gguf_magic(first) else f"{first} is not a GGUF file",
                )
            )
        return models

    def _manifest_choices(self) -> dict[str, tuple[str, str, str]]:
        """Local file name -> (repo, file in the repo, tag) from each readable manifest."""
        chosen = {}
        for manifest in sorted(self.root.glob(f"{MANIFEST_PREFIX}*.json")):
            fields = manifest.name[: -len(".json")].split("=")
            if len(fields) != 4 or not is_repo_id(f"{fields[1]}/{fields[2]}"):
                continue
            repo, tag = f"{fields[1]}/{fields[2]}", fields[3]
            try:
                file = json.loads(manifest.read_text(encoding="utf-8"))["ggufFile"]["rfilename"]
                check_name(file, f"{manifest}: ggufFile")
                local = inside(self.root, f"{repo}_{file}".replace("/", "_"), f"{manifest}: ggufFile")
            except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, SpecrunError):
                continue  # its file, if any, is still listed by name
            chosen[local.name] = (repo, file, tag)
        return chosen
