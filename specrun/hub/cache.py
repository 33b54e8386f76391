"""What a Hugging Face cache holds, as models: alias, repo, quant, size, path.

Used for the hub's own cache and for llama.cpp's LLAMA_CACHE, which has the same layout.
"""

from __future__ import annotations

from pathlib import Path

from huggingface_hub import scan_cache_dir
from huggingface_hub.errors import CacheNotFound

from specrun.hub.download import hub_cache_dir
from specrun.hub.profiles import ModelProfile
from specrun.hub.quants import RepoFile, missing_parts, quant_sets
from specrun.hub.stores.base import StoredModel, alias_for, family_of


def cached_models(profiles: dict[str, ModelProfile], cache_dir: Path | None = None, source: str = "hf") -> list[StoredModel]:
    try:
        cache = scan_cache_dir(cache_dir or hub_cache_dir())
    except CacheNotFound:
        return []
    found: dict[tuple[str, str], StoredModel] = {}
    for repo in cache.repos:
        if repo.repo_type != "model":
            continue
        # Newest revision first, so an older snapshot of the same file is not listed twice.
        for revision in sorted(repo.revisions, key=lambda r: r.last_modified, reverse=True):
            files = {f.file_path.relative_to(revision.snapshot_path).as_posix(): f for f in revision.files}
            listing = [RepoFile(name, info.size_on_disk) for name, info in files.items()]
            for quant, parts in quant_sets(listing).items():
                key = (repo.repo_id, parts[0].path)
                if key in found:
                    continue
                alias = alias_for(profiles, repo.repo_id, parts[0].path)
                found[key] = StoredModel(
                    source=source,
                    name=repo.repo_id,
                    path=files[parts[0].path].file_path,
                    size=sum(p.size for p in parts),
                    quant=quant,
                    repo=repo.repo_id,
                    file=parts[0].path,
                    alias=alias,
                    family=family_of(profiles, alias),
                    parts=tuple(files[p.path].file_path for p in parts),
                    complete=not missing_parts(parts),
                )
    return sorted(found.values(), key=lambda m: (m.name.lower(), m.size))
