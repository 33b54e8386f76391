"""Model specs to what is known of them, without loading or downloading weights.

The file is the one `generate` would load, found by the hub's resolver (`locate_model`),
except that every file already on disk, the Hugging Face cache's included, is taken before
the hub is asked: a local path, an `ollama:` model or a stored file is read from disk;
otherwise a hub file is read by its header alone (range requests); offline, an alias's
profile is all there is. Each answer says which of these it came from.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from specrun.errors import SpecrunError
from specrun.headers.read import ModelFacts, read_local
from specrun.hub.embedded import DEFAULT_ALIAS, embedded_model_path
from specrun.hub.profiles import ModelProfile, load_profiles
from specrun.hub.resolve import HubLookupError, ModelLocation, locate_model

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


def locate(spec: str, offline: bool = False, for_draft: bool = False, profile_fallback: bool = False) -> Known:
    """What is known of a spec, local knowledge first.

    profile_fallback: when no header can be read (offline, or the hub failed), an alias
    or a profile's repository is answered from its profile instead of an error.
    """
    try:
        location = locate_model(spec, offline=offline, for_draft=for_draft, disk_first=True)
    except HubLookupError as exc:
        return profile_answer(spec, exc, exc.repo, exc.profile, offline, profile_fallback)
    profile = location.profile or profile_of_repo(location.repo)
    if location.files:
        facts = merge_split_parts([read_local(part) for part in location.files])
        return Known(spec, LOCAL_HEADER, facts, profile, location.path, location.store)
    try:
        facts = remote_facts(location)
    except SpecrunError as exc:
        return profile_answer(spec, exc, location.repo or "", profile, offline, profile_fallback)
    return Known(spec, REMOTE_HEADER, facts, profile)


def remote_facts(location: ModelLocation) -> ModelFacts:
    """The header of each hub file a location would download, read by range requests."""
    # huggingface_hub's HTTP client comes with it, slow to import (docs/benchmarks.md, "Small
    # costs behind the code"): paid only by headers read from the hub.
    from specrun.pair.remote import read_remote

    listing = location.listing
    assert listing is not None  # a location without files names its hub files
    return merge_split_parts(
        [read_remote(listing.repo, part.path, revision=listing.commit or None) for part in location.hub_files]
    )


def profile_answer(
    spec: str, error: SpecrunError, repo: str, profile: ModelProfile | None, offline: bool, fallback: bool
) -> Known:
    """The profile, when no header could be read and the caller takes one; else the error."""
    if not fallback:
        raise error
    profile = profile or profile_of_repo(repo)
    if profile is not None:
        return Known(spec, PROFILE, profile=profile, note=str(error))
    if offline:
        raise SpecrunError(nothing_known_message(spec, repo, load_profiles())) from None
    raise error


def profile_of_repo(repo: str | None) -> ModelProfile | None:
    """The profile whose repository a repo spec names (owner/repo[:QUANT] of an alias)."""
    if repo is None:
        return None
    for profile in load_profiles().values():
        if profile.repo.lower() == repo.lower():
            return profile
    return None


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
