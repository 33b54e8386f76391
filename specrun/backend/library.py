"""llama-cpp-python's raw bindings and libggml: imported, checked and initialised on first use.

Nothing here runs at import. The first call that needs llama.cpp imports llama-cpp-python,
checks its version and every raw call specrun makes (an old or renamed release fails in one
line, not with an AttributeError halfway through a generation), keeps llama.cpp's log for
specrun's own messages and initialises its backends, once.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
from collections import deque
from functools import cache
from types import ModuleType
from typing import Any, NamedTuple

from specrun.errors import SpecrunError

INSTALL_HINT = "run `pip install 'llama-cpp-python>=0.3.36,<0.4'`"
MIN_VERSION = (0, 3, 36)  # the first release with the llama_memory_* calls used here
# Every raw call this package makes (tests/test_pinned_apis.py checks the list is complete).
RAW_API = (
    "llama_backend_init",
    "llama_batch_free",
    "llama_batch_init",
    "llama_context_default_params",
    "llama_decode",
    "llama_free",
    "llama_get_logits",
    "llama_get_memory",
    "llama_init_from_model",
    "llama_log_callback",
    "llama_log_set",
    "llama_max_devices",
    "llama_memory_seq_cp",
    "llama_memory_seq_rm",
    "llama_model_chat_template",
    "llama_model_default_params",
    "llama_model_free",
    "llama_model_get_vocab",
    "llama_model_load_from_file",
    "llama_model_n_ctx_train",
    "llama_n_ctx",
    "llama_print_system_info",
    "llama_sampler_accept",
    "llama_sampler_apply",
    "llama_sampler_clone",
    "llama_sampler_free",
    "llama_sampler_init_grammar",
    "llama_token_data",
    "llama_token_data_array",
    "llama_supports_gpu_offload",
    "llama_supports_mmap",
    "llama_supports_rpc",
    "llama_token",
    "llama_token_to_piece",
    "llama_tokenize",
    "llama_vocab_bos",
    "llama_vocab_eos",
    "llama_vocab_get_add_bos",
    "llama_vocab_eot",
    "llama_vocab_get_add_eos",
    "llama_vocab_get_attr",
    "llama_vocab_get_text",
    "llama_vocab_is_eog",
    "llama_vocab_n_tokens",
    "llama_vocab_type",
    "LLAMA_TOKEN_ATTR_BYTE",
    # recurrent and hybrid models: their snapshots, and checkpoints of their state
    "llama_model_is_recurrent",
    "llama_model_is_hybrid",
    "llama_n_rs_seq",
    "llama_state_seq_get_size_ext",
    "llama_state_seq_get_data_ext",
    "llama_state_seq_set_data_ext",
    "LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY",
    # a model's own MTP (NextN) layers, on a context of their own whose rows carry a hidden state
    "llama_model_n_layer_nextn",
    "llama_model_n_embd_out",
    "llama_model_meta_val_str",
    "LLAMA_CONTEXT_TYPE_MTP",
    # a trained drafter (EAGLE-3) beside its target: widths, and its encoder's pass
    "llama_model_n_embd",
    "llama_model_n_layer",
    "llama_encode",
    "llama_memory_seq_pos_max",
    # a block drafter (DFlash) attends both ways within its block
    "llama_set_causal_attn",
)
# The staging calls llama-cpp-python binds from llama.cpp's src/llama-ext.h (llama_cpp.llama_cpp_ext):
# the hidden rows an MTP head reads. They may change with llama.cpp; pinned by tests/test_pinned_apis.py.
EXT_API = ("llama_set_embeddings_nextn", "llama_get_embeddings_nextn")

# Staging calls of src/llama-ext.h that llama-cpp-python does not bind, for the trained drafters
# that read the target's layer inputs (EAGLE-3): found by their exported C++ (Itanium) names, as
# llama_cpp_ext finds the ones it binds. Name: (mangled name, result type, argument types).
_VP, _U32 = ctypes.c_void_p, ctypes.c_uint32
DRAFTER_API: dict[str, tuple[str, Any, list[Any]]] = {
    "llama_set_embeddings_layer_inp": ("_Z30llama_set_embeddings_layer_inpP13llama_contextjb", None, [_VP, _U32, ctypes.c_bool]),
    "llama_get_embeddings_layer_inp": (
        "_Z30llama_get_embeddings_layer_inpP13llama_contextj",
        ctypes.POINTER(ctypes.c_float),
        [_VP, _U32],
    ),
}

_recent_log: deque[str] = deque(maxlen=8)  # llama.cpp's last lines, for the message when it aborts


def check_install() -> None:
    """That llama-cpp-python imports and has every raw call specrun makes, or one line saying
    what to install. Cheap after the first call; llama.cpp is not initialised by it."""
    _bindings()


def load_before_numpy() -> None:
    """Load libllama now (llama-cpp-python's own loader, which imports numpy after it), unless it is
    loaded already. On a CUDA build a model load crashed inside llama.cpp whenever numpy had been
    imported before libllama was loaded (docs/troubleshooting.md), so every entry point loads it
    first. A missing or broken llama-cpp-python is left for its first use to report in one line."""
    try:
        _bindings()
    except SpecrunError:
        pass


def llama_cpp_version() -> str:
    """The version of the llama-cpp-python that specrun runs on."""
    return str(getattr(_bindings(), "__version__", "unknown"))


def older_than_supported(version: str) -> bool:
    """Whether a llama-cpp-python version string is below MIN_VERSION."""
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3]) < MIN_VERSION


@cache
def _bindings() -> ModuleType:
    # Imported here, not at the top: a missing or broken llama-cpp-python must become one
    # line at the first use (or check_install), and importing specrun.backend loads nothing.
    try:
        import llama_cpp
    except Exception as exc:  # ImportError, or the loader's error when libllama itself fails to load
        raise SpecrunError(f"llama-cpp-python is not importable ({exc}): {INSTALL_HINT}") from None
    version = str(getattr(llama_cpp, "__version__", "unknown"))
    missing = [name for name in RAW_API if not hasattr(llama_cpp, name)]
    if missing or older_than_supported(version):
        lacks = f" (it lacks {missing[0]})" if missing else ""
        raise SpecrunError(f"llama-cpp-python {version} is older than specrun needs{lacks}: {INSTALL_HINT}")
    return llama_cpp


@cache
def llama() -> ModuleType:
    """llama-cpp-python's raw bindings, with llama.cpp initialised (on the first call only)."""
    L = _bindings()
    L.llama_log_set(_log_callback(L), ctypes.c_void_p(0))
    L.llama_backend_init()
    return L


@cache
def llama_ext() -> ModuleType:
    """llama-cpp-python's bindings of llama.cpp's staging API (EXT_API), llama.cpp initialised."""
    llama()
    try:
        from llama_cpp import llama_cpp_ext
    except Exception as exc:
        raise SpecrunError(
            f"llama-cpp-python {llama_cpp_version()} lacks llama.cpp's staging API ({exc}): {INSTALL_HINT}"
        ) from None
    missing = [name for name in EXT_API if not hasattr(llama_cpp_ext, name)]
    if missing:
        raise SpecrunError(f"llama-cpp-python {llama_cpp_version()} lacks {missing[0]}, which MTP drafts need: {INSTALL_HINT}")
    return llama_cpp_ext


@cache
def drafter_calls() -> ModuleType:
    """DRAFTER_API's calls, llama.cpp initialised; one line where this build lacks one."""
    llama()
    from llama_cpp.llama_cpp import _lib as libllama  # the library llama-cpp-python loaded

    calls = ModuleType("drafter_calls")
    for name, (mangled, restype, argtypes) in DRAFTER_API.items():
        function = getattr(libllama, name, None) or getattr(libllama, mangled, None)
        if function is None:
            raise SpecrunError(f"this llama.cpp lacks {name}, which EAGLE-3 drafters need: {INSTALL_HINT}")
        function.restype, function.argtypes = restype, argtypes
        setattr(calls, name, function)
    return calls


@cache
def _log_callback(L: ModuleType):
    """The C callback llama.cpp logs through; cached, so it lives as long as llama.cpp may call it."""

    @L.llama_log_callback
    def keep_line(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        # llama.cpp is chatty on stderr; users see specrun's one-line errors instead.
        line = text.decode("utf-8", "replace")
        _recent_log.append(line)
        if os.environ.get("SPECRUN_DEBUG"):
            print(line, end="", file=sys.stderr)

    return keep_line


def recent_log() -> list[str]:
    """llama.cpp's last few log lines, oldest first."""
    return list(_recent_log)


# --- libggml: the device registry and the abort callback ---------------------------------
class DeviceCaps(ctypes.Structure):  # struct ggml_backend_dev_caps (ggml-backend.h)
    _fields_ = [(name, ctypes.c_bool) for name in ("is_async", "host_buffer", "buffer_from_host_ptr", "events", "mmap_support")]


class DeviceProps(ctypes.Structure):  # struct ggml_backend_dev_props (ggml-backend.h)
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("description", ctypes.c_char_p),
        ("memory_free", ctypes.c_size_t),
        ("memory_total", ctypes.c_size_t),
        ("type", ctypes.c_int),
        ("device_id", ctypes.c_char_p),
        ("caps", DeviceCaps),
    ]


class ThreadPoolParams(ctypes.Structure):  # struct ggml_threadpool_params (ggml.h)
    _fields_ = [
        ("cpumask", ctypes.c_bool * 512),  # GGML_MAX_N_THREADS
        ("n_threads", ctypes.c_int),
        ("prio", ctypes.c_int),  # enum ggml_sched_priority
        ("poll", ctypes.c_uint32),
        ("strict_cpu", ctypes.c_bool),
        ("paused", ctypes.c_bool),
    ]


ABORT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)  # ggml_abort_callback_t
ADD_SERVER = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)  # ggml_backend_rpc_add_server


def _declare(lib, name: str, restype, *argtypes) -> None:
    function = getattr(lib, name)
    function.restype, function.argtypes = restype, list(argtypes)


@cache
def ggml():
    """libggml with the signatures of the calls specrun makes (llama.cpp initialised first)."""
    llama()
    from llama_cpp import _ggml  # loads with the bindings that llama() has just checked

    lib = _ggml.libggml
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
        ("ggml_backend_dev_get_props", None, vp, ctypes.POINTER(DeviceProps)),
        ("ggml_set_abort_callback", vp, ABORT_CALLBACK),
        ("ggml_threadpool_params_init", None, ctypes.POINTER(ThreadPoolParams), ctypes.c_int),
    ):
        _declare(lib, name, restype, *args)
    return lib


class ThreadPoolCalls(NamedTuple):
    new: Any  # ggml_threadpool_new (ggml-cpu.h)
    free: Any  # ggml_threadpool_free
    attach: Any  # llama_attach_threadpool (llama.h)


@cache
def thread_pool_calls() -> ThreadPoolCalls | None:
    """ggml's CPU thread pools, found through the CPU backend's registry as llama.cpp's tools find
    them, and llama.cpp's call that attaches one to a context, which llama-cpp-python does not
    bind (a TODO in its llama_cpp.py); None where the CPU backend offers no pools."""
    lib = ggml()
    cpu = lib.ggml_backend_reg_by_name(b"CPU")
    new_at, free_at = (lib.ggml_backend_reg_get_proc_address(cpu, name) if cpu else None for name in _POOL_CALLS)
    if not (new_at and free_at):
        return None
    vp = ctypes.c_void_p
    new = ctypes.CFUNCTYPE(vp, ctypes.POINTER(ThreadPoolParams))(new_at)
    free = ctypes.CFUNCTYPE(None, vp)(free_at)
    from llama_cpp.llama_cpp import _lib as libllama  # the library llama-cpp-python loaded

    _declare(libllama, "llama_attach_threadpool", None, vp, vp, vp)
    return ThreadPoolCalls(new, free, libllama.llama_attach_threadpool)


_POOL_CALLS = (b"ggml_threadpool_new", b"ggml_threadpool_free")
