"""Model specs to what is known of them, without loading or downloading weights.

In order: a local path, an `ollama:` model or a file already in a store (the Hugging Face
cache, Ollama, LM Studio, llama.cpp) is read from disk; otherwise a hub file is read by
its header alone (range requests); offline, an alias's profile is all there is. Each
answer says which of these it came from.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from specrun.default_model import DEFAULT_ALIAS, embedded_model_path
from specrun.errors import SpecrunError
from specrun.pair.header import ModelFacts, read_local

if TYPE_CHECKING:
    from specrun.hub.profiles import ModelProfile
    from specrun.hub.spec import ModelSpec

LOCAL_HEADER = "local header"
REMOTE_HEADER = "remote header"
PROFILE = "profile"


@dataclass(frozen=True)
class Known:
    """One model as far as it is known without loading it, and where that came from."""

    spec: str
    evidence: str  # LOCAL_HEADER, REMOTE_HEADER or PROFILE
    facts: ModelFacts | None = None  # None when only the profile is known
    profile: ModelProfile | None = None
    path: Path | None = None  # the file on disk, when there is one
    store: str | None = None  # the store holding it: "hf", "ollama", "lmstudio", "llama.cpp"
    note: str = ""  # why no header was read, when the profile is all there is


def load_facts(spec: str, offline: bool = False, for_draft: bool = False) -> ModelFacts:
    """Header facts of the file a spec names: from disk when it is there, else from the hub."""
    facts = locate(spec, offline, for_draft).facts
    assert facts is not None  # without profile_fallback, locate reads a header or raises
    return facts


def locate(spec: str, offline: bool = False, for_draft: bool = False,
           profile_fallback: bool = False) -> Known:
    """What is known of a spec, local knowledge first.

    profile_fallback: when no header can be read (offline, or the hub failed), an alias
    or a profile's repository is answered from its profile instead of an error.
    """
    from specrun.hub.profiles import load_profiles
    from specrun.hub.spec import local_model_path, ollama_name, parse_spec

    local = local_model_path(spec)
    if local is not None:
        return Known(spec, LOCAL_HEADER, read_local(local), path=local)
    profiles = load_profiles()
    name = ollama_name(spec)
    if name is not None:
        from specrun.hub.stores import ollama_model

        model = ollama_model(name, profiles)
        assert model.path is not None  # ollama_model refuses unusable models
        return Known(spec, LOCAL_HEADER, read_local(model.path), profiles.get(model.alias or ""),
                     model.path, model.source)
    if spec == DEFAULT_ALIAS:
        path = embedded_model_path()
        return Known(spec, LOCAL_HEADER, read_local(path), profiles.get(DEFAULT_ALIAS), path)
    parsed = parse_spec(spec, profiles)
    profile = profiles.get(parsed.alias) if parsed.alias else profile_of_repo(parsed.repo, profiles)
    stored = stored_file(parsed, profiles, for_draft)
    if stored is not None:
        return replace(stored, spec=spec, profile=profile)
    try:
        return replace(hub_facts(parsed, profiles, offline, for_draft), spec=spec, profile=profile)
    except SpecrunError as exc:
        if not profile_fallback:
            raise
        if profile is not None:
            return Known(spec, PROFILE, profile=profile, note=str(exc))
        if offline:
            raise SpecrunError(nothing_known_message(spec, parsed.repo or "", profiles)) from None
        raise


def profile_of_repo(repo: str | None, profiles: dict[str, ModelProfile]) -> ModelProfile | None:
    """The profile whose repository a repo spec names (owner/repo[:QUANT] of an alias)."""
    for profile in profiles.values():
        if repo is not None and profile.repo.lower() == repo.lower():
            return profile
    return None


def stored_file(parsed: ModelSpec, profiles: dict[str, ModelProfile], for_draft: bool) -> Known | None:
    """The file `generate` would pick among those already on disk, read from there."""
    from specrun.hub.quants import NEVER_AUTO, NEVER_AUTO_FOR_DRAFT
    from specrun.hub.resolve import stored_choice

    excluded = NEVER_AUTO_FOR_DRAFT if for_draft else NEVER_AUTO
    chosen = stored_choice(parsed, profiles, parsed.quant, None, 0, excluded, include_hf=True)
    if chosen is None:
        return None
    facts = merge_split_parts([read_local(part) for part in chosen.files])
    return Known(parsed.text, LOCAL_HEADER, facts, path=chosen.path, store=chosen.store)


def hub_facts(parsed: ModelSpec, profiles: dict[str, ModelProfile], offline: bool, for_draft: bool) -> Known:
    """The header of the file `generate` would download: from the cache when it is there."""
    from specrun.hub import download
    from specrun.hub.quants import NEVER_AUTO, NEVER_AUTO_FOR_DRAFT
    from specrun.hub.resolve import choose_file, repo_listing

    profile = profiles.get(parsed.alias) if parsed.alias else None
    repo = profile.repo if profile else parsed.repo
    assert repo is not None  # parse_spec gives an alias or a repo
    listing = repo_listing(repo, offline or download.offline_mode(), parsed.text, parsed.filename)
    excluded = NEVER_AUTO_FOR_DRAFT if for_draft else NEVER_AUTO
    choice = choose_file(listing, parsed, profile, parsed.quant, None, 0, excluded).quant_choice
    if not listing.cached:
        from specrun.pair.remote import read_remote

        parts = [read_remote(listing.repo, p.path, revision=listing.commit or None) for p in choice.parts]
        return Known(parsed.text, REMOTE_HEADER, merge_split_parts(parts))
    paths = []
    for part in choice.parts:
        path = download.cached_path(listing.repo, listing.commit, part.path)
        if path is None:
            raise SpecrunError(f"{parsed.text}: {part.path} vanished from the cache: run `specrun pull {parsed.text}`")
        paths.append(path)
    facts = merge_split_parts([read_local(path) for path in paths])
    return Known(parsed.text, LOCAL_HEADER, facts, path=paths[0], store="hf")


def nothing_known_message(spec: str, repo: str, profiles: dict[str, ModelProfile]) -> str:
    families = ", ".join(sorted({p.family for p in profiles.values()}))
    return (
        f"{spec}: nothing is known of it offline: no profile names {repo}, and no file of it is in "
        f"the Hugging Face cache, Ollama, LM Studio or llama.cpp; profiles know the families {families} "
        f"(`specrun models --aliases`); run without --offline to read its header from the hub"
    )


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
