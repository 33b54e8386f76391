"""How much memory a model will run in, and how much a GGUF needs once loaded."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from specrun import backend

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
    where: str  # "GPU memory", "RAM", "RAM (12.0 GB) and 2 RPC servers (30.1 GB)", for messages


def run_bytes(file_bytes: int) -> int:
    """Memory a GGUF of this size needs to run: weights, KV cache and buffers."""
    return file_bytes + int(file_bytes * RUN_OVERHEAD_FRACTION) + RUN_OVERHEAD_BYTES


def memory_budget(rpc: tuple[str, ...] = ()) -> MemoryBudget | None:
    """Memory the model will run in: the local budget, plus the free memory of the devices of
    the `rpc` servers its layers go to. None when unknown."""
    local = local_budget()
    if not rpc:
        return local
    servers = backend.rpc_servers(rpc)
    remote = MemoryBudget(sum(s.free_bytes for s in servers), f"{len(servers)} RPC server{'s' * (len(servers) > 1)}")
    if local is None:
        return remote
    return MemoryBudget(
        local.bytes + remote.bytes,
        f"{local.where} ({format_bytes(local.bytes)}) and {remote.where} ({format_bytes(remote.bytes)})",
    )


def local_budget() -> MemoryBudget | None:
    """Free memory of the local GPUs llama.cpp offloads to; available RAM without any."""
    gpu = backend.local_gpu_free_bytes()
    if gpu is not None:
        return MemoryBudget(gpu, "GPU memory")
    ram = ram_available_bytes()
    return MemoryBudget(ram, "RAM") if ram is not None else None


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
