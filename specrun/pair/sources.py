"""Model specs to header facts without loading or downloading weights.

Local files and the embedded default are read from disk. Aliases and hub repositories
go through the hub package's spec parsing and quant choice (the file `generate` would
use); a cached copy is read from disk, anything else by its header alone (range requests).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from specrun.default_model import DEFAULT_ALIAS, embedded_model_path
from specrun.errors import SpecrunError
from specrun.pair.header import ModelFacts, read_local


def load_facts(spec: str, offline: bool = False, for_draft: bool = False) -> ModelFacts:
    from specrun.hub.spec import local_model_path

    local = local_model_path(spec)
    if local is not None:
        return read_local(local)
    if spec == DEFAULT_ALIAS:
        return read_local(embedded_model_path())
    return hub_facts(spec, offline, for_draft)


def hub_facts(spec: str, offline: bool, for_draft: bool) -> ModelFacts:
    from specrun.hub import download
    from specrun.hub.profiles import load_profiles
    from specrun.hub.quants import NEVER_AUTO, NEVER_AUTO_FOR_DRAFT
    from specrun.hub.resolve import choose_file, repo_listing
    from specrun.hub.spec import parse_spec

    profiles = load_profiles()
    parsed = parse_spec(spec, profiles)
    profile = profiles.get(parsed.alias) if parsed.alias else None
    repo = profile.repo if profile else parsed.repo
    assert repo is not None  # parse_spec gives an alias or a repo
    listing = repo_listing(repo, offline or download.offline_mode(), spec, parsed.filename)
    excluded = NEVER_AUTO_FOR_DRAFT if for_draft else NEVER_AUTO
    choice = choose_file(listing, parsed, profile, parsed.quant, None, 0, excluded).quant_choice
    parts = [part_facts(listing, part.path, spec) for part in choice.parts]
    return merge_split_parts(parts)


def part_facts(listing, filename: str, spec: str) -> ModelFacts:
    from specrun.hub import download
    from specrun.pair.remote import read_remote

    if listing.cached:
        path = download.cached_path(listing.repo, listing.commit, filename)
        if path is None:
            raise SpecrunError(f"{spec}: {filename} vanished from the cache: run `specrun pull {spec}`")
        return read_local(path)
    return read_remote(listing.repo, filename, revision=listing.commit or None)


def merge_split_parts(parts: list[ModelFacts]) -> ModelFacts:
    """A split GGUF: metadata from part 1, tensors and bytes from every part."""
    first = parts[0]
    if len(parts) == 1:
        return first
    tensors = tuple(t for part in parts for t in part.tensors)
    return replace(first, tensors=tensors, file_size=sum(p.file_size for p in parts))


def local_path(spec: str) -> Path:
    """A spec that must be a local GGUF (derive reads every tensor)."""
    if spec == DEFAULT_ALIAS:
        return embedded_model_path()
    path = Path(spec).expanduser()
    if not path.is_file():
        raise SpecrunError(f"no such model file: {spec} (derive needs a local .gguf)")
    return path
