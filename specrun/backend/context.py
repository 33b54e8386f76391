"""One KV cache over a model (`Context`): it knows exactly which tokens it holds, so callers roll
back by length and reuse prefixes.

A recurrent or hybrid model (Qwen3.5, Nemotron-H, LFM2) also keeps a state per sequence that
cannot be cut back to an earlier token. llama.cpp keeps `rollback` snapshots of it
(`n_rs_seq`), from which it can drop up to that many trailing tokens of the last decode, once,
and nothing else: asked to drop the whole last decode, tokens of an earlier one, or the
1-token decodes a draft model makes, `llama_memory_seq_rm` still says yes and leaves a wrong
state. So `truncate` drops tokens through the snapshots only where they reach; elsewhere it
restores a checkpoint of the state (`checkpoint`) and decodes what lies between again, or
starts over, so a rollback is always exact. A verify batch (the last token and the drafts,
one decode) always rolls back through the snapshots.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from specrun.backend import rpc_link
from specrun.backend.library import llama, llama_ext
from specrun.backend.model import Closed, Model
from specrun.core.sequences import common_prefix
from specrun.errors import SpecrunError

Listener = Callable[[Sequence[int], int, np.ndarray], None]
"""Told of every decode: its tokens, the position of the first, and its hidden rows (a view, valid
during the call)."""


class ContextFull(SpecrunError):
    """The KV cache has no room for the batch (the engine checks first; this is the backstop)."""


@dataclass(frozen=True)
class ContextOptions:
    n_ctx: int = 4096  # 0 means the model's training context
    n_batch: int = 512  # largest single decode; verify batches are k + 1 rows
    n_ubatch: int = 0  # rows llama.cpp computes at once (0: n_batch); changes batched numerics
    n_threads: int = 0  # 0 means every core
    flash_attn: int = -1  # -1 auto, 0 off, 1 on
    # A recurrent or hybrid model: trailing tokens of a decode the state can drop (llama.cpp's
    # n_rs_seq; each costs one more copy of the state). Other models drop any.
    rollback: int = 0


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
        self.recurrent = model.recurrent
        if self.recurrent:  # llama.cpp keeps the snapshots' tail in one micro-batch: it needs n_ubatch > n_rs_seq + 1
            params.n_rs_seq = max(0, min(options.rollback, params.n_ubatch - 2))
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
        # The most tokens a verify may drop again: the snapshots llama.cpp keeps (0 for an architecture
        # it cannot roll back at all), or for any other model, the whole context.
        self.rollback_limit = L.llama_n_rs_seq(self._ctx_ptr) if self.recurrent else self.n_ctx
        self._last_decode = 0  # tokens in the last decode: a recurrent state rolls back within it, once
        self._checkpoint: tuple[int, ctypes.Array] | None = None  # (length, the recurrent state there)
        self.replayed = 0  # tokens decoded again because no snapshot or checkpoint reached back to them
        self._listener: Listener | None = None
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
        self._last_decode = n
        if self._listener is not None:
            hidden = np.ctypeslib.as_array(llama_ext().llama_get_embeddings_nextn(ctx), shape=(n, self.model.n_embd_out))
            self._listener(chunk, pos0, hidden)

    def logits(self, rows: int) -> np.ndarray:
        """The last eval's logits for its last `rows` rows (a view, valid until the next eval)."""
        return self.model._call_llama(self._logits, rows)

    def _logits(self, rows: int) -> np.ndarray:
        L = llama()
        pointer = L.llama_get_logits(self._ctx)
        return np.ctypeslib.as_array(pointer, shape=(rows, self.model.n_vocab))

    def truncate(self, n_keep: int) -> None:
        """Roll the cache back to its first n_keep tokens, exactly."""
        if n_keep < len(self.tokens):
            self.model._call_llama(self._roll_back, n_keep, True)

    def reuse_prefix(self, history: Sequence[int]) -> int:
        """Keep the longest cached prefix of `history` that can be kept without decoding anything
        again, drop the rest; return its length. A recurrent state keeps one only where its
        snapshots or checkpoint reach back to it; otherwise it starts over (returns 0)."""
        common = common_prefix(self.tokens, history)
        if common < len(self.tokens):
            self.model._call_llama(self._roll_back, common, False)
        return len(self.tokens)

    def checkpoint(self) -> None:
        """Keep a copy of a recurrent state as it is now, so that rolling back to here later (past
        what the snapshots reach: a draft model's 1-token decodes) costs no decoding again."""
        if self.recurrent:
            self._checkpoint = self.model._call_llama(self._save_state)

    def _roll_back(self, n_keep: int, exact: bool) -> None:
        """To n_keep tokens; where a recurrent state cannot drop what lies past them, to its
        checkpoint or the start, and then (`exact`) decode again up to n_keep."""
        if not self.recurrent or n_keep == 0 or self._snapshots_reach(len(self.tokens) - n_keep):
            return self._remove_from(n_keep)
        mark = self._checkpoint[0] if self._checkpoint is not None and self._checkpoint[0] <= n_keep else 0
        kept = self.tokens[:n_keep]
        if mark:
            self._restore_state()
        self._remove_from(mark)
        if exact and mark < n_keep:
            self.replayed += n_keep - mark
            self._eval(kept[mark:], 1)

    def _snapshots_reach(self, drop: int) -> bool:
        """Whether llama.cpp's snapshots can drop the last `drop` tokens: within the last decode,
        which keeps at least one token, as many as it keeps snapshots, once per decode."""
        return 0 < drop <= min(self.rollback_limit, self._last_decode - 1)

    def _remove_from(self, n_keep: int) -> None:
        L = llama()
        if not L.llama_memory_seq_rm(L.llama_get_memory(self._ctx), 0, n_keep, -1):
            raise SpecrunError(f"llama.cpp refused to roll the {self.model.role} model's cache back to {n_keep} tokens")
        del self.tokens[n_keep:]
        self._last_decode = 0  # a second roll back before the next decode would go past the snapshots
        if self._checkpoint is not None and self._checkpoint[0] > n_keep:
            self._checkpoint = None

    def _save_state(self) -> tuple[int, ctypes.Array]:
        L = llama()
        flags = L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY  # the recurrent part only: the KV cache rolls back by itself
        size = L.llama_state_seq_get_size_ext(self._ctx, 0, flags)
        state = (ctypes.c_uint8 * size)()
        L.llama_state_seq_get_data_ext(self._ctx, state, size, 0, flags)
        return len(self.tokens), state

    def _restore_state(self) -> None:
        L = llama()
        assert self._checkpoint is not None
        _, state = self._checkpoint
        if not L.llama_state_seq_set_data_ext(self._ctx, state, len(state), 0, L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY):
            raise SpecrunError(f"llama.cpp could not restore the {self.model.role} model's recurrent state")

    def listen(self, listener: Listener | None) -> None:
        """Hand `listener` the tokens, first position and hidden rows (the NextN embeddings an
        MTP head reads) of every decode from now on; None stops it."""
        self.model._call_llama(self._listen, listener)

    def _listen(self, listener: Listener | None) -> None:
        llama_ext().llama_set_embeddings_nextn(self._ctx, listener is not None, False)  # every row, not only outputs
        self._listener = listener


def _free_context(batch, ctx) -> None:
    L = llama()
    L.llama_batch_free(batch)
    L.llama_free(ctx)
