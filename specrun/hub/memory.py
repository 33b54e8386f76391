"""How much memory a model will run in, and how much a GGUF needs once loaded."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

MIB = 1024**2
GIB = 1024**3
# Rule of thumb from llama.cpp runs: a few thousand tokens of KV cache plus compute
# buffers take about 15% of the weights, plus a fixed share for the output head.
RUN_OVERHEAD_FRACTION = 0.15
RUN_OVERHEAD_BYTES = 256 * MIB
# Without a way to read available RAM (macOS, Windows): assume this share of the total.
UNKNOWN_AVAILABLE_FRACTION = 0.75


@dataclass(frozen=True)
class MemoryBudget:
    bytes: int
    where: str  # "GPU memory (nvidia-smi)" or "RAM", for messages


def run_bytes(file_bytes: int) -> int:
    """Memory a GGUF of this size needs to run: weights, KV cache and buffers."""
    return file_bytes + int(file_bytes * RUN_OVERHEAD_FRACTION) + RUN_OVERHEAD_BYTES


def memory_budget(offload: bool | None = None) -> MemoryBudget | None:
    """Memory the model will run in: free GPU memory when offloading, available RAM otherwise.

    offload=None asks llama.cpp whether this build can offload. None when unknown.
    """
    if offload is None:
        offload = gpu_offload_supported()
    if offload:
        gpu = nvidia_free_bytes()
        if gpu is not None:
            return MemoryBudget(gpu, "GPU memory (nvidia-smi)")
    ram = ram_available_bytes()
    return MemoryBudget(ram, "RAM") if ram is not None else None


def gpu_offload_supported() -> bool:
    try:
        import llama_cpp
    except Exception:  # not installed or its library failed to load: no offload either way
        return False
    return bool(llama_cpp.llama_supports_gpu_offload())


def nvidia_free_bytes() -> int | None:
    """Free memory summed over NVIDIA GPUs (llama.cpp splits layers across them)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_nvidia_free(out)


def parse_nvidia_free(output: str) -> int | None:
    """nvidia-smi prints one MiB figure per GPU; None when it printed none."""
    values = [line.strip() for line in output.splitlines() if line.strip()]
    try:
        mib = [int(float(v)) for v in values]
    except ValueError:
        return None
    return sum(mib) * MIB if mib else None


def ram_available_bytes() -> int | None:
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/meminfo", encoding="ascii") as meminfo:
                return parse_meminfo_available(meminfo.read())
        except OSError:
            pass
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
    return int(total * UNKNOWN_AVAILABLE_FRACTION)


def parse_meminfo_available(text: str) -> int | None:
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def format_bytes(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
