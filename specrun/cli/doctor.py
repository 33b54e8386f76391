"""`specrun doctor`: what this install can run on, and how to get a GPU build."""

from __future__ import annotations

import json
import os
import platform
from typing import Annotated

import typer

from specrun.cli.app import app
from specrun.default_model import cache_dir

GPU_BUILDS = {
    "Darwin": 'CMAKE_ARGS="-DGGML_METAL=on" pip install --force-reinstall --no-cache-dir "llama-cpp-python>=0.3.36,<0.4"',
    "cuda": 'CMAKE_ARGS="-DGGML_CUDA=on" pip install --force-reinstall --no-cache-dir "llama-cpp-python>=0.3.36,<0.4"',
    "vulkan": 'CMAKE_ARGS="-DGGML_VULKAN=on" pip install --force-reinstall --no-cache-dir "llama-cpp-python>=0.3.36,<0.4"',
}


def diagnose() -> dict[str, object]:
    from specrun import backend, cost_cache
    from specrun.hub.stores import foreign_stores

    backends, devices = backend.compiled_devices()
    info = backend.system_info()
    report: dict[str, object] = {
        "specrun": __import__("specrun").__version__,
        "llama_cpp_python": info["llama_cpp_python"],
        "llama_cpp_libraries": info["libraries"],
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "backends": backends,
        "devices": devices,
        "gpu_offload": info["gpu_offload"],
        "cpu_threads": os.cpu_count(),
        "cpu_features": info["system_info"],
        "model_cache": str(cache_dir()),
        "verify_costs": str(cost_cache.cache_file()),  # what --k auto measured, per model and set-up
        "hf_cache": os.environ.get("HF_HUB_CACHE") or os.environ.get("HF_HOME") or "~/.cache/huggingface",
        # Other tools' stores, read where they lie (`specrun models` lists them).
        **{f"{store.source}_models": str(store.root) for store in foreign_stores()},
    }
    if not info["gpu_offload"]:
        key = "Darwin" if platform.system() == "Darwin" else "cuda"
        report["gpu_build_hint"] = GPU_BUILDS[key]
        if key == "cuda":
            report["gpu_build_hint_other"] = GPU_BUILDS["vulkan"]
    return report


@app.command()
def doctor(as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False) -> None:
    """Versions, compiled backends, GPU offload, CPU features and cache locations."""
    report = diagnose()
    if as_json:
        print(json.dumps(report))
        return
    for key, value in report.items():
        if key == "devices":
            for dev in value:  # type: ignore[union-attr]
                mem = f", {dev['memory_total'] / 2**30:.1f} GiB" if dev["memory_total"] else ""
                print(f"device: {dev['name']} ({dev['description']}{mem})")
        elif key == "llama_cpp_libraries":
            print(f"llama.cpp libraries: {', '.join(value) or 'unknown'}")  # type: ignore[arg-type]
        elif key == "backends":
            print(f"backends: {', '.join(value)}")  # type: ignore[arg-type]
        elif key == "gpu_build_hint":
            print(f"GPU offload is not compiled in; for NVIDIA: {value}")
        elif key == "gpu_build_hint_other":
            print(f"  for Vulkan (AMD/Intel): {value}")
        else:
            print(f"{key.replace('_', ' ')}: {value}")
