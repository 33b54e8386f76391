"""Ollama's model store, read-only: manifests name the models, blobs hold their layers.

Layout under OLLAMA_MODELS (default ~/.ollama/models; the Linux service keeps it in
/usr/share/ollama/.ollama/models):
    manifests/<host>/<namespace>/<model>/<tag>   JSON: a config and layers, by sha256 digest
    blobs/sha256-<64 hex>                        one file per layer
The layer of media type application/vnd.ollama.image.model is a GGUF; projectors,
templates, licenses and parameters are other layers, never loaded. Newer Ollama can keep
a model as separate tensor layers (application/vnd.ollama.image.tensor): not one GGUF.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from specrun.errors import SpecrunError
from specrun.hub.containment import inside
from specrun.hub.profiles import ModelProfile
from specrun.hub.quants import normalize_quant
from specrun.hub.spec import has_gguf_magic
from specrun.hub.stores.base import StoredModel, alias_for, family_of

MODEL_LAYER = "application/vnd.ollama.image.model"
TENSOR_LAYER = "application/vnd.ollama.image.tensor"
DEFAULT_HOST, DEFAULT_NAMESPACE, DEFAULT_TAG = "registry.ollama.ai", "library", "latest"
HUB_HOSTS = ("hf.co", "huggingface.co")  # `ollama pull hf.co/owner/repo:QUANT`
LINUX_SERVICE_ROOT = Path("/usr/share/ollama/.ollama/models")
DIGEST_RE = re.compile(r"sha256:([0-9a-f]{64})")
NAME_PART_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}")
HOST_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,249}(?::[0-9]{1,5})?")


def default_root() -> Path:
    configured = os.environ.get("OLLAMA_MODELS")
    if configured:
        return Path(configured).expanduser()
    home = Path.home() / ".ollama" / "models"
    if not home.is_dir() and sys.platform.startswith("linux") and LINUX_SERVICE_ROOT.is_dir():
        return LINUX_SERVICE_ROOT
    return home


def split_name(text: str) -> tuple[str, str, str, str]:
    """[host/][namespace/]model[:tag] -> (host, namespace, model, tag), Ollama's defaults filled in."""
    head, sep, tag = text.rpartition(":")
    if not sep or "/" in tag:
        head, tag = text, DEFAULT_TAG
    parts = head.split("/")
    if len(parts) == 1:
        host, namespace, model = DEFAULT_HOST, DEFAULT_NAMESPACE, parts[0]
    elif len(parts) == 2:
        host, (namespace, model) = DEFAULT_HOST, parts
    elif len(parts) == 3:
        host, namespace, model = parts
    else:
        host = namespace = model = ""
    if not (HOST_RE.fullmatch(host) and all(NAME_PART_RE.fullmatch(p) for p in (namespace, model, tag))):
        raise SpecrunError(
            f"ollama:{text}: not an Ollama model name ([host/][namespace/]model[:tag] of letters, "
            f"digits, _ . -); `ollama list` shows the names"
        )
    return host, namespace, model, tag


def display_name(host: str, namespace: str, model: str, tag: str) -> str:
    """The name `ollama list` shows: default host and namespace left out."""
    if host != DEFAULT_HOST:
        return f"{host}/{namespace}/{model}:{tag}"
    if namespace != DEFAULT_NAMESPACE:
        return f"{namespace}/{model}:{tag}"
    return f"{model}:{tag}"


class OllamaStore:
    source = "ollama"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.manifests = root / "manifests"
        self.blobs = root / "blobs"

    def models(self, profiles: dict[str, ModelProfile]) -> list[StoredModel]:
        """Every model the manifests name, usable or with the reason it is not."""
        found = []
        for folder, dirs, files in os.walk(self.manifests):
            dirs.sort()
            relative = Path(folder).relative_to(self.manifests).parts
            if len(relative) != 3:
                continue
            for tag in sorted(files):
                found.append(self._model(Path(folder) / tag, (*relative, tag), profiles))
        return found

    def find(self, text: str, profiles: dict[str, ModelProfile]) -> StoredModel:
        """The usable model `ollama:text` names; one line saying why when there is none."""
        host, namespace, model, tag = split_name(text)
        if not self.manifests.is_dir():
            raise SpecrunError(
                f"ollama:{text}: no Ollama store at {self.root} (set OLLAMA_MODELS to the folder Ollama keeps its models in)"
            )
        manifest = inside(self.manifests, f"{host}/{namespace}/{model}/{tag}", f"ollama:{text}")
        if not manifest.is_file():
            raise SpecrunError(
                f"ollama:{text}: no such model in {self.root}; `specrun models` or `ollama list` "
                f"shows what is there, `ollama pull {display_name(host, namespace, model, tag)}` fetches it"
            )
        found = self._model(manifest, (host, namespace, model, tag), profiles)
        if found.problem:
            raise SpecrunError(f"ollama:{found.name}: {found.problem}")
        return found

    def _model(self, manifest: Path, name_parts: tuple[str, ...], profiles: dict[str, ModelProfile]) -> StoredModel:
        host, namespace, model, tag = name_parts
        name = display_name(host, namespace, model, tag)
        repo = f"{namespace}/{model}" if host in HUB_HOSTS else None
        broken = StoredModel(self.source, name, None, repo=repo)
        try:
            data = json.loads(manifest.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            return _with_problem(broken, f"its manifest {manifest} is not readable JSON ({exc})")
        layers = data.get("layers") if isinstance(data, dict) else None
        if not isinstance(layers, list) or not all(isinstance(layer, dict) for layer in layers):
            return _with_problem(broken, f"its manifest {manifest} has no list of layers")
        kinds = {layer.get("mediaType") for layer in layers}
        if TENSOR_LAYER in kinds:
            return _with_problem(
                broken, "a newer Ollama keeps it as separate tensor layers, not as one GGUF file; llama.cpp cannot load it"
            )
        model_layers = [layer for layer in layers if layer.get("mediaType") == MODEL_LAYER]
        if not model_layers:
            return _with_problem(broken, f"its manifest {manifest} has no model layer ({MODEL_LAYER})")
        try:
            blob = self.blob(model_layers[0].get("digest"), name)
        except SpecrunError as exc:
            return _with_problem(broken, str(exc))
        if not blob.is_file():
            return _with_problem(broken, f"its model blob {blob.name} is missing from {self.blobs}")
        if not has_gguf_magic(blob):
            return _with_problem(broken, f"its model blob {blob} is not a GGUF file")
        config = self._config(data, name)
        alias = alias_for(profiles, repo, None)
        return StoredModel(
            self.source,
            name,
            blob,
            size=blob.stat().st_size,
            quant=_quant(tag, config),
            repo=repo,
            alias=alias,
            family=family_of(profiles, alias) or _text(config.get("model_family")),
            parts=(blob,),
        )

    def blob(self, digest: Any, name: str) -> Path:
        """blobs/sha256-<hex> for a manifest's digest; any other digest is refused."""
        match = DIGEST_RE.fullmatch(digest) if isinstance(digest, str) else None
        if match is None:
            raise SpecrunError(f"its manifest gives {digest!r} as a digest, not sha256:<64 hex digits>; refused")
        return inside(self.blobs, f"sha256-{match.group(1)}", f"ollama:{name}: blob")

    def _config(self, manifest: dict, name: str) -> dict:
        """The image config (model_family, file_type), when its blob is readable; {} otherwise."""
        config = manifest.get("config")
        try:
            path = self.blob(config.get("digest") if isinstance(config, dict) else None, name)
            data = json.loads(path.read_text(encoding="utf-8"))
        except (SpecrunError, OSError, UnicodeDecodeError, json.JSONDecodeError):
            return {}
        return data if isinstance(data, dict) else {}


def _with_problem(model: StoredModel, problem: str) -> StoredModel:
    return replace(model, problem=problem)


def _quant(tag: str, config: dict) -> str | None:
    """The quant Ollama's config records, else the one a tag like Q4_K_M names."""
    for text in (_text(config.get("file_type")), tag):
        try:
            return normalize_quant(text or "")
        except ValueError:
            continue
    return None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
