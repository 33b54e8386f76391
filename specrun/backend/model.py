"""A llama.cpp model: weights and vocabulary (`Model`); its KV caches are `Context`s (context.py).

A model with layers on RPC servers makes every call that can wait on them through the RPC
link (rpc_link.py), which raises RpcLost or RpcTimeout instead of letting llama.cpp end the
process; a local model calls llama.cpp directly, with nothing added per decode.
"""

from __future__ import annotations

import ctypes
import weakref
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

from specrun.backend import rpc_link
from specrun.backend.compat import VocabFacts
from specrun.backend.devices import device_by_name, local_gpu_devices, split_array
from specrun.backend.library import llama
from specrun.errors import RpcLost, SpecrunError

PIECE_BYTES = 256  # a token's text fits in this almost always; a longer one is read again
VOCAB_TYPES = {0: "none", 1: "spm", 2: "bpe", 3: "wpm", 4: "ugm", 5: "rwkv", 6: "plamo2"}
GGUF_MAGIC = b"GGUF"


class Closed(SpecrunError):
    """A model or context used after close(): llama.cpp has freed its memory, so it refuses."""


@dataclass(frozen=True)
class ModelOptions:
    n_gpu_layers: int = -1  # -1 offloads every layer when a GPU backend or RPC server exists
    use_mmap: bool = True
    repack: bool = False  # CPU weight repacking (use_extra_bufts); changes batched numerics
    rpc_servers: tuple[str, ...] = ()  # HOST:PORT of llama.cpp rpc-servers that take offloaded layers
    tensor_split: tuple[float, ...] = ()  # share of the offloaded layers per device, RPC devices first
    devices: tuple[str, ...] = ()  # local ggml devices that take the offloaded layers, by name (llama.cpp's --device)
    rpc_timeout: float = 300.0  # seconds one decode may wait for the RPC servers; 0 waits forever
    vocab_only: bool = False  # the tokenizer alone, no weights (a second or less, even for a 262k vocabulary)
    load_mtp: bool = False  # also load the model's MTP (NextN) layers, which draft for it


class FimTokens(NamedTuple):
    """A vocabulary's fill-in-the-middle tokens: prefix, suffix, middle (all three, or no infill),
    and the repository and file separators of repo-level prompts (None: the vocabulary has none)."""

    pre: int | None
    suf: int | None
    mid: int | None
    rep: int | None
    sep: int | None


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
        raise SpecrunError(
            f"{role} model {path} holds no weights (no tensors: a vocab-only GGUF, a tokenizer): "
            "give a GGUF with the model's weights"
        )


class Model:
    """Weights and vocabulary of one GGUF."""

    def __init__(self, path: str | Path, options: ModelOptions = ModelOptions(), role: str = "target"):
        self.path = Path(path)
        self.role = role
        self._model_ptr = self._vocab_ptr = None
        self._contexts: weakref.WeakSet[Any] = weakref.WeakSet()  # closed before the weights (`own`)
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
        params.load_mtp = options.load_mtp
        # The arrays must live until llama.cpp has read them during the load.
        devices = rpc_link.offload_devices(options.rpc_servers) if options.rpc_servers else None
        if options.devices:
            devices = [*(devices or []), *map(device_by_name, options.devices)]
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
            room = (
                " or an RPC server without room for its share (`specrun doctor --rpc` shows their memory)"
                if self.rpc_servers
                else ""
            )
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

    def own(self, context: Any) -> None:
        """Close `context` (anything with `close()` that holds a llama.cpp context over these
        weights) when the model closes, before the weights go."""
        self._contexts.add(context)

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
    def handle(self):
        """The llama_model pointer, for the backend's own calls into llama.cpp."""
        if self._model_ptr is None:
            raise Closed(f"the {self.role} model {self.path.name} was closed: load it again to use it")
        return self._model_ptr

    @property
    def _vocab(self):
        self.handle  # noqa: B018  (raises Closed once the model is freed)
        return self._vocab_ptr

    @property
    def n_ctx_train(self) -> int:
        L = llama()
        return L.llama_model_n_ctx_train(self.handle)

    @cached_property
    def architecture(self) -> str:
        """general.architecture: "llama", "qwen35", "nemotron_h", ..."""
        L = llama()
        buf = ctypes.create_string_buffer(64)
        n = L.llama_model_meta_val_str(self.handle, b"general.architecture", buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else "unknown"

    @cached_property
    def recurrent(self) -> bool:
        """Whether some layers keep a recurrent state (Mamba, RWKV, and hybrids such as Qwen3.5)."""
        L = llama()
        return bool(L.llama_model_is_recurrent(self.handle) or L.llama_model_is_hybrid(self.handle))

    @cached_property
    def n_nextn(self) -> int:
        """The model's MTP (NextN) layers: heads that predict the token after the next."""
        L = llama()
        return int(L.llama_model_n_layer_nextn(self.handle))

    @cached_property
    def n_embd_out(self) -> int:
        """The width of the hidden rows an MTP head reads."""
        L = llama()
        return int(L.llama_model_n_embd_out(self.handle))

    @cached_property
    def n_embd(self) -> int:
        return int(llama().llama_model_n_embd(self.handle))

    @cached_property
    def n_layer(self) -> int:
        return int(llama().llama_model_n_layer(self.handle))

    @property
    def chat_template(self) -> str | None:
        L = llama()
        template = L.llama_model_chat_template(self.handle, None)
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

    @cached_property
    def fim_tokens(self) -> FimTokens:
        """The fill-in-the-middle tokens of the vocabulary (None where it has none), as llama.cpp
        found them: named in the file, or known by their text."""
        L, vocab = llama(), self._vocab
        found = (getattr(L, f"llama_vocab_fim_{name}")(vocab) for name in FimTokens._fields)
        return FimTokens(*(None if token < 0 else token for token in found))

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
        size = PIECE_BYTES
        while True:
            buffer = ctypes.create_string_buffer(size)  # its own: the server's HTTP threads detokenize too
            n = L.llama_token_to_piece(self._vocab, token, buffer, size, 0, special)
            if n >= 0:
                return buffer.raw[:n]
            size = -n  # too small: -n is the size needed

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
        return frozenset(
            token
            for (piece, token), (after, _) in zip(by_bytes, by_bytes[1:])
            if len(after) > len(piece) and after.startswith(piece)
        )

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", "replace")

    def render(self, tokens: Sequence[int]) -> str:
        """Text of tokens with control tokens spelled out (`<end_of_turn>`), as chat templates write them."""
        return b"".join(self.token_bytes(t, special=True) for t in tokens).decode("utf-8", "replace")


def _load_from_file(path: bytes, params, keep_alive: tuple) -> Any:
    """llama_model_load_from_file; `keep_alive` holds what params points into while llama.cpp reads it."""
    L = llama()
    return L.llama_model_load_from_file(path, params)
