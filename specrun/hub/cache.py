"""What the Hugging Face cache holds, as models: alias, repo, quant, size, path."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from huggingface_hub import scan_cache_dir
from huggingface_hub.errors import CacheNotFound

from specrun.hub.download import hub_cache_dir
from specrun.hub.profiles import ModelProfile
from specrun.hub.quants import RepoFile, missing_parts, pattern_regex, quant_sets


@dataclass(frozen=True)
class CachedModel:
    alias: str | None
    repo: str
    quant: str
    size: int
    path: Path  # first part of a split set
    parts: int
    complete: bool

    def as_json(self) -> dict:
        return {**asdict(self), "path": str(self.path)}


def cached_models(profiles: dict[str, ModelProfile]) -> list[CachedModel]:
    try:
        cache = scan_cache_dir(hub_cache_dir())
    except CacheNotFound:
        return []
    found: dict[tuple[str, str], CachedModel] = {}
    for repo in cache.repos:
        if repo.repo_type != "model":
            continue
        # Newest revision first, so an older snapshot of the same file is not listed twice.
        for revision in sorted(repo.revisions, key=lambda r: r.last_modified, reverse=True):
            files = {f.file_path.relative_to(revision.snapshot_path).as_posix(): f for f in revision.files}
            listing = [RepoFile(name, info.size_on_disk) for name, info in files.items()]
            for quant, parts in quant_sets(listing).items():
                key = (repo.repo_id, parts[0].path)
                if key not in found:
                    found[key] = CachedModel(
                        alias=alias_for(profiles, repo.repo_id, parts[0].path),
                        repo=repo.repo_id,
                        quant=quant,
                        size=sum(p.size for p in parts),
                        path=files[parts[0].path].file_path,
                        parts=len(parts),
                        complete=not missing_parts(parts),
                    )
    return sorted(found.values(), key=lambda m: (m.repo.lower(), m.size))


def alias_for(profiles: dict[str, ModelProfile], repo: str, path: str) -> str | None:
    for profile in profiles.values():
        if profile.repo.lower() == repo.lower() and pattern_regex(profile.file_pattern).fullmatch(path):
            return profile.alias
    return None
