"""`specrun doctor`: what this install can run on, and how to get a GPU build."""

from __future__ import annotations

import json
import os
import platform
import re
from typing import Annotated, Any, Optional

import typer

from specrun.backend import rpc
from specrun.cli.app import app
from specrun.cli.serve import PARALLEL
from specrun.core.policy import AUTO_ROLLBACK, LLAMA_CPP_DRAFT_MAX
from specrun.errors import SpecrunError
from specrun.hub.embedded import cache_dir
from specrun.hub.memory import ram_available_bytes

GPU_BUILDS = {
    "Darwin": 'CMAKE_ARGS="-DGGML_METAL=on" pip install --force-reinstall --no-cache-dir "llama-cpp-python>=0.3.36,<0.4"',
    "cuda": 'CMAKE_ARGS="-DGGML_CUDA=on" pip install --force-reinstall --no-cache-dir "llama-cpp-python>=0.3.36,<0.4"',
    "vulkan": 'CMAKE_ARGS="-DGGML_VULKAN=on" pip install --force-reinstall --no-cache-dir "llama-cpp-python>=0.3.36,<0.4"',
}


def rpc_server_build(version: str) -> str:
    """How to build an rpc-server that speaks this llama-cpp-python's RPC protocol: from its own source."""
    return (
        f"pip download --no-deps --no-binary :all: llama-cpp-python=={version} && "
        f"tar xzf llama_cpp_python-{version}.tar.gz && "
        f"cmake -S llama_cpp_python-{version}/vendor/llama.cpp -B rpc-build -DGGML_RPC=ON -DLLAMA_CURL=OFF && "
        "cmake --build rpc-build --target ggml-rpc-server -j && rpc-build/bin/ggml-rpc-server -H 0.0.0.0 -p 50052"
    )


def diagnose(rpc_endpoints: tuple[str, ...] = ()) -> dict[str, Any]:
    from specrun import backend
    from specrun.backend import probe
    from specrun.hub.stores import foreign_stores
    from specrun.session import cost_cache

    backends, devices = backend.compiled_devices()
    info = backend.system_info()
    report: dict[str, Any] = {  # a JSON object: each key holds its own kind of value
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
        # How a hybrid target's recurrent-state snapshots are sized (a copy each); their bytes depend on
        # the model, which only its header tells (`specrun pair check`), so none is given here.
        "recurrent_snapshots": {"fixed_k": "k", "auto": AUTO_ROLLBACK, "llama.cpp": LLAMA_CPP_DRAFT_MAX},
        # How serve picks its slots when --parallel is not given: the KV cache per slot depends on the model.
        "serve_slots": {"most": PARALLEL, "memory_available": ram_available_bytes()},
        "hf_cache": os.environ.get("HF_HUB_CACHE") or os.environ.get("HF_HOME") or "~/.cache/huggingface",
        # Other tools' stores, read where they lie (`specrun models` lists them).
        **{f"{store.source}_models": str(store.root) for store in foreign_stores()},
    }
    if not info["gpu_offload"]:
        key = "Darwin" if platform.system() == "Darwin" else "cuda"
        report["gpu_build_hint"] = GPU_BUILDS[key]
        if key == "cuda":
            report["gpu_build_hint_other"] = GPU_BUILDS["vulkan"]
    # Each GPU backend's first device loads a tiny model in a child process: a build that crashes in
    # llama.cpp's load shows here in one line, not after a download.
    report["gpu_load"] = {name: probe.try_load(name) for name in first_gpu_of_each_backend(devices)}
    report["rpc"] = info["rpc"]
    if not info["rpc"]:
        report["rpc_build_hint"] = backend.RPC_BUILD
    report["rpc_protocol"] = rpc.version_text(rpc.client_protocol())
    report["rpc_server_build"] = rpc_server_build(str(info["llama_cpp_python"]))
    if rpc_endpoints:
        report["rpc_servers"] = [_server_report(endpoint) for endpoint in rpc_endpoints]
    return report


def first_gpu_of_each_backend(devices: list[dict[str, Any]]) -> list[str]:
    """The names of the first local GPU device of each backend (CUDA0, Vulkan0, ...); an RPC
    server's devices are reported by `doctor --rpc`."""
    firsts: dict[str, str] = {}
    for device in devices:
        if device["type"] in ("GPU", "IGPU") and not str(device["name"]).startswith("RPC"):
            firsts.setdefault(re.sub(r"\d+$", "", str(device["name"])), str(device["name"]))
    return list(firsts.values())


def _server_report(endpoint: str) -> dict[str, object]:
    """One server's version and devices, or the line that says what is wrong with it."""
    from specrun import backend

    try:
        server = backend.rpc_servers((endpoint,))[0]
    except SpecrunError as exc:
        return {"endpoint": endpoint, "error": str(exc)}
    devices = [{"memory_free": d.free, "memory_total": d.total} for d in server.devices]
    return {"endpoint": endpoint, "protocol": rpc.version_text(server.version), "devices": devices}


@app.command()
def doctor(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    rpc_servers: Annotated[
        Optional[str],
        typer.Option(
            "--rpc",
            help="Also reach these rpc-servers, HOST:PORT[,...], and report their devices and free memory (default: none).",
        ),
    ] = None,
) -> None:
    """Show versions, compiled backends, GPU offload, RPC, CPU features and cache locations."""
    report = diagnose(rpc.parse_endpoints(rpc_servers, "--rpc"))
    failed = any("error" in server for server in report.get("rpc_servers", []))
    failed |= any(outcome != "ok" for outcome in report["gpu_load"].values())
    if as_json:
        print(json.dumps(report))
    else:
        _print_report(report)
    if failed:
        raise typer.Exit(code=1)


def _print_report(report: dict[str, Any]) -> None:
    for key, value in report.items():
        if key == "devices":
            for dev in value:
                mem = f", {dev['memory_total'] / 2**30:.1f} GiB" if dev["memory_total"] else ""
                print(f"device: {dev['name']} ({dev['description']}{mem})")
        elif key == "llama_cpp_libraries":
            print(f"llama.cpp libraries: {', '.join(value) or 'unknown'}")
        elif key == "backends":
            print(f"backends: {', '.join(value)}")
        elif key == "gpu_build_hint":
            print(f"GPU offload is not compiled in; for NVIDIA: {value}")
        elif key == "gpu_build_hint_other":
            print(f"  for Vulkan (AMD/Intel): {value}")
        elif key == "gpu_load":
            for name, outcome in value.items():
                print(f"model load on {name} (a tiny model, in a child process): {outcome}")
            if not value:
                print("model load on a GPU: no GPU device in this build to try")
        elif key == "rpc":
            print(f"rpc: {'yes (llama.cpp RPC backend compiled in)' if value else 'no'}")
        elif key == "rpc_build_hint":
            print(f"  --rpc needs llama.cpp's RPC backend: {value}")
        elif key == "rpc_server_build":
            print(f"rpc-server for the other machines (same llama.cpp as here): {value}")
        elif key == "recurrent_snapshots":
            auto, llama_cpp = value["auto"], value["llama.cpp"]
            print(
                f"hybrid targets (Qwen3.5, Nemotron-H, LFM2, ...): llama.cpp keeps their recurrent state and a copy "
                f"of it for each token of the longest draft: k with --k N, {auto} with --k auto, {llama_cpp} with "
                "--k llama.cpp; `specrun pair check` gives a model's bytes"
            )
        elif key == "serve_slots":
            free = value["memory_available"]
            room = f"the {free / 2**30:.1f} GiB available" if free else "memory (unknown here, so 1)"
            print(
                f"serve slots without --parallel: up to {value['most']}, as many KV caches of --ctx-size tokens as "
                f"fit beside the weights in {room}"
            )
        elif key == "rpc_servers":
            for server in value:
                print(_server_line(server))
        else:
            print(f"{key.replace('_', ' ')}: {value}")


def _server_line(server: dict) -> str:
    if "error" in server:
        return f"rpc server {server['endpoint']}: {server['error']}"
    devices = "; ".join(
        f"device {i}: {d['memory_free'] / 2**30:.1f} GiB free of {d['memory_total'] / 2**30:.1f} GiB"
        for i, d in enumerate(server["devices"])
    )
    return f"rpc server {server['endpoint']}: protocol {server['protocol']}, {devices}"
