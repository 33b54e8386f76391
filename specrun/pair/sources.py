"""Model specs to header facts: local files, the embedded default, hub files (header only)."""

from __future__ import annotations

from pathlib import Path

from specrun.default_model import DEFAULT_ALIAS, embedded_model_path
from specrun.errors import SpecrunError
from specrun.pair.header import ModelFacts, read_local


def load_facts(spec: str, offline: bool = False) -> ModelFacts:
    """Header facts for a model spec without loading (or downloading) its weights."""
    path = Path(spec).expanduser()
    if path.is_file():
        return read_local(path)
    if spec == DEFAULT_ALIAS:
        return read_local(embedded_model_path())
    hub_file = split_hub_file(spec)
    if hub_file is not None and not path.parent.is_dir():  # a local folder wins
        return hub_file_facts(*hub_file, offline=offline)
    if path.suffix.lower() == ".gguf" or path.parent != Path("."):
        raise SpecrunError(f"no such model file: {spec}")
    raise SpecrunError(f"{spec}: not a file; give a local .gguf path, {DEFAULT_ALIAS}, "
                       "or a hub file as owner/repo/file.gguf")


def split_hub_file(spec: str) -> tuple[str, str] | None:
    """owner/repo/path/in/repo.gguf -> ('owner/repo', 'path/in/repo.gguf')."""
    parts = spec.split("/")
    if len(parts) < 3 or not all(parts) or not spec.lower().endswith(".gguf"):
        return None
    if spec.startswith((".", "~")):
        return None
    return "/".join(parts[:2]), "/".join(parts[2:])


def hub_file_facts(repo_id: str, filename: str, offline: bool = False) -> ModelFacts:
    """A cached copy when there is one; else only the header, by HTTP range requests."""
    from huggingface_hub import constants, try_to_load_from_cache

    cached = try_to_load_from_cache(repo_id, filename)
    if isinstance(cached, str):
        return read_local(cached)
    if offline or constants.HF_HUB_OFFLINE:
        raise SpecrunError(f"{repo_id}/{filename} is not in the Hugging Face cache and "
                           "offline mode is on: connect, or pass a local path")
    from specrun.pair.remote import read_remote

    return read_remote(repo_id, filename)


def local_path(spec: str) -> Path:
    """A spec that must be a local GGUF (derive reads every tensor)."""
    if spec == DEFAULT_ALIAS:
        return embedded_model_path()
    path = Path(spec).expanduser()
    if not path.is_file():
        raise SpecrunError(f"no such model file: {spec} (derive needs a local .gguf)")
    return path
