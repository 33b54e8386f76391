"""A model's own multi-token-prediction layers (MTP / NextN), on a context of their own.

The head follows a target context over the same model, as llama.cpp's draft-mtp does
(common/speculative.cpp, `common_speculative_impl_draft_mtp`): after every target decode it
decodes the same tokens, each paired with the target's hidden row of the position before it
(`process`), so its KV cache stays in step with the target's. To draft it decodes the last
token with the hidden row before it, then each drafted token with the head's own hidden row
(`step`). Rows carry a token and a hidden row, so they go through llama.cpp's `llama_batch_ext`.
"""

from __future__ import annotations

import ctypes
from typing import Sequence

import numpy as np

from specrun.backend.context import Context
from specrun.backend.library import llama, llama_ext
from specrun.errors import SpecrunError


class _HeadContext:
    """The llama.cpp MTP context over a target's cache: one sequence per target sequence, in one
    unified cache as the target's, each its share of n_ctx."""

    def __init__(self, target: Context):
        L = llama()
        model = target.model
        params = L.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch = target.n_ctx * target.n_seq, target.n_batch, target.n_batch
        params.n_seq_max = target.n_seq
        params.kv_unified = True
        params.n_threads = params.n_threads_batch = target.n_threads
        params.ctx_type = L.LLAMA_CONTEXT_TYPE_MTP
        params.ctx_other = target._ctx
        params.no_perf = True
        self.model = model
        self.ctx = L.llama_init_from_model(model._model, params)
        if not self.ctx:
            raise SpecrunError(
                f"llama.cpp could not create an MTP context for {model.path.name} (SPECRUN_DEBUG=1 shows llama.cpp's log)"
            )
        llama_ext().llama_set_embeddings_nextn(self.ctx, True, True)  # its own hidden rows, for output rows only
        self.batch = L.llama_batch_ext_init(self.ctx)
        self.pos = (L.llama_pos * 4)()  # text rows use the first of the four positions
        model._contexts.add(self)  # closed before the weights

    def close(self) -> None:
        if self.ctx:
            L = llama()
            L.llama_batch_ext_free(self.batch)
            L.llama_free(self.ctx)
            self.ctx = None


class MtpHead:
    """The MTP layers of `target`'s model drafting for that sequence of its cache (one head:
    llama.cpp's single trained head). The heads of a cache's sequences share one MTP context."""

    def __init__(self, target: Context):
        model = target.model
        if not model.n_nextn:
            raise SpecrunError(
                f"the target model {model.path.name} has no MTP (NextN) layers, so it cannot draft for "
                "itself: drop --draft mtp, or give a draft model (--draft PATH) or --lookup"
            )
        shared = target._shared
        if shared.heads is None:
            shared.heads = _HeadContext(target)
        self._shared: _HeadContext = shared.heads
        self.model = model
        self.seq = target.seq
        self.n_embd = model.n_embd_out
        self.tokens: list[int] = []  # what its cache holds, position by position: the target's text, then drafting rows

    def process(self, tokens: Sequence[int], pos0: int, hidden: np.ndarray) -> None:
        """Decode the target's `tokens` from position pos0, each with `hidden[i]`, the target's
        hidden row of the position before it; no logits."""
        self.truncate(pos0)
        self._decode([(token, pos0 + i, hidden[i], False) for i, token in enumerate(tokens)])
        self.tokens.extend(tokens)

    def step(self, token: int, pos: int, hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Decode one drafting row: the logits of the token after `token` and the head's own hidden
        row, which the next step reads. Copies: both stay valid after the next decode."""
        L, LX = llama(), llama_ext()
        self.truncate(pos)
        self._decode([(token, pos, hidden, True)])
        self.tokens.append(token)
        ctx = self._shared.ctx
        logits = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, 0), shape=(self.model.n_vocab,)).copy()
        row = np.ctypeslib.as_array(LX.llama_get_embeddings_nextn_ith(ctx, 0), shape=(self.n_embd,)).copy()
        return logits, row

    def truncate(self, n_keep: int) -> None:
        """Forget positions from n_keep on, drafting rows included (its cache is attention only: any tail drops)."""
        L = llama()
        if n_keep < len(self.tokens):
            if not L.llama_memory_seq_rm(L.llama_get_memory(self._shared.ctx), self.seq, n_keep, -1):
                raise SpecrunError("llama.cpp refused to roll the MTP head's cache back")
            del self.tokens[n_keep:]

    def _decode(self, rows: list[tuple[int, int, np.ndarray, bool]]) -> None:
        L, shared = llama(), self._shared
        L.llama_batch_ext_clear(shared.batch)
        for token, pos, hidden, output in rows:
            index = L.llama_batch_ext_add_token(shared.batch, self.seq, token)
            shared.pos[0] = pos
            row = np.ascontiguousarray(hidden, dtype=np.float32)
            embd = L.llama_embd(row.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, self.n_embd)  # copied by the call
            if (
                index < 0
                or not L.llama_batch_ext_set_pos(shared.batch, index, shared.pos)
                or not L.llama_batch_ext_set_embd_token(shared.batch, index, embd)
            ):
                raise SpecrunError("llama.cpp refused a row of the MTP head's batch")
            if output:
                L.llama_batch_ext_set_output_logits(shared.batch, index, True)
        status = L.llama_process(shared.ctx, L.LLAMA_PROCESS_TYPE_DECODE, shared.batch)
        if status != 0:
            raise SpecrunError(f"the MTP head's decode failed with status {status}")
