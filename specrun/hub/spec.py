"""What the user typed for a model: alias[:QUANT] | owner/repo[:QUANT] | owner/repo/file.gguf | path."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Collection

from specrun.errors import SpecrunError
from specrun.hub.containment import check_name
from specrun.hub.quants import normalize_quant

WINDOWS_DRIVE_RE = re.compile(r"^[A-Za-z]:[\\/]")
# Hugging Face repository ids: owner/name of letters, digits, - _ . (word characters at
# both ends), no "--" or "..", at most 96 characters (huggingface_hub's validate_repo_id).
REPO_PART_RE = re.compile(r"\w(?:[\w.-]*\w)?")
REPO_ID_MAX = 96
OLLAMA_PREFIX = "ollama:"


@dataclass(frozen=True)
class ModelSpec:
    text: str
    alias: str | None = None
    repo: str | None = None
    filename: str | None = None  # a file inside repo (owner/repo/file.gguf)
    quant: str | None = None


def local_model_path(text: str) -> Path | None:
    """The GGUF a spec names on disk; None when the spec is not a path.

    Checked before anything else, so a local file never touches the network.
    """
    path = Path(text).expanduser()
    if path.is_file():
        check_gguf_magic(path)
        return path
    if path.is_dir():
        raise SpecrunError(f"{text} is a directory: pass the .gguf file inside it")
    looks_like_path = (
        text.startswith(("/", "./", "../", "~", ".\\", "..\\"))
        or "\\" in text
        or WINDOWS_DRIVE_RE.match(text) is not None
        or (text.lower().endswith(".gguf") and text.count("/") < 2)
    )
    if looks_like_path:
        raise SpecrunError(f"no such model file: {text} (check the path, or give an alias or owner/repo)")
    return None


def parse_spec(text: str, aliases: Collection[str]) -> ModelSpec:
    name, quant = split_quant(text)
    if name.lower() in aliases:
        return ModelSpec(text, alias=name.lower(), quant=quant)
    parts = name.split("/")
    if len(parts) == 2 and all(parts):
        return ModelSpec(text, repo=checked_repo_id(name, text), quant=quant)
    if len(parts) > 2 and all(parts) and name.lower().endswith(".gguf"):
        if quant is not None:
            raise SpecrunError(f"{text}: a file name already fixes the quant; drop :{quant}")
        filename = check_name("/".join(parts[2:]), f"{text}: file")
        return ModelSpec(text, repo=checked_repo_id("/".join(parts[:2]), text), filename=filename)
    raise SpecrunError(unknown_model_message(name, aliases))


def is_repo_id(repo: str) -> bool:
    parts = repo.split("/")
    return (
        len(parts) == 2
        and all(REPO_PART_RE.fullmatch(part) for part in parts)
        and "--" not in repo
        and ".." not in repo
        and len(repo) <= REPO_ID_MAX
    )


def checked_repo_id(repo: str, context: str) -> str:
    """A repository id the hub and its cache accept (a `..` never reaches a cache path)."""
    if not is_repo_id(repo):
        raise SpecrunError(
            f"bad model {context!r}: {repo!r} is not a hub repository id (owner/name of letters, "
            f"digits, - _ . without '--' or '..')"
        )
    return repo


def ollama_name(text: str) -> str | None:
    """NAME[:TAG] of an `ollama:NAME[:TAG]` spec; None for any other spec."""
    return text[len(OLLAMA_PREFIX) :] if text.lower().startswith(OLLAMA_PREFIX) else None


def split_quant(text: str) -> tuple[str, str | None]:
    name, sep, quant = text.strip().rpartition(":")
    if not sep:
        return text.strip(), None
    if not name:
        raise SpecrunError(f"bad model {text!r}: expected alias[:QUANT], owner/repo[:QUANT] or a path")
    return name, checked_quant(quant, text)


def checked_quant(quant: str, context: str) -> str:
    try:
        return normalize_quant(quant)
    except ValueError:
        raise SpecrunError(f"{context}: {quant!r} is not a GGUF quant name (e.g. Q4_K_M, Q8_0, IQ4_XS, F16)") from None


def unknown_model_message(name: str, aliases: Collection[str]) -> str:
    close = difflib.get_close_matches(name.lower(), list(aliases), n=3)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    return f"unknown model {name!r}: not a file, an alias or owner/repo; {hint}`specrun models --aliases` lists the aliases"


def has_gguf_magic(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == b"GGUF"
    except OSError:
        return False


def check_gguf_magic(path: Path) -> None:
    """Fail early and clearly on a file llama.cpp would refuse with a cryptic message."""
    if not has_gguf_magic(path):
        raise SpecrunError(f"{path} is not a GGUF file (it does not start with 'GGUF'): pass a .gguf model")
