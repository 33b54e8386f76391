"""llama.cpp's models and contexts: a `Model` holds weights and vocabulary; a `Context` is one
KV cache over a model that remembers which tokens it holds, so callers roll back by length
and reuse prefixes.

A model with layers on RPC servers makes every call that can wait on them through the RPC
link (rpc_link.py), which raises RpcLost or RpcTimeout instead of letting llama.cpp end the
process; a local model calls llama.cpp directly, with nothing added per decode.
"""

from __future__ import annotations

import ctypes
import os
import weakref
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from specrun.backend import rpc_link
from specrun.backend.compat import VocabFacts
from specrun.backend.devices import local_gpu_devices, split_array
from specrun.backend.library import llama, llama_cpp_version
from specrun.core.sequences import common_prefix
from specrun.errors import RpcLost, SpecrunError

VOCAB_TYPES = {0: "none", 1: "spm", 2: "bpe", 3: "wpm", 4: "ugm", 5: "rwkv", 6: "plamo2"}
GGUF_MAGIC = b"GGUF"


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
    vocab_only: bool = False  # the tokenizer alone, no weights (a second or less, even for a 262k vocabulary)


@dataclass(frozen=True)
class ContextOptions:
    n_ctx: int = 4096  # 0 means the model's training context
    n_batch: int = 512  # largest single decode; verify batches are k + 1 rows
    n_ubatch: int = 0  # rows llama.cpp computes at once (0: n_batch); changes batched numerics
    n_threads: int = 0  # 0 means every core
    flash_attn: int = -1  # -1 auto, 0 off, 1 on


def check_gguf_file(path: Path, role: str, weights: bool = True) -> None:
    """Fail with one line for the usual bad inputs, before llama.cpp sees the file; `weights`: it
    has to hold them (not for a tokenizer alone)."""
    if not path.exists():
        raise SpecrunError(f"{role} model not found: {path} (check the path)")
    if path.is_dir():
        raise SpecrunError(f"{role} model is a directory, not a GGUF file: {path}")
    with path.open("rb") as fh:
        header = fh.read(16)  # magic, version, tensor count (little-endian u32, u32, u64)
    if header[:4] != GGUF_MAGIC:
        raise SpecrunError(f"{role} model is not a GGUF file (bad magic {header[:4]!r}): {path}")
    if weights and len(header) == 16 and int.from_bytes(header[8:16], "little") == 0:
        raise SpecrunError(f"{role} model {path} holds no weights (no tensors: a vocab-only GGUF, a tokenizer): "
                           "give a GGUF with the model's weights")


class Model:
    """Weights and vocabulary of one GGUF."""

    def __init__(self, path: str | Path, options: ModelOptions = ModelOptions(), role: str = "target"):
        self.path = Path(path)
        self.role = role
        self._model_ptr = self._vocab_ptr = None
        self._contexts: weakref.WeakSet[Context] = weakref.WeakSet()  # closed before the weights
        self.rpc_servers = options.rpc_servers
        self.rpc_timeout = options.rpc_timeout
        # With RPC servers every call that can wait on them goes through the link; else llama.cpp directly.
        self._link = rpc_link.LINK if options.rpc_servers else None
        self._waiting = rpc_link.Waiting(options.rpc_servers, options.rpc_timeout)
        check_gguf_file(self.path, role, weights=not options.vocab_only)
        L = llama()
        params = L.llama_model_default_params()
        params.vocab_only = options.vocab_only
        params.n_gpu_layers = options.n_gpu_layers
        params.use_mmap = options.use_mmap
        params.use_extra_bufts = options.repack
        # The arrays must live until llama.cpp has read them during the load.
        devices = rpc_link.offload_devices(options.rpc_servers) if options.rpc_servers else None
        device_array = split = None
        if devices is not None:
            device_array = (ctypes.c_void_p * (len(devices) + 1))(*devices, None)
            params.devices = ctypes.cast(device_array, ctypes.c_void_p)
        if options.tensor_split:
            split = split_array(options.tensor_split, devices if devices is not None else local_gpu_devices())
            params.tensor_split = split
        self._model_ptr = self._load(params, device_array, split)
        self._vocab_ptr = L.llama_model_get_vocab(self._model_ptr)
        self.n_vocab = L.llama_vocab_n_tokens(self._vocab)
        self._pieces: dict[int, bytes] = {}
        self._piece_buf = ctypes.create_string_buffer(256)

    def _load(self, params, *arrays: ctypes.Array | None):
        """The weights, loaded; `arrays` are what params points into."""
        rpc_link.hold(self.rpc_servers)
        pointer = None
        try:
            # Not timed: uploading the weights to the servers may take long.
            waiting = rpc_link.Waiting(self.rpc_servers, 0, "while loading the model")
            pointer = self._call_llama(_load_from_file, str(self.path).encode(), params, arrays, waiting=waiting)
        finally:
            if not pointer:
                rpc_link.release(self.rpc_servers)
        if not pointer:
            room = " or an RPC server without room for its share (`specrun doctor --rpc` shows their memory)" if self.rpc_servers else ""
            raise SpecrunError(
                f"llama.cpp could not load the {self.role} model {self.path} "
                f"(truncated or unsupported GGUF{room}? SPECRUN_DEBUG=1 shows llama.cpp's log)"
            )
        return pointer

    def _call_llama(self, fn: Callable[..., Any], *args: Any, waiting: rpc_link.Waiting | None = None) -> Any:
        """fn(*args): directly for a local model, through the RPC link for one on RPC servers."""
        if self._link is None:
            return fn(*args)
        return self._link.call(waiting or self._waiting, fn, *args)

    def _free(self, free: Callable[..., None], *pointers: Any) -> None:
        try:
            self._call_llama(free, *pointers)
        except RpcLost:
            pass  # the model is lost: its memory stays, as a parked llama.cpp thread may still be inside it

    def close(self) -> None:
        """Free the weights (and first every context over them); later calls raise Closed."""
        for context in list(self._contexts):
            context.close()
        if self._model_ptr:
            L = llama()
            pointer, self._model_ptr, self._vocab_ptr = self._model_ptr, None, None
            rpc_link.release(self.rpc_servers)
            self._free(L.llama_model_free, pointer)

    @property
    def closed(self) -> bool:
        return self._model_ptr is None

    @property
    def lost(self) -> bool:
        """Whether an RPC server this model needs went away (or stopped answering): it decodes no more."""
        return self._link is not None and self._link.lost

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
        L = llama()
        return L.llama_model_n_ctx_train(self._model)

    @property
    def chat_template(self) -> str | None:
        L = llama()
        template = L.llama_model_chat_template(self._model, None)
        return template.decode("utf-8", "replace") if template else None

    # --- vocabulary -----------------------------------------------------------------
    @property
    def bos(self) -> int:
        L = llama()
        return L.llama_vocab_bos(self._vocab)

    @property
    def eos(self) -> int:
        L = llama()
        return L.llama_vocab_eos(self._vocab)

    @property
    def add_bos(self) -> bool:
        L = llama()
        return bool(L.llama_vocab_get_add_bos(self._vocab))

    @cached_property
    def eog_ids(self) -> frozenset[int]:
        L = llama()
        return frozenset(t for t in range(self.n_vocab) if L.llama_vocab_is_eog(self._vocab, t))

    @cached_property
    def byte_tokens(self) -> frozenset[int]:
        """The byte-fallback tokens (SentencePiece's <0x41>): they stand for one byte each."""
        L = llama()
        return frozenset(t for t in range(self.n_vocab) if L.llama_vocab_get_attr(self._vocab, t) & L.LLAMA_TOKEN_ATTR_BYTE)

    def vocab_facts(self) -> VocabFacts:
        return self._vocab_facts

    @cached_property
    def _vocab_facts(self) -> VocabFacts:
        """Read once: the vocabulary never changes, and 262k token texts take a moment."""
        L = llama()
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

    @property
    def eot(self) -> int:
        """The end-of-turn token, or -1 when the vocabulary has none."""
        L = llama()
        return L.llama_vocab_eot(self._vocab)

    @property
    def turn_end(self) -> int:
        """The token that ends a turn or a reply: end-of-turn where the vocabulary has one, else end-of-sequence."""
        return self.eot if self.eot >= 0 else self.eos

    def tokenize(self, text: str | bytes, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of `text` (str, or UTF-8 bytes that may end inside a character)."""
        L = llama()
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
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
            cached = self._pieces[token] = self.token_bytes(token, special=False)
        return cached

    def token_bytes(self, token: int, special: bool) -> bytes:
        """Bytes of one token; `special` spells control tokens out (`<end_of_turn>`) instead of rendering them empty."""
        L = llama()
        n = L.llama_token_to_piece(self._vocab, token, self._piece_buf, len(self._piece_buf), 0, special)
        return self._piece_buf.raw[: max(n, 0)]

    def pieces(self) -> list[bytes]:
        """Every token's bytes as `piece` gives them, by id (b"" for control tokens)."""
        return self._all_pieces

    @cached_property
    def _all_pieces(self) -> list[bytes]:
        return [self.piece(token) for token in range(self.n_vocab)]

    @cached_property
    def prefix_tokens(self) -> frozenset[int]:
        """Tokens whose bytes begin a longer token's: text that ends with one may still be written
        with a longer token instead."""
        by_bytes = sorted((piece, token) for token, piece in enumerate(self.pieces()) if piece)
        return frozenset(token for (piece, token), (after, _) in zip(by_bytes, by_bytes[1:])
                         if len(after) > len(piece) and after.startswith(piece))

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", "replace")

    def render(self, tokens: Sequence[int]) -> str:
        """Text of tokens with control tokens spelled out (`<end_of_turn>`), as chat templates write them."""
        return b"".join(self.token_bytes(t, special=True) for t in tokens).decode("utf-8", "replace")


def _load_from_file(path: bytes, params, keep_alive: tuple) -> Any:
    """llama_model_load_from_file; `keep_alive` holds what params points into while llama.cpp reads it."""
    L = llama()
    return L.llama_model_load_from_file(path, params)


class Context:
    """One KV cache (sequence 0) over a model; `tokens` is exactly what the cache holds."""

    def __init__(self, model: Model, options: ContextOptions = ContextOptions()):
        self.model = model
        self._ctx_ptr = None
        L = llama()
        params = L.llama_context_default_params()
        params.n_ctx = options.n_ctx or model.n_ctx_train
        params.n_batch = options.n_batch
        params.n_ubatch = options.n_ubatch or options.n_batch
        threads = options.n_threads or os.cpu_count() or 1
        params.n_threads = params.n_threads_batch = threads
        params.flash_attn_type = options.flash_attn
        params.swa_full = True  # rollback inside the sliding window must stay possible
        params.no_perf = True
        waiting = rpc_link.Waiting(model.rpc_servers, model.rpc_timeout, "while creating a context")
        self._ctx_ptr = model._call_llama(L.llama_init_from_model, model._model, params, waiting=waiting)
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
            pointer, self._ctx_ptr = self._ctx_ptr, None
            self.model._free(_free_context, self._batch, pointer)

    @property
    def closed(self) -> bool:
        """Closed, or lost with an RPC server: either way its cache takes no more decodes."""
        return self._ctx_ptr is None or self.model.lost

    @property
    def _ctx(self):
        if self._ctx_ptr is None:
            raise Closed(f"the {self.model.role} model's context was closed: its KV cache is gone")
        return self._ctx_ptr

    @property
    def free_slots(self) -> int:
        return self.n_ctx - len(self.tokens)

    def eval(self, tokens: Sequence[int], logits_rows: int = 1) -> np.ndarray:
        """Append tokens to the cache; return logits for the last `logits_rows` of them.

        The returned array is a view into llama.cpp's buffer, valid until the next eval.
        """
        if not tokens:
            raise ValueError("eval needs at least one token")
        if not 1 <= logits_rows <= self.n_batch:
            raise ValueError(f"from 1 to n_batch={self.n_batch} logits rows per eval, not {logits_rows}")
        if len(tokens) > self.free_slots:
            raise ContextFull(f"{len(tokens)} tokens do not fit in the {self.free_slots} free context slots: raise --ctx-size")
        return self.model._call_llama(self._eval, tokens, min(logits_rows, len(tokens)))

    def _eval(self, tokens: Sequence[int], rows: int) -> np.ndarray:
        # Decoding on RPC servers is asynchronous: reading the logits is where it waits, so both are one call.
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            rows_here = max(0, rows - (len(tokens) - start - len(chunk)))
            self._decode(chunk, min(rows_here, len(chunk)))
        return self._logits(rows)

    def _decode(self, chunk: Sequence[int], logits_rows: int) -> None:
        L = llama()
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
        """The last eval's logits for its last `rows` rows (a view, valid until the next eval)."""
        return self.model._call_llama(self._logits, rows)

    def _logits(self, rows: int) -> np.ndarray:
        L = llama()
        pointer = L.llama_get_logits(self._ctx)
        return np.ctypeslib.as_array(pointer, shape=(rows, self.model.n_vocab))

    def truncate(self, n_keep: int) -> None:
        """Roll the cache back to its first n_keep tokens."""
        if n_keep < len(self.tokens):
            self.model._call_llama(self._remove_from, n_keep)
            del self.tokens[n_keep:]

    def _remove_from(self, n_keep: int) -> None:
        L = llama()
        if not L.llama_memory_seq_rm(L.llama_get_memory(self._ctx), 0, n_keep, -1):
            raise SpecrunError(
                f"the {self.model.role} model cannot roll back its cache "
                "(recurrent or hybrid architecture): speculative decoding is not supported for it"
            )

    def reuse_prefix(self, history: Sequence[int]) -> int:
        """Keep the longest cached prefix of `history`, drop the rest; return its length."""
        common = common_prefix(self.tokens, history)
        self.truncate(common)
        return common


def _free_context(batch, ctx) -> None:
    L = llama()
    L.llama_batch_free(batch)
    L.llama_free(ctx)


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
