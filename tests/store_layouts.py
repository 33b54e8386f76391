"""Other tools' model stores built in their real layouts (not a test module itself).

Ollama: manifests/<host>/<namespace>/<model>/<tag> JSON naming sha256 blobs, with the
media types Ollama writes; LM Studio: <publisher>/<repo>/<file>.gguf; llama.cpp: the
Hugging Face cache layout under LLAMA_CACHE, or the flat folder of older releases with
its manifest=<owner>=<repo>=<tag>.json files.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

DATA = Path(__file__).parent / "data"
LLAMA_VOCAB = DATA / "ggml-vocab-llama-spm.gguf"  # llama architecture, 32000-token SPM vocabulary
GPT2_VOCAB = DATA / "ggml-vocab-gpt-2.gguf"  # gpt2 architecture, 50257-token BPE vocabulary

MEDIA = "application/vnd.ollama.image."
MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_TYPE = "application/vnd.docker.container.image.v1+json"


def _blob(root: Path, data: bytes) -> dict:
    digest = hashlib.sha256(data).hexdigest()
    path = root / "blobs" / f"sha256-{digest}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def ollama_model(
    root: Path,
    name: str,
    tag: str,
    gguf: Path | bytes,
    *,
    family: str = "llama",
    file_type: str = "Q4_K_M",
    namespace: str = "library",
    host: str = "registry.ollama.ai",
    extra: tuple[str, ...] = ("template", "license", "params"),
) -> Path:
    """One model as `ollama pull` leaves it: config, model layer and the usual small layers."""
    weights = gguf.read_bytes() if isinstance(gguf, Path) else gguf
    config = _blob(
        root,
        json.dumps(
            {
                "model_format": "gguf",
                "model_family": family,
                "model_families": [family],
                "model_type": "1B",
                "file_type": file_type,
            }
        ).encode(),
    )
    layers = [{"mediaType": MEDIA + "model", **_blob(root, weights)}]
    for kind in extra:
        layers.append({"mediaType": MEDIA + kind, **_blob(root, f"{kind} of {name}".encode())})
    return ollama_manifest(
        root,
        f"{host}/{namespace}/{name}/{tag}",
        {"schemaVersion": 2, "mediaType": MANIFEST_TYPE, "config": {"mediaType": CONFIG_TYPE, **config}, "layers": layers},
    )


def ollama_tensor_model(root: Path, name: str, tag: str) -> Path:
    """A model newer Ollama keeps as one layer per tensor, not as a GGUF."""
    layers = [{"mediaType": MEDIA + "tensor", **_blob(root, f"tensor {i}".encode()), "name": f"t{i}"} for i in range(3)]
    return ollama_manifest(
        root, f"registry.ollama.ai/library/{name}/{tag}", {"schemaVersion": 2, "mediaType": MANIFEST_TYPE, "layers": layers}
    )


def ollama_manifest(root: Path, relative: str, body: dict | str) -> Path:
    path = root / "manifests" / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body if isinstance(body, str) else json.dumps(body))
    return path


def lmstudio_file(root: Path, repo: str, name: str, gguf: Path | bytes) -> Path:
    path = root / repo / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gguf.read_bytes() if isinstance(gguf, Path) else gguf)
    return path


def hf_layout_file(root: Path, repo: str, name: str, gguf: Path | bytes, commit: str = "c0ffee" * 6 + "c0ff") -> Path:
    """A file as huggingface_hub (and current llama.cpp) caches it: a snapshot symlink to a blob."""
    data = gguf.read_bytes() if isinstance(gguf, Path) else gguf
    folder = root / f"models--{repo.replace('/', '--')}"
    blob = _blob(folder, data)["digest"].split(":")[1]
    (folder / "blobs" / f"sha256-{blob}").rename(folder / "blobs" / blob)
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(commit)
    link = folder / "snapshots" / commit / name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(folder / "blobs" / blob, link.parent))
    return link


def llamacpp_flat_file(root: Path, repo: str, name: str, tag: str, gguf: Path | bytes) -> Path:
    """A file as llama.cpp before the HF cache layout kept `-hf repo:tag`: flat, with its manifest."""
    owner, model = repo.split("/")
    root.mkdir(parents=True, exist_ok=True)
    (root / f"manifest={owner}={model}={tag}.json").write_text(
        json.dumps({"ggufFile": {"rfilename": name, "size": 1}, "mmprojFile": None})
    )
    path = root / f"{repo}_{name}".replace("/", "_")
    path.write_bytes(gguf.read_bytes() if isinstance(gguf, Path) else gguf)
    (root / f"{path.name}.etag").write_text('"etag"')
    return path


def snapshot(*roots: Path) -> dict[str, tuple[int, int]]:
    """Every path under the roots (folders too) with its modification time and size."""
    found = {}
    for root in roots:
        for folder, dirs, files in os.walk(root):
            for name in [*dirs, *files, ""]:
                path = Path(folder) / name
                stat = path.lstat()
                found[str(path)] = (stat.st_mtime_ns, stat.st_size)
    return found
