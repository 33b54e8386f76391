"""What this llama-cpp-python build can do, for `specrun doctor`."""

from __future__ import annotations

from pathlib import Path

from specrun.backend import rpc_link
from specrun.backend.devices import local_gpu_devices
from specrun.backend.library import llama, llama_cpp_version


def system_info() -> dict[str, object]:
    """Versions, compiled backends and CPU features, for `specrun doctor`."""
    L = llama()
    info = L.llama_print_system_info().decode("utf-8", "replace")
    libs = Path(str(L.__file__)).parent / "lib"
    # The shared libraries carry llama.cpp's and ggml's versions in their file names.
    versions = sorted(p.name.split(".so.", 1)[0] + " " + p.name.split(".so.", 1)[1] for p in libs.glob("lib*.so.*.*.*"))
    return {
        "llama_cpp_python": llama_cpp_version(),
        "libraries": versions,
        # llama_supports_gpu_offload() is also true for a CPU build with RPC: ask for local GPUs.
        "gpu_offload": bool(local_gpu_devices()),
        "rpc": rpc_link.rpc_supported(),
        "mmap": bool(L.llama_supports_mmap()),
        "max_devices": int(L.llama_max_devices()),
        "system_info": info.strip(),
    }
