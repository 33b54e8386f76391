"""One KV cache over a model (`Context`): it knows exactly which tokens it holds, so callers roll
back by length and reuse prefixes."""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from specrun.backend import rpc_link
from specrun.backend.library import llama
from specrun.backend.model import Closed, Model
from specrun.core.sequences import common_prefix
from specrun.errors import SpecrunError


class ContextFull(SpecrunError):
    """The KV cache has no room for the batch (the engine checks first; this is the backstop)."""


@dataclass(frozen=True)
class ContextOptions:
    n_ctx: int = 4096  # 0 means the model's training context
    n_batch: int = 512  # largest single decode; verify batches are k + 1 rows
    n_ubatch: int = 0  # rows llama.cpp computes at once (0: n_batch); changes batched numerics
    n_threads: int = 0  # 0 means every core
    flash_attn: int = -1  # -1 auto, 0 off, 1 on


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
