"""The one package that talks to llama.cpp's ctypes API (llama-cpp-python's raw bindings).

- library: llama-cpp-python imported, checked and initialised on first use; libggml's signatures.
- model: `Model` (weights, vocabulary); context: `Context` (one KV cache); info: system_info.
- threads: `ThreadPool`, the CPU threads that the contexts of one session decode on, in turn.
- devices: ggml's device registry, the local GPUs, the --tensor-split array.
- rpc_link: the RPC servers this process holds, and the thread every call that can wait on
  them goes through, so that a lost or stuck server raises RpcLost or RpcTimeout.

Importing it loads libllama, before the modules below import numpy (`load_before_numpy`);
llama.cpp is initialised by the first call that needs it.
"""

from specrun.backend.library import load_before_numpy

load_before_numpy()

from specrun.backend.context import Context, ContextFull, ContextOptions
from specrun.backend.devices import compiled_devices, local_gpu_free_bytes
from specrun.backend.info import system_info
from specrun.backend.library import MIN_VERSION, RAW_API, check_install, llama_cpp_version
from specrun.backend.model import Closed, FimTokens, Model, ModelOptions, check_gguf_file
from specrun.backend.rpc_link import RPC_BUILD, check_rpc, rpc_servers, rpc_supported
from specrun.backend.threads import ThreadPool

__all__ = [
    "MIN_VERSION",
    "RAW_API",
    "RPC_BUILD",
    "Closed",
    "Context",
    "ContextFull",
    "ContextOptions",
    "FimTokens",
    "Model",
    "ModelOptions",
    "ThreadPool",
    "check_gguf_file",
    "check_install",
    "check_rpc",
    "compiled_devices",
    "llama_cpp_version",
    "local_gpu_free_bytes",
    "rpc_servers",
    "rpc_supported",
    "system_info",
]
