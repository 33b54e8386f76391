"""Model families as YAML data: aliases, their GGUF repositories, drafts and default k, and what
each model is (active parameters of a mixture of experts, MTP heads, a recurrent state, a drafter
trained for one target).

Built-in profiles ship with specrun; files in the user's config directory add aliases
or replace built-in ones with the same name. Every file is validated on load, and an
error names the file, the line and the field.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import yaml

from specrun.errors import SpecrunError
from specrun.files import read_text
from specrun.hub.containment import check_name
from specrun.hub.spec import is_repo_id

PARAMS_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([MB])", re.IGNORECASE)
FAMILY_KEYS = {"family": True, "tokenizer": False, "default_k": True, "models": True}  # key -> required
MODEL_KEYS = {
    "repo": True,
    "file": True,
    "params": True,
    "active": False,
    "drafts": False,
    "k": False,
    "mtp": False,
    "hybrid": False,
    "drafter": False,
}
MAX_K = 64
MTP_HEADS, MTP_SEPARATE = "heads", "separate"  # `mtp: true`, `mtp: separate`
TRAINED_KINDS = ("eagle3", "dflash", "dspark")  # `drafter:`, as llama.cpp's draft-eagle3, draft-dflash, draft-dspark


@dataclass(frozen=True)
class ModelProfile:
    alias: str
    family: str
    repo: str  # owner/name of the GGUF repository
    file_pattern: str  # file name with {quant}, e.g. "Llama-3.2-1B-Instruct-{quant}.gguf"
    params: int  # parameter count
    drafts: tuple[str, ...]  # recommended draft aliases, best first
    k: int  # default draft length when this model is the target
    source: Path  # the YAML file that defined it
    # Models with the same tokenizer label pass llama.cpp's vocabulary check together;
    # a family shares one unless its file says otherwise.
    tokenizer: str = ""
    active: int = 0  # parameters read per token (a mixture of experts' routed share); 0: all of params
    # MTP_HEADS: MTP (NextN) layers in its own weights, which draft for it (--draft mtp) where its GGUF
    # holds them; MTP_SEPARATE: its MTP drafter is a model of its own (Gemma 4's gemma4-assistant),
    # which specrun cannot run yet; "": none.
    mtp: str = ""
    hybrid: bool = False  # keeps a recurrent state (Qwen3.5, Nemotron-H, LFM2), which a verify must roll back
    # A drafter trained to read one target's features (a TRAINED_KINDS kind): it drafts only for
    # the targets that list it in their drafts, never as a model of its own; "": a model.
    drafter: str = ""

    @property
    def active_params(self) -> int:
        return self.active or self.params


class _Mapping(dict):
    """A YAML mapping that remembers where it and each of its keys were written."""

    line: int = 0
    key_lines: dict[str, int]


class _LineLoader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> _Mapping:
    mapping = _Mapping()
    mapping.line = node.start_mark.line + 1
    mapping.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in mapping:
            raise _ProfileError(key_node.start_mark.line + 1, str(key), "duplicate key")
        mapping[key] = loader.construct_object(value_node, deep=True)
        mapping.key_lines[str(key)] = key_node.start_mark.line + 1
    return mapping


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


class _ProfileError(Exception):
    def __init__(self, line: int, field: str, problem: str) -> None:
        super().__init__(f"{line}: {field}: {problem}")
        self.line, self.field, self.problem = line, field, problem


def builtin_profiles_dir() -> Path:
    """Installed: specrun/profiles (package data). Source checkout: the top-level profiles/."""
    package_dir = Path(__file__).resolve().parents[1]
    for candidate in (package_dir / "profiles", package_dir.parent / "profiles"):
        if candidate.is_dir():
            return candidate
    raise SpecrunError(f"specrun's built-in profiles are missing from {package_dir}: reinstall specrun")


def user_config_dir() -> Path:
    """The platform's usual per-user config folder for specrun (XDG on Linux)."""
    if sys.platform == "win32":
        base = Path(os.environ.get("APPDATA") or Path.home() / "AppData" / "Roaming")
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    else:
        base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "specrun"


def user_profiles_dir() -> Path:
    return user_config_dir() / "profiles"


def load_profiles(dirs: Iterable[Path] | None = None) -> dict[str, ModelProfile]:
    """Aliases from the built-in then the user profile folders; later folders override."""
    folders = list(dirs) if dirs is not None else [builtin_profiles_dir(), user_profiles_dir()]
    profiles: dict[str, ModelProfile] = {}
    for folder in folders:
        layer: dict[str, ModelProfile] = {}
        for path in sorted(folder.glob("*.yaml")) + sorted(folder.glob("*.yml")):
            for profile in load_profile_file(path):
                if profile.alias in layer:
                    raise SpecrunError(
                        f"alias {profile.alias!r} is defined twice, in {layer[profile.alias].source} "
                        f"and {path}: rename or remove one"
                    )
                layer[profile.alias] = profile
        profiles.update(layer)
    _check_drafts(profiles)
    return profiles


def load_profile_file(path: Path) -> list[ModelProfile]:
    try:
        data = yaml.load(read_text(path, "profile"), Loader=_LineLoader)
        return _family_profiles(data, path)
    except _ProfileError as exc:
        raise SpecrunError(f"bad profile {path}:{exc.line}: {exc.field}: {exc.problem}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecrunError(f"bad profile {path}{where}: not valid YAML: {problem}") from None


def _family_profiles(data: Any, path: Path) -> list[ModelProfile]:
    if not isinstance(data, _Mapping):
        raise _ProfileError(1, "(top level)", "must be a mapping with family, default_k and models")
    _check_keys(data, FAMILY_KEYS, "")
    family = _string(data, "family", "")
    tokenizer = _string(data, "tokenizer", "") if "tokenizer" in data else family
    default_k = _k(data, "default_k", "")
    models = data["models"]
    if not isinstance(models, _Mapping) or not models:
        raise _ProfileError(data.key_lines["models"], "models", "must map each alias to its model")
    return [
        _model_profile(str(alias), entry, family, default_k, path, models.key_lines[str(alias)], tokenizer)
        for alias, entry in models.items()
    ]


def _model_profile(alias: str, entry: Any, family: str, default_k: int, path: Path, line: int, tokenizer: str) -> ModelProfile:
    prefix = f"models.{alias}."
    if not isinstance(entry, _Mapping):
        raise _ProfileError(line, f"models.{alias}", "must be a mapping with repo, file and params")
    if alias != alias.lower() or not re.fullmatch(r"[a-z0-9][a-z0-9._-]*", alias):
        raise _ProfileError(line, f"models.{alias}", "alias must be lower-case letters, digits, . _ -")
    _check_keys(entry, MODEL_KEYS, prefix)
    repo = _string(entry, "repo", prefix)
    if not is_repo_id(repo):
        raise _ProfileError(entry.key_lines["repo"], prefix + "repo", f"must look like owner/name, got {repo!r}")
    file_pattern = _string(entry, "file", prefix)
    if "{quant}" not in file_pattern or not file_pattern.lower().endswith(".gguf"):
        raise _ProfileError(
            entry.key_lines["file"], prefix + "file", f"must contain {{quant}} and end in .gguf, got {file_pattern!r}"
        )
    try:
        check_name(file_pattern, prefix + "file")
    except SpecrunError:
        raise _ProfileError(
            entry.key_lines["file"],
            prefix + "file",
            f"must be a file inside the repository (no '..', no absolute path), got {file_pattern!r}",
        ) from None
    drafts = entry.get("drafts", [])
    if not isinstance(drafts, list) or not all(isinstance(d, str) for d in drafts):
        raise _ProfileError(entry.key_lines.get("drafts", line), prefix + "drafts", "must be a list of aliases")
    k = _k(entry, "k", prefix) if "k" in entry else default_k
    params = _params(entry, "params", prefix)
    active = _params(entry, "active", prefix) if "active" in entry else 0
    if active > params:
        raise _ProfileError(
            entry.key_lines["active"], prefix + "active", f"must be at most params ({entry['params']}), got {entry['active']!r}"
        )
    return ModelProfile(
        alias=alias,
        family=family,
        repo=repo,
        file_pattern=file_pattern,
        params=params,
        drafts=tuple(d.lower() for d in drafts),
        k=k,
        source=path,
        tokenizer=tokenizer,
        active=active,
        mtp=_mtp(entry, prefix),
        hybrid=_flag(entry, "hybrid", prefix),
        drafter=_drafter(entry, prefix),
    )


def _check_keys(mapping: _Mapping, allowed: dict[str, bool], prefix: str) -> None:
    for key in mapping:
        if key not in allowed:
            known = ", ".join(allowed)
            raise _ProfileError(mapping.key_lines[str(key)], prefix + str(key), f"unknown field (known: {known})")
    for key, required in allowed.items():
        if required and key not in mapping:
            raise _ProfileError(mapping.line, prefix + key, "missing")


def _string(mapping: _Mapping, key: str, prefix: str) -> str:
    value = mapping[key]
    if not isinstance(value, str) or not value.strip():
        raise _ProfileError(mapping.key_lines[key], prefix + key, f"must be a non-empty string, got {value!r}")
    return value.strip()


def _k(mapping: _Mapping, key: str, prefix: str) -> int:
    value = mapping[key]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_K:
        raise _ProfileError(mapping.key_lines[key], prefix + key, f"must be an integer from 1 to {MAX_K}, got {value!r}")
    return value


def _params(mapping: _Mapping, key: str, prefix: str) -> int:
    """'1.24B', '270M' or a plain count."""
    value = mapping[key]
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    match = PARAMS_RE.fullmatch(str(value).strip())
    if not match:
        raise _ProfileError(mapping.key_lines[key], prefix + key, f"must be a count such as 8.03B or 270M, got {value!r}")
    scale = 1e9 if match.group(2).upper() == "B" else 1e6
    return int(float(match.group(1)) * scale)


def _flag(mapping: _Mapping, key: str, prefix: str) -> bool:
    value = mapping.get(key, False)
    if not isinstance(value, bool):
        raise _ProfileError(mapping.key_lines[key], prefix + key, f"must be true or false, got {value!r}")
    return value


def _mtp(mapping: _Mapping, prefix: str) -> str:
    """`mtp: true` (heads in its own weights), `mtp: separate` (a drafter model of its own), or false."""
    value = mapping.get("mtp", False)
    if value is True or value == MTP_SEPARATE:
        return MTP_HEADS if value is True else MTP_SEPARATE
    if value is False:
        return ""
    raise _ProfileError(mapping.key_lines["mtp"], prefix + "mtp", f"must be true, false or separate, got {value!r}")


def _drafter(mapping: _Mapping, prefix: str) -> str:
    value = mapping.get("drafter", "")
    if value == "" or value in TRAINED_KINDS:
        return value
    raise _ProfileError(
        mapping.key_lines["drafter"], prefix + "drafter", f"must be one of {', '.join(TRAINED_KINDS)}, got {value!r}"
    )


def _check_drafts(profiles: dict[str, ModelProfile]) -> None:
    for profile in profiles.values():
        for draft in profile.drafts:
            if draft not in profiles:
                raise SpecrunError(f"bad profile {profile.source}: models.{profile.alias}.drafts: unknown alias {draft!r}")
