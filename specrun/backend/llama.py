"""The one module that talks to llama.cpp's ctypes API (llama-cpp-python's raw bindings).

A `Model` holds weights and vocabulary; a `Context` is one KV cache over a model that
remembers which tokens it holds, so callers roll back by length and reuse prefixes.
"""

from __future__ import annotations

import ctypes
import os
import re
import weakref
import sys
import threading
import time
from collections import Counter, deque
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from specrun import rpc
from specrun.compat import VocabFacts
from specrun.errors import SpecrunError

INSTALL_HINT = "run `pip install 'llama-cpp-python>=0.3.36,<0.4'`"
MIN_VERSION = (0, 3, 36)  # the first release with the llama_memory_* calls used here
# Every raw call this module makes: a release that renamed one fails here, in one line,
# instead of with an AttributeError halfway through a generation.
RAW_API = (
    "llama_backend_init", "llama_batch_free", "llama_batch_init", "llama_context_default_params",
    "llama_decode", "llama_free", "llama_get_logits", "llama_get_memory", "llama_init_from_model",
    "llama_log_callback", "llama_log_set", "llama_max_devices", "llama_memory_seq_rm",
    "llama_model_chat_template", "llama_model_default_params", "llama_model_free", "llama_model_get_vocab",
    "llama_model_load_from_file", "llama_model_n_ctx_train", "llama_n_ctx", "llama_print_system_info",
    "llama_supports_gpu_offload", "llama_supports_mmap", "llama_supports_rpc", "llama_token", "llama_token_to_piece",
    "llama_tokenize", "llama_vocab_bos", "llama_vocab_eos", "llama_vocab_get_add_bos",
    "llama_vocab_get_add_eos", "llama_vocab_get_text", "llama_vocab_is_eog", "llama_vocab_n_tokens",
    "llama_vocab_type",
)

try:
    import llama_cpp as L
except Exception as exc:  # ImportError, or the loader's error when libllama itself fails to load
    raise SpecrunError(f"llama-cpp-python is not importable ({exc}): {INSTALL_HINT}") from None

LLAMA_CPP_VERSION = str(getattr(L, "__version__", "unknown"))


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


_missing = [name for name in RAW_API if not hasattr(L, name)]
if _missing or _release(LLAMA_CPP_VERSION) < MIN_VERSION:
    lacks = f" (it lacks {_missing[0]})" if _missing else ""
    raise SpecrunError(f"llama-cpp-python {LLAMA_CPP_VERSION} is older than specrun needs{lacks}: {INSTALL_HINT}")

VOCAB_TYPES = {0: "none", 1: "spm", 2: "bpe", 3: "wpm", 4: "ugm", 5: "rwkv", 6: "plamo2"}
GGUF_MAGIC = b"GGUF"


_recent_log: deque[str] = deque(maxlen=8)  # llama.cpp's last lines, for the message when it aborts


@L.llama_log_callback
def _log_callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    # llama.cpp is chatty on stderr; users see our one-line errors instead.
    line = text.decode("utf-8", "replace")
    _recent_log.append(line)
    if os.environ.get("SPECRUN_DEBUG"):
        print(line, end="", file=sys.stderr)


L.llama_log_set(_log_callback, ctypes.c_void_p(0))
L.llama_backend_init()


class Closed(SpecrunError):
    """A model or context used after close(): llama.cpp has freed its memory, so it refuses."""


class ContextFull(SpecrunError):
    """The KV cache has no room for the batch (the engine checks first; this is the backstop)."""


@dataclass(frozen=True)
class ModelOptions:
    n_gpu_layers: int = -1  # -1 offloads every layer when a GPU backend or RPC server exists
    use_mmap: bool = True
    repack: bool = False  # CPU weight repacking (use_extra_bufts); changes batched numerics
    rpc_servers: tuple[str, ...] = ()  # HOST:PORT of llama.cpp rpc-servers that take offloaded layers
    tensor_split: tuple[float, ...] = ()  # share of the offloaded layers per device, RPC devices first
    rpc_timeout: float = 300.0  # seconds one decode may wait for the RPC servers; 0 waits forever


@dataclass(frozen=True)
class ContextOptions:
    n_ctx: int = 4096  # 0 means the model's training context
    n_batch: int = 512  # largest single decode; verify batches are k + 1 rows
    n_ubatch: int = 0  # rows llama.cpp computes at once (0: n_batch); changes batched numerics
    n_threads: int = 0  # 0 means every core
    flash_attn: int = -1  # -1 auto, 0 off, 1 on


def check_gguf_file(path: Path, role: str) -> None:
    """Fail with one line for the usual bad inputs, before llama.cpp sees the file."""
    if not path.exists():
        raise SpecrunError(f"{role} model not found: {path} (check the path)")
    if path.is_dir():
        raise SpecrunError(f"{role} model is a directory, not a GGUF file: {path}")
    with path.open("rb") as fh:
        magic = fh.read(4)
    if magic != GGUF_MAGIC:
        raise SpecrunError(f"{role} model is not a GGUF file (bad magic {magic!r}): {path}")


class Model:
    """Weights and vocabulary of one GGUF."""

    def __init__(self, path: str | Path, options: ModelOptions = ModelOptions(), role: str = "target"):
        self.path = Path(path)
        self.role = role
        self._model_ptr = self._vocab_ptr = None
        self._contexts: weakref.WeakSet[Context] = weakref.WeakSet()  # closed before the weights
        check_gguf_file(self.path, role)
        params = L.llama_model_default_params()
        params.n_gpu_layers = options.n_gpu_layers
        params.use_mmap = options.use_mmap
        params.use_extra_bufts = options.repack
        self.rpc_servers = options.rpc_servers
        self.rpc_timeout = options.rpc_timeout
        # The arrays must live until llama.cpp has read them during the load.
        devices = _offload_devices(options.rpc_servers) if options.rpc_servers else None
        if devices is not None:
            device_array = (ctypes.c_void_p * (len(devices) + 1))(*devices, None)
            params.devices = ctypes.cast(device_array, ctypes.c_void_p)
        if options.tensor_split:
            split = _split_array(options.tensor_split, devices if devices is not None else _local_gpu_devices())
            params.tensor_split = split
        _rpc_in_use.update(self.rpc_servers)
        self._model_ptr = L.llama_model_load_from_file(str(self.path).encode(), params)
        if not self._model_ptr:
            _rpc_in_use.subtract(self.rpc_servers)
            room = " or an RPC server without room for its share (`specrun doctor --rpc` shows their memory)" if self.rpc_servers else ""
            raise SpecrunError(
                f"llama.cpp could not load the {role} model {self.path} "
                f"(truncated or unsupported GGUF{room}? SPECRUN_DEBUG=1 shows llama.cpp's log)"
            )
        self._vocab_ptr = L.llama_model_get_vocab(self._model_ptr)
        self.n_vocab = L.llama_vocab_n_tokens(self._vocab)
        self._pieces: dict[int, bytes] = {}
        self._piece_buf = ctypes.create_string_buffer(256)

    def close(self) -> None:
        """Free the weights (and first every context over them); later calls raise Closed."""
        for context in list(self._contexts):
            context.close()
        if self._model_ptr:
            L.llama_model_free(self._model_ptr)
            self._model_ptr = self._vocab_ptr = None
            _rpc_in_use.subtract(self.rpc_servers)

    @property
    def closed(self) -> bool:
        return self._model_ptr is None

    @property
    def _model(self):
        if self._model_ptr is None:
            raise Closed(f"the {self.role} model {self.path.name} was closed: load it again to use it")
        return self._model_ptr

    @property
    def _vocab(self):
        self._model  # noqa: B018  (raises Closed once the model is freed)
        return self._vocab_ptr

    @property
    def n_ctx_train(self) -> int:
        return L.llama_model_n_ctx_train(self._model)

    @property
    def chat_template(self) -> str | None:
        template = L.llama_model_chat_template(self._model, None)
        return template.decode("utf-8", "replace") if template else None

    # --- vocabulary -----------------------------------------------------------------
    @property
    def bos(self) -> int:
        return L.llama_vocab_bos(self._vocab)

    @property
    def eos(self) -> int:
        return L.llama_vocab_eos(self._vocab)

    @property
    def add_bos(self) -> bool:
        return bool(L.llama_vocab_get_add_bos(self._vocab))

    @cached_property
    def eog_ids(self) -> frozenset[int]:
        return frozenset(t for t in range(self.n_vocab) if L.llama_vocab_is_eog(self._vocab, t))

    def vocab_facts(self) -> VocabFacts:
        texts = [L.llama_vocab_get_text(self._vocab, t) or b"" for t in range(self.n_vocab)]
        return VocabFacts(
            vocab_type=VOCAB_TYPES.get(L.llama_vocab_type(self._vocab), "unknown"),
            n_tokens=self.n_vocab,
            bos=self.bos,
            eos=self.eos,
            add_bos=self.add_bos,
            add_eos=bool(L.llama_vocab_get_add_eos(self._vocab)),
            tokens=[t.decode("utf-8", "replace") for t in texts],
        )

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buf = (L.llama_token * capacity)()
        n = L.llama_tokenize(self._vocab, data, len(data), buf, capacity, add_special, parse_special)
        if n < 0:  # buffer too small: -n is the size needed
            capacity = -n
            buf = (L.llama_token * capacity)()
            n = L.llama_tokenize(self._vocab, data, len(data), buf, capacity, add_special, parse_special)
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """Bytes of one token as it appears in text (control tokens render empty)."""
        cached = self._pieces.get(token)
        if cached is None:
            cached = self._pieces[token] = self._token_bytes(token, special=False)
        return cached

    def _token_bytes(self, token: int, special: bool) -> bytes:
        n = L.llama_token_to_piece(self._vocab, token, self._piece_buf, len(self._piece_buf), 0, special)
        return self._piece_buf.raw[: max(n, 0)]

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", "replace")

    def render(self, tokens: Sequence[int]) -> str:
        """Text of tokens with control tokens spelled out (`<end_of_turn>`), as chat templates write them."""
        return b"".join(self._token_bytes(t, special=True) for t in tokens).decode("utf-8", "replace")


class Context:
    """One KV cache (sequence 0) over a model; `tokens` is exactly what the cache holds."""

    def __init__(self, model: Model, options: ContextOptions = ContextOptions()):
        self.model = model
        self._ctx_ptr = None
        params = L.llama_context_default_params()
        params.n_ctx = options.n_ctx or model.n_ctx_train
        params.n_batch = options.n_batch
        params.n_ubatch = options.n_ubatch or options.n_batch
        threads = options.n_threads or os.cpu_count() or 1
        params.n_threads = params.n_threads_batch = threads
        params.flash_attn_type = options.flash_attn
        params.swa_full = True  # rollback inside the sliding window must stay possible
        params.no_perf = True
        self._ctx_ptr = L.llama_init_from_model(model._model, params)
        if not self._ctx_ptr:
            raise SpecrunError(
                f"llama.cpp could not create a {params.n_ctx}-token context for {model.path}: "
                "lower --ctx-size or offload fewer layers"
            )
        model._contexts.add(self)
        self.n_ctx = L.llama_n_ctx(self._ctx_ptr)
        self.n_batch = options.n_batch
        self.n_threads = threads
        self.tokens: list[int] = []
        self._batch = L.llama_batch_init(self.n_batch, 0, 1)
        # Zero-copy views of the batch arrays; seq ids never change, so set them once.
        self._batch_token = np.ctypeslib.as_array(self._batch.token, shape=(self.n_batch,))
        self._batch_pos = np.ctypeslib.as_array(self._batch.pos, shape=(self.n_batch,))
        self._batch_logits = np.ctypeslib.as_array(
            ctypes.cast(self._batch.logits, ctypes.POINTER(ctypes.c_int8)), shape=(self.n_batch,)
        )
        np.ctypeslib.as_array(self._batch.n_seq_id, shape=(self.n_batch,))[:] = 1
        for i in range(self.n_batch):
            self._batch.seq_id[i][0] = 0

    def close(self) -> None:
        """Free the cache; later calls raise Closed instead of touching freed memory."""
        if self._ctx_ptr:
            L.llama_batch_free(self._batch)
            L.llama_free(self._ctx_ptr)
            self._ctx_ptr = None

    @property
    def closed(self) -> bool:
        return self._ctx_ptr is None

    @property
    def _ctx(self):
        if self._ctx_ptr is None:
            raise Closed(f"the {self.model.role} model's context was closed: its KV cache is gone")
        return self._ctx_ptr

    @property
    def free_slots(self) -> int:
        return self.n_ctx - len(self.tokens)

    def eval(self, tokens: Sequence[int], logits_rows: int = 1) -> np.ndarray | None:
        """Append tokens to the cache; return logits for the last `logits_rows` of them.

        The returned array is a view into llama.cpp's buffer, valid until the next eval.
        """
        if not tokens:
            raise ValueError("eval needs at least one token")
        if logits_rows > self.n_batch:
            raise ValueError(f"at most n_batch={self.n_batch} logits rows per eval")
        if len(tokens) > self.free_slots:
            raise ContextFull(f"{len(tokens)} tokens do not fit in the {self.free_slots} free context slots: raise --ctx-size")
        rows = min(logits_rows, len(tokens))
        # Decoding on RPC servers is asynchronous: reading the logits is where it waits.
        with _watchdog.watching(self.model.rpc_servers, self.model.rpc_timeout):
            for start in range(0, len(tokens), self.n_batch):
                chunk = tokens[start : start + self.n_batch]
                rows_here = max(0, rows - (len(tokens) - start - len(chunk)))
                self._decode(chunk, min(rows_here, len(chunk)))
            return self.logits(rows) if rows else None

    def _decode(self, chunk: Sequence[int], logits_rows: int) -> None:
        ctx = self._ctx  # before writing into the batch: a closed context has freed it
        n = len(chunk)
        pos0 = len(self.tokens)
        self._batch.n_tokens = n
        self._batch_token[:n] = chunk
        self._batch_pos[:n] = np.arange(pos0, pos0 + n)
        self._batch_logits[:n] = 0
        self._batch_logits[n - logits_rows : n] = 1
        status = L.llama_decode(ctx, self._batch)
        if status == 1:
            raise ContextFull("llama.cpp found no KV cache slot for the batch: raise --ctx-size")
        if status != 0:
            raise SpecrunError(f"llama_decode failed with status {status} on the {self.model.role} model")
        self.tokens.extend(chunk)

    def logits(self, rows: int) -> np.ndarray:
        pointer = L.llama_get_logits(self._ctx)
        return np.ctypeslib.as_array(pointer, shape=(rows, self.model.n_vocab))

    def truncate(self, n_keep: int) -> None:
        """Roll the cache back to its first n_keep tokens."""
        if n_keep < len(self.tokens):
            if not L.llama_memory_seq_rm(L.llama_get_memory(self._ctx), 0, n_keep, -1):
                raise SpecrunError(
                    f"the {self.model.role} model cannot roll back its cache "
                    "(recurrent or hybrid architecture): speculative decoding is not supported for it"
                )
            del self.tokens[n_keep:]

    def reuse_prefix(self, history: Sequence[int]) -> int:
        """Keep the longest cached prefix of `history`, drop the rest; return its length."""
        limit = min(len(self.tokens), len(history))
        if self.tokens[:limit] == list(history[:limit]):  # the usual case, compared in C
            common = limit
        else:
            common = next(i for i in range(limit) if self.tokens[i] != history[i])
        self.truncate(common)
        return common


def system_info() -> dict[str, object]:
    """Versions, compiled backends and CPU features, for `specrun doctor`."""
    info = L.llama_print_system_info().decode("utf-8", "replace")
    libs = Path(L.__file__).parent / "lib"
    # The shared libraries carry llama.cpp's and ggml's versions in their file names.
    versions = sorted(p.name.split(".so.", 1)[0] + " " + p.name.split(".so.", 1)[1] for p in libs.glob("lib*.so.*.*.*"))
    return {
        "llama_cpp_python": LLAMA_CPP_VERSION,
        "libraries": versions,
        # llama_supports_gpu_offload() is also true for a CPU build with RPC: ask for local GPUs.
        "gpu_offload": bool(_local_gpu_devices()),
        "rpc": rpc_supported(),
        "mmap": bool(L.llama_supports_mmap()),
        "max_devices": int(L.llama_max_devices()),
        "system_info": info.strip(),
    }


# --- ggml's devices -------------------------------------------------------------------
DEVICE_TYPES = {0: "CPU", 1: "GPU", 2: "IGPU", 3: "ACCEL", 4: "META"}


class _DeviceCaps(ctypes.Structure):
    _fields_ = [(name, ctypes.c_bool) for name in ("is_async", "host_buffer", "buffer_from_host_ptr", "events", "mmap_support")]


class _DeviceProps(ctypes.Structure):  # struct ggml_backend_dev_props (ggml-backend.h)
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("description", ctypes.c_char_p),
        ("memory_free", ctypes.c_size_t),
        ("memory_total", ctypes.c_size_t),
        ("type", ctypes.c_int),
        ("device_id", ctypes.c_char_p),
        ("caps", _DeviceCaps),
    ]


_ABORT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
_ADD_SERVER = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)


def _declare(lib, name: str, restype, *argtypes) -> None:
    function = getattr(lib, name)
    function.restype, function.argtypes = restype, list(argtypes)


@cache
def _ggml():
    """libggml with the signatures of the device-registry calls specrun makes."""
    from llama_cpp import _ggml as ggml

    lib = ggml.libggml
    vp, size = ctypes.c_void_p, ctypes.c_size_t
    for name, restype, *args in (
        ("ggml_backend_reg_count", size),
        ("ggml_backend_reg_get", vp, size),
        ("ggml_backend_reg_name", ctypes.c_char_p, vp),
        ("ggml_backend_reg_by_name", vp, ctypes.c_char_p),
        ("ggml_backend_reg_get_proc_address", vp, vp, ctypes.c_char_p),
        ("ggml_backend_reg_dev_count", size, vp),
        ("ggml_backend_reg_dev_get", vp, vp, size),
        ("ggml_backend_dev_count", size),
        ("ggml_backend_dev_get", vp, size),
        ("ggml_backend_dev_name", ctypes.c_char_p, vp),
        ("ggml_backend_dev_description", ctypes.c_char_p, vp),
        ("ggml_backend_dev_type", ctypes.c_int, vp),
        ("ggml_backend_dev_backend_reg", vp, vp),
        ("ggml_backend_dev_memory", None, vp, ctypes.POINTER(size), ctypes.POINTER(size)),
        ("ggml_backend_dev_get_props", None, vp, ctypes.POINTER(_DeviceProps)),
        ("ggml_set_abort_callback", vp, _ABORT_CALLBACK),
    ):
        _declare(lib, name, restype, *args)
    return lib


def _device_memory(dev: int) -> tuple[int, int]:
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    _ggml().ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
    return free.value, total.value


def compiled_devices() -> tuple[list[str], list[dict[str, object]]]:
    """ggml's registered backends (CPU, CUDA, Metal, Vulkan, RPC, ...) and their local devices."""
    lib = _ggml()
    backends = [lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i)).decode() for i in range(lib.ggml_backend_reg_count())]
    devices = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        free, total = _device_memory(dev)
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


def _local_gpu_devices() -> list[int]:
    """The local devices llama.cpp offloads to when given no list (llama_prepare_model_devices):
    GPUs, one per device id, or integrated GPUs of one backend when there is no GPU."""
    lib = _ggml()
    gpus: list[int] = []
    igpus: list[int] = []
    seen_ids: set[bytes] = set()
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        kind = DEVICE_TYPES.get(lib.ggml_backend_dev_type(dev))
        if kind == "GPU":
            props = _DeviceProps()
            lib.ggml_backend_dev_get_props(dev, ctypes.byref(props))
            if props.device_id and props.device_id in seen_ids:
                continue  # the same GPU seen through a second backend
            seen_ids.add(props.device_id or b"")
            gpus.append(dev)
        elif kind == "IGPU" and (not igpus or lib.ggml_backend_dev_backend_reg(dev) == lib.ggml_backend_dev_backend_reg(igpus[-1])):
            igpus.append(dev)
    return gpus or igpus


def local_gpu_free_bytes() -> int | None:
    """Free memory summed over the local GPUs llama.cpp offloads to; None without any."""
    devices = _local_gpu_devices()
    return sum(_device_memory(dev)[0] for dev in devices) if devices else None


def _split_array(weights: tuple[float, ...], devices: list[int]) -> ctypes.Array:
    if not devices:
        raise SpecrunError("--tensor-split needs devices to split the layers over: give --rpc servers or use a GPU build")
    if len(weights) > len(devices):
        names = ", ".join(_device_label(dev) for dev in devices)
        raise SpecrunError(
            f"--tensor-split gives {len(weights)} weights, but the target has {len(devices)} devices to split over: {names}"
        )
    return (ctypes.c_float * int(L.llama_max_devices()))(*weights)


def _device_label(dev: int) -> str:
    lib = _ggml()
    return f"{lib.ggml_backend_dev_name(dev).decode()} ({lib.ggml_backend_dev_description(dev).decode()})"


# --- RPC servers ----------------------------------------------------------------------
RPC_BUILD = 'CMAKE_ARGS="-DGGML_RPC=on" pip install --force-reinstall --no-cache-dir "llama-cpp-python>=0.3.36,<0.4"'
_rpc_in_use: Counter[str] = Counter()  # endpoints that live models of this process hold a connection to


def rpc_supported() -> bool:
    """Whether this llama-cpp-python was built with llama.cpp's RPC backend."""
    return bool(L.llama_supports_rpc())


def rpc_servers(endpoints: tuple[str, ...]) -> list[rpc.RpcServer]:
    """Version and device memory of each server. A server this process already holds is asked
    through llama.cpp's own connection: an rpc-server would not answer a second one."""
    held = {e for e in endpoints if _rpc_in_use[e] > 0}
    checked = iter(rpc.check_servers(tuple(e for e in endpoints if e not in held), held=_held_endpoints()))
    servers = []
    for endpoint in endpoints:
        if endpoint in held:
            devices = tuple(rpc.DeviceMemory(*_device_memory(dev)) for dev in _rpc_server_devices(endpoint))
            servers.append(rpc.RpcServer(endpoint, None, devices))
        else:
            servers.append(next(checked))
    return servers


def _held_endpoints() -> tuple[str, ...]:
    return tuple(e for e, n in _rpc_in_use.items() if n > 0)


def check_rpc(endpoints: tuple[str, ...]) -> list[rpc.RpcServer]:
    """That this build can use RPC servers and each of them answers, or one line saying why not."""
    if not rpc_supported():
        raise SpecrunError(f"this llama-cpp-python was built without llama.cpp's RPC backend, needed by --rpc: {RPC_BUILD}")
    return rpc_servers(endpoints)


def _offload_devices(endpoints: tuple[str, ...]) -> list[int]:
    """The devices a model with layers on `endpoints` offloads to: the RPC servers' devices in
    the order given (llama.cpp puts RPC first to keep transfers down), then the local GPUs."""
    check_rpc(endpoints)  # a server that is down, busy or of another version: one clear line, no abort
    _watch_aborts()
    devices = [dev for endpoint in endpoints for dev in _rpc_server_devices(endpoint)]
    return devices + _local_gpu_devices()


def _rpc_server_devices(endpoint: str) -> list[int]:
    """llama.cpp's devices for one server (ggml_backend_rpc_add_server, as llama.cpp's --rpc does;
    it keeps one registry per endpoint, so asking again is free)."""
    lib = _ggml()
    rpc_reg = lib.ggml_backend_reg_by_name(b"RPC")
    add_server = _ADD_SERVER(lib.ggml_backend_reg_get_proc_address(rpc_reg, b"ggml_backend_rpc_add_server"))
    # The server answered specrun's check a moment ago, but llama.cpp would wait for ever if it stops now.
    with _watchdog.watching((endpoint,), rpc.ANSWER_TIMEOUT_S, "at the RPC hello"):
        server_reg = add_server(endpoint.encode())
    if not server_reg:
        raise SpecrunError(f"RPC server {endpoint} has no devices to hold layers: start rpc-server with a device")
    return [lib.ggml_backend_reg_dev_get(server_reg, i) for i in range(lib.ggml_backend_reg_dev_count(server_reg))]


# --- when an RPC server goes away ----------------------------------------------------
# llama.cpp cannot carry on without a server: the layers it held are gone, and its RPC client
# ends the process (GGML_ABORT) when a connection fails. specrun turns that into one line and
# exit status 1; a decode that waits longer than rpc_timeout ends the same way, as the client
# would otherwise wait forever for a server that is stuck or a network that dropped.
RPC_LOST_EXIT = 1


@cache
def _watch_aborts() -> None:
    _ggml().ggml_set_abort_callback(_on_ggml_abort)


@_ABORT_CALLBACK
def _on_ggml_abort(message: bytes) -> None:
    text = message.decode("utf-8", "replace")
    line = _rpc_abort_line(text)
    if line is None or os.environ.get("SPECRUN_DEBUG"):
        print(text, file=sys.stderr)  # what ggml prints without a callback
    if line is not None:
        _exit_with(line)  # otherwise ggml's abort() follows


def _rpc_abort_line(text: str) -> str | None:
    """One line for the aborts of ggml-rpc.cpp's client; None for any other abort."""
    if "Failed to connect to " in text:
        endpoint = text.split("Failed to connect to ", 1)[1].strip()
        return f"RPC server {endpoint} cannot be reached any more (llama.cpp could not connect): is rpc-server still running there?"
    if "RPC handshake failed for " in text:
        endpoint = text.split("RPC handshake failed for ", 1)[1].strip()
        said = next((line.strip() for line in reversed(_recent_log) if "version mismatch" in line), "")
        return (f"RPC server {endpoint} speaks another RPC protocol version than this llama-cpp-python"
                f"{f' ({said})' if said else ''}: build rpc-server from the llama.cpp that llama-cpp-python bundles")
    if "Remote RPC server crashed" in text:
        held = _held_endpoints()
        return _lost_line(held, f"an RPC server ({', '.join(held)}) closed the connection or sent a malformed reply: "
                                "restart rpc-server and run again")
    return None


def _lost_line(endpoints: tuple[str, ...], otherwise: str) -> str:
    """Names the servers that no longer take connections; `otherwise` when all still do."""
    lost = rpc.lost_servers(endpoints)
    if not lost:
        return otherwise
    return (f"lost RPC server {', '.join(lost)}: it no longer accepts connections (stopped, or its machine or "
            "network went down); the layers it held are gone: restart rpc-server and run again")


def _exit_with(line: str) -> None:
    try:
        sys.stdout.flush()
    except Exception:  # a broken stdout must not stop the message
        pass
    os.write(2, f"error: {line}\n".encode())
    os._exit(RPC_LOST_EXIT)


class _Watchdog:
    """Ends the process with one line when a call waits on RPC servers past its timeout."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._waiting: dict[int, tuple[float, tuple[str, ...], str]] = {}  # ticket: deadline, servers, message
        self._next = 0
        self._thread: threading.Thread | None = None

    @contextmanager
    def watching(self, servers: tuple[str, ...], timeout: float, doing: str = "during a decode") -> Iterator[None]:
        """Watch the block when it waits on `servers` (none: nothing to watch; timeout 0: forever)."""
        if not servers or timeout <= 0:
            yield
            return
        hint = " (raise --rpc-timeout if decodes are this slow)" if doing == "during a decode" else ""
        message = (f"no answer from the RPC servers ({', '.join(servers)}) for {timeout:g} s {doing}: "
                   f"one is stuck or the network is down{hint}")
        ticket = self._arm(timeout, servers, message)
        try:
            yield
        finally:
            self._disarm(ticket)

    def _arm(self, timeout: float, servers: tuple[str, ...], message: str) -> int:
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="specrun-rpc-watchdog", daemon=True)
                self._thread.start()
            self._next += 1
            self._waiting[self._next] = (time.monotonic() + timeout, servers, message)
            self._cond.notify()
            return self._next

    def _disarm(self, ticket: int) -> None:
        with self._cond:
            self._waiting.pop(ticket, None)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._waiting:
                    self._cond.wait()
                deadline, servers, message = min(self._waiting.values())
                left = deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
            _exit_with(_lost_line(servers, message))


_watchdog = _Watchdog()
