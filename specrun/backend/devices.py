"""ggml's devices on this machine: the registered backends, the local GPUs llama.cpp offloads
to, their free memory, and the --tensor-split array over a model's devices."""

from __future__ import annotations

import ctypes

from specrun.backend.library import DeviceProps, ggml, llama
from specrun.errors import SpecrunError

DEVICE_TYPES = {0: "CPU", 1: "GPU", 2: "IGPU", 3: "ACCEL", 4: "META"}


def device_memory(dev: int) -> tuple[int, int]:
    """Free and total bytes of one ggml device (for an RPC device, its server is asked)."""
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    ggml().ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
    return free.value, total.value


def device_props(dev: int) -> DeviceProps:
    """One device's struct ggml_backend_dev_props, read in one call."""
    props = DeviceProps()
    ggml().ggml_backend_dev_get_props(dev, ctypes.byref(props))
    return props


def compiled_devices() -> tuple[list[str], list[dict[str, object]]]:
    """ggml's registered backends (CPU, CUDA, Metal, Vulkan, RPC, ...) and their local devices."""
    lib = ggml()
    backends = [lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i)).decode() for i in range(lib.ggml_backend_reg_count())]
    devices = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        free, total = device_memory(dev)
        devices.append(
            {
                "name": lib.ggml_backend_dev_name(dev).decode(),
                "description": lib.ggml_backend_dev_description(dev).decode(),
                "type": DEVICE_TYPES.get(lib.ggml_backend_dev_type(dev), "unknown"),
                "memory_free": free,
                "memory_total": total,
            }
        )
    return backends, devices


def device_by_name(name: str) -> int:
    """The ggml device called `name` (CPU, CUDA0, Vulkan1, ...)."""
    lib = ggml()
    devices = [lib.ggml_backend_dev_get(i) for i in range(lib.ggml_backend_dev_count())]
    names = [lib.ggml_backend_dev_name(dev).decode() for dev in devices]
    if name not in names:
        raise SpecrunError(f"no device named {name} in this build (it has {', '.join(names)}): `specrun doctor` lists them")
    return devices[names.index(name)]


def local_gpu_devices() -> list[int]:
    """The local devices llama.cpp offloads to when given no list (llama_prepare_model_devices):
    GPUs, one per device id, or integrated GPUs of one backend when there is no GPU."""
    lib = ggml()
    gpus: list[int] = []
    igpus: list[int] = []
    seen_ids: set[bytes] = set()
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        kind = DEVICE_TYPES.get(lib.ggml_backend_dev_type(dev))
        if kind == "GPU":
            device_id = device_props(dev).device_id
            if device_id and device_id in seen_ids:
                continue  # the same GPU seen through a second backend
            seen_ids.add(device_id or b"")
            gpus.append(dev)
        elif kind == "IGPU" and (
            not igpus or lib.ggml_backend_dev_backend_reg(dev) == lib.ggml_backend_dev_backend_reg(igpus[-1])
        ):
            igpus.append(dev)
    return gpus or igpus


def local_gpu_free_bytes() -> int | None:
    """Free memory summed over the local GPUs llama.cpp offloads to; None without any."""
    devices = local_gpu_devices()
    return sum(device_memory(dev)[0] for dev in devices) if devices else None


def split_array(weights: tuple[float, ...], devices: list[int]) -> ctypes.Array:
    """llama.cpp's tensor_split array: each device's share of the offloaded layers, in order."""
    if not devices:
        raise SpecrunError("--tensor-split needs devices to split the layers over: give --rpc servers or use a GPU build")
    if len(weights) > len(devices):
        names = ", ".join(_device_label(dev) for dev in devices)
        raise SpecrunError(
            f"--tensor-split gives {len(weights)} weights, but the target has {len(devices)} devices to split over: {names}"
        )
    L = llama()
    return (ctypes.c_float * int(L.llama_max_devices()))(*weights)


def _device_label(dev: int) -> str:
    lib = ggml()
    return f"{lib.ggml_backend_dev_name(dev).decode()} ({lib.ggml_backend_dev_description(dev).decode()})"
