"""KV caches over a model. A `Context` is one sequence of a llama.cpp context: it knows exactly
which tokens it holds, so callers roll back by length and reuse prefixes. A context made with
several sequences (`ContextOptions.sequences`) holds one stream each, `sequence(i)` hands
out the others, and `decode_many` verifies rows of several of them in one decode.

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
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from specrun.backend import rpc_link
from specrun.backend.library import drafter_calls, llama, llama_ext
from specrun.backend.model import Closed, Model
from specrun.backend.threads import ThreadPool
from specrun.backend.views import BatchViews, FloatViews, layer_inputs
from specrun.errors import SpecrunError
from specrun.sequences import History, common_prefix

Listener = Callable[[Sequence[int], int, np.ndarray], None]
"""Told of every decode of a sequence: its tokens, the first's position, its rows (valid during the call)."""


class ContextFull(SpecrunError):
    """The KV cache has no room for the batch (the engine checks first; this is the backstop)."""


@dataclass(frozen=True)
class ContextOptions:
    n_ctx: int = 4096  # 0 means the model's training context; split evenly between the sequences
    n_batch: int = 512  # largest single decode; verify batches are k + 1 rows (of every stream together)
    n_ubatch: int = 0  # rows llama.cpp computes at once (0: n_batch); changes batched numerics
    n_threads: int = 0  # 0 means every core
    flash_attn: int = -1  # -1 auto, 0 off, 1 on
    # A recurrent or hybrid model: trailing tokens of a decode the state can drop (llama.cpp's
    # n_rs_seq; each costs one more copy of the state, per sequence). Other models drop any.
    rollback: int = 0
    sequences: int = 1  # streams the cache holds, each in its share of n_ctx (llama.cpp's n_seq_max)


class _LlamaContext:
    """The llama.cpp context and the one batch its sequences share."""

    def __init__(self, model: Model, options: ContextOptions, threads: ThreadPool | None):
        L = llama()
        self.model = model
        self.ptr = None
        params = L.llama_context_default_params()
        params.n_ctx = options.n_ctx or model.n_ctx_train
        params.n_batch = options.n_batch
        params.n_ubatch = options.n_ubatch or options.n_batch
        params.n_seq_max = options.sequences
        # One cache for every sequence: llama.cpp splits a batch over per-sequence caches into
        # micro-batches of equal tokens per sequence, so streams drafting different lengths would
        # pay extra passes over the weights. Each sequence's share of n_ctx is enforced here
        # (`n_ctx` below, `Context.free_slots`).
        params.kv_unified = True
        self.threads = threads or ThreadPool(options.n_threads)
        self.n_threads = self.threads.n_threads
        params.n_threads = params.n_threads_batch = self.n_threads
        params.flash_attn_type = options.flash_attn
        params.swa_full = True  # rollback inside the sliding window must stay possible
        if model.recurrent:  # llama.cpp keeps the snapshots' tail in one micro-batch: it needs n_ubatch > n_rs_seq + 1
            params.n_rs_seq = max(0, min(options.rollback, params.n_ubatch - 2))
        params.no_perf = True
        waiting = rpc_link.Waiting(model.rpc_servers, model.rpc_timeout, "while creating a context")
        self.ptr = model._call_llama(L.llama_init_from_model, model.handle, params, waiting=waiting)
        if not self.ptr:
            raise SpecrunError(
                f"llama.cpp could not create a {params.n_ctx}-token context for {model.path}: "
                "lower --ctx-size or offload fewer layers"
            )
        model.own(self)
        self.threads.attach(self.ptr)
        self.n_seq = options.sequences
        self.n_ctx = L.llama_n_ctx(self.ptr) // options.sequences  # each sequence's share
        # The most a verify may drop again: the snapshots llama.cpp keeps (0: none), or the whole context.
        self.rollback_limit = L.llama_n_rs_seq(self.ptr) if model.recurrent else self.n_ctx
        self.n_batch, self.views = options.n_batch, FloatViews()
        self.batch = L.llama_batch_init(self.n_batch, 0, 1)
        self.token, self.pos, self.logits, self.seq_ids = BatchViews.of(self.batch, self.n_batch)
        self.sequences: dict[int, Context] = {}
        self.layers: tuple[int, ...] = ()  # the layers whose inputs listeners read (else the NextN rows)

    def listened_rows(self, n: int) -> np.ndarray:
        """What listeners read of the last decode's n rows: the NextN rows, or the layers' inputs."""
        if self.layers:
            return layer_inputs(self.views, self.ctx, self.layers, n, self.model.n_embd)
        return self.views.rows(llama_ext().llama_get_embeddings_nextn(self.ctx), n, self.model.n_embd_out)

    def close(self) -> None:
        if self.ptr:
            pointer, self.ptr = self.ptr, None
            self.model._free(_free_context, self.batch, pointer)
            self.threads.release()  # also where a lost RPC server kept llama.cpp from freeing the context

    @property
    def ctx(self):
        if self.ptr is None:
            raise Closed(f"the {self.model.role} model's context was closed: its KV cache is gone")
        return self.ptr


class Context:
    """One sequence of a KV cache over a model; `tokens` is exactly what it holds."""

    def __init__(self, model: Model, options=ContextOptions(), threads: ThreadPool | None = None, *, _shared=None, _seq=0):
        """A new llama.cpp context over `model` (this its sequence 0) decoding on `threads`, shared with
        contexts that never decode at once with it (they set its thread count), or on its own pool."""
        self._shared = _shared or _LlamaContext(model, options, threads)
        self._shared.sequences[_seq] = self
        self.model, self.seq = model, _seq
        self.tokens: list[int] = []
        self._last_decode = 0  # tokens in its last decode: a recurrent state rolls back within it, once
        self._checkpoint: tuple[int, ctypes.Array] | None = None  # (length, the recurrent state there)
        self.replayed = 0  # tokens decoded again because no snapshot or checkpoint reached back to them
        self._listener: Listener | None = None
        # The History `reuse_prefix` last kept a prefix of, and how much of it `tokens` still holds.
        self._follows: tuple[History, int] | None = None

    def sequence(self, seq: int) -> Context:
        """Sequence `seq` of the same cache (0 is the one made with the context)."""
        return self._shared.sequences.get(seq) or Context(self.model, _shared=self._shared, _seq=seq)

    def shares_cache(self, other: object) -> bool:
        """Whether `other` is a sequence of the same cache (one `decode_many` takes both)."""
        return isinstance(other, Context) and other._shared is self._shared

    def close(self) -> None:
        """Free the cache, every sequence's; later calls raise Closed instead of touching freed memory."""
        self._shared.close()

    @property
    def closed(self) -> bool:
        """Closed, or lost with an RPC server: either way its cache takes no more decodes."""
        return self._shared.ptr is None or self.model.lost

    @property
    def handle(self):
        """The llama_context pointer, for the backend's own calls into llama.cpp."""
        return self._shared.ctx

    @property
    def threads(self) -> ThreadPool:
        """The CPU threads its decodes run on."""
        return self._shared.threads

    @property
    def n_ctx(self) -> int:
        """The tokens this sequence can hold."""
        return self._shared.n_ctx

    @property
    def n_batch(self) -> int:
        return self._shared.n_batch

    @property
    def n_seq(self) -> int:
        """The sequences its cache holds."""
        return self._shared.n_seq

    @property
    def n_threads(self) -> int:
        return self._shared.n_threads

    @property
    def recurrent(self) -> bool:
        return self.model.recurrent

    @property
    def rollback_limit(self) -> int:
        return self._shared.rollback_limit

    @property
    def free_slots(self) -> int:
        return self._shared.n_ctx - len(self.tokens)

    def eval(self, tokens: Sequence[int], logits_rows: int = 1) -> np.ndarray:
        """Append tokens to the cache; return logits for the last `logits_rows` of them.

        The returned array is a view into llama.cpp's buffer, valid until the next eval.
        """
        if not tokens:
            raise ValueError("eval needs at least one token")
        if not 1 <= logits_rows <= self._shared.n_batch:
            raise ValueError(f"from 1 to n_batch={self.n_batch} logits rows per eval, not {logits_rows}")
        self._check_room(len(tokens))
        return self.model._call_llama(self._eval, tokens, min(logits_rows, len(tokens)))

    def decode_many(self, parts: Sequence[tuple[Context, Sequence[int], int]]) -> list[np.ndarray]:
        """One decode of several sequences of this cache: for each (sequence, tokens, logits rows),
        the logits of its last rows (views, valid until the next decode; none for 0 rows: part of a
        prompt). All rows fit one batch."""
        if sum(len(tokens) for _, tokens, _ in parts) > self.n_batch:
            raise ValueError(f"at most n_batch={self.n_batch} rows per decode")
        for sequence, tokens, rows in parts:
            if sequence._shared is not self._shared or not tokens or not 0 <= rows <= len(tokens):
                raise ValueError("each part: a sequence of this cache, tokens, and up to that many logits rows")
            sequence._check_room(len(tokens))
        return self.model._call_llama(self._decode_many, parts)

    def _check_room(self, n: int) -> None:
        if n > self.free_slots:
            raise ContextFull(f"{n} tokens do not fit in the {self.free_slots} free context slots: raise --ctx-size")

    def _eval(self, tokens: Sequence[int], rows: int) -> np.ndarray:
        # Decoding on RPC servers is asynchronous: reading the logits is where it waits, so both are one call.
        if len(tokens) <= self.n_batch:  # one decode, as every step's is: no chunks to cut
            return self._decode_many([(self, tokens, rows)])[0]
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            rows_here = max(0, rows - (len(tokens) - start - len(chunk)))
            (logits,) = self._decode_many([(self, chunk, min(rows_here, len(chunk)))])
        return logits

    def _decode_many(self, parts: Sequence[tuple[Context, Sequence[int], int]]) -> list[np.ndarray]:
        L, shared = llama(), self._shared
        ctx = shared.ctx  # before writing into the batch: a closed context has freed it
        n = all_rows = 0
        token, pos, wants, seq_ids = shared.token, shared.pos, shared.logits, shared.seq_ids
        for sequence, tokens, rows in parts:
            # Row by row: a decode's few rows cost less so than numpy's slice assignments do.
            start, first_out, seq = len(sequence.tokens), n + len(tokens) - rows, sequence.seq
            for t in tokens:
                token[n], pos[n], wants[n] = t, start, n >= first_out
                seq_ids[n][0] = seq
                n, start = n + 1, start + 1
            all_rows += rows
        shared.batch.n_tokens = n
        status = L.llama_decode(ctx, shared.batch)
        if status == 1:
            raise ContextFull("llama.cpp found no KV cache slot for the batch: raise --ctx-size")
        if status != 0:
            raise SpecrunError(f"llama_decode failed with status {status} on the {self.model.role} model")
        n_vocab = self.model.n_vocab
        everything = shared.views.rows(L.llama_get_logits(ctx), all_rows, n_vocab) if all_rows else np.empty((0, n_vocab))
        logits, first, row = [], 0, 0
        for sequence, tokens, rows in parts:
            pos0 = len(sequence.tokens)
            sequence.tokens.extend(tokens)
            sequence._last_decode = len(tokens)
            if sequence._listener is not None:
                sequence._listener(tokens, pos0, shared.listened_rows(n)[first : first + len(tokens)])
            # The one part with rows (as every lone decode) takes them all without a new view.
            logits.append(everything if rows == all_rows else everything[row : row + rows])
            row, first = row + rows, first + len(tokens)
        return logits

    def logits(self, rows: int) -> np.ndarray:
        """The last eval's logits for its last `rows` rows (a view, valid until the next eval)."""
        return self.model._call_llama(self._logits, rows)

    def _logits(self, rows: int) -> np.ndarray:
        return self._shared.views.rows(llama().llama_get_logits(self.handle), rows, self.model.n_vocab)

    def truncate(self, n_keep: int) -> None:
        """Roll the sequence back to its first n_keep tokens, exactly."""
        if n_keep < len(self.tokens):
            self.model._call_llama(self._roll_back, n_keep, True)

    def reuse_prefix(self, history: Sequence[int]) -> int:
        """Keep the longest cached prefix of `history` that can be kept without decoding anything
        again, drop the rest; return its length. Where another sequence of the cache holds a longer
        prefix of it (a system prompt that several streams share), that sequence's cells are shared
        instead. A recurrent state keeps one only where its snapshots or checkpoint reach back to
        it; otherwise it starts over (returns 0)."""
        common = self._held(history)
        lender, lent = self._longest_lender(history, common)
        if lender is not None:
            self.model._call_llama(self._share_prefix, lender, lent)
        elif common < len(self.tokens):
            self.model._call_llama(self._roll_back, common, False)
        self._follows = (history, len(self.tokens)) if isinstance(history, History) else None
        return len(self.tokens)

    def _held(self, history: Sequence[int]) -> int:
        """How many of `history`'s first tokens the cache holds, compared from where the last
        `reuse_prefix` of the same History left off: what it held of it then it still holds."""
        followed, held = self._follows or (None, 0)
        start = held if followed is history else 0
        return start + common_prefix(self.tokens[start:], history[start:])

    def prefix_held(self, history: Sequence[int]) -> int:
        """The most of `history` that `reuse_prefix` could keep or share now."""
        held = common_prefix(self.tokens, history)
        _, lent = self._longest_lender(history, held)
        return max(held, lent)

    @property
    def shares_prefixes(self) -> bool:
        """Whether it can take a prefix another sequence holds. Not a recurrent state, which holds
        no cells per position to share, nor a sequence an MTP head listens to, whose head would
        hold no rows for the shared positions."""
        return not self.recurrent and self._listener is None

    def _longest_lender(self, history: Sequence[int], beyond: int = 0) -> tuple[Context | None, int]:
        """The other sequence holding the longest prefix of `history` past `beyond` tokens, and its length; or (None, 0)."""
        if len(self._shared.sequences) == 1 or not self.shares_prefixes:
            return None, 0  # a lone sequence (as every stream outside a batch) has none to borrow from
        lender, lent = None, beyond
        for other in self._shared.sequences.values():
            # Only one that holds history's token at `lent` can hold more (none past its end): one
            # lookup rules out a stream writing a text of its own before any comparison of histories.
            if other is not self and lent < len(history) and len(other.tokens) > lent and other.tokens[lent] == history[lent]:
                held = common_prefix(other.tokens, history)
                if held > lent:
                    lender, lent = other, held
        return (lender, lent) if lender is not None else (None, 0)

    def _share_prefix(self, lender: Context, n: int) -> None:
        """Hold the lender's first n tokens instead of its own: in a unified cache their cells take
        this sequence's id too, which computes nothing and copies no data."""
        L = llama()
        self._remove_from(0)
        L.llama_memory_seq_cp(L.llama_get_memory(self.handle), lender.seq, self.seq, 0, n)
        self.tokens = list(lender.tokens[:n])

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
        if not L.llama_memory_seq_rm(L.llama_get_memory(self.handle), self.seq, n_keep, -1):
            raise SpecrunError(f"llama.cpp refused to roll the {self.model.role} model's cache back to {n_keep} tokens")
        del self.tokens[n_keep:]
        if self._follows is not None:
            self._follows = (self._follows[0], min(self._follows[1], n_keep))
        self._last_decode = 0  # a second roll back before the next decode would go past the snapshots
        if self._checkpoint is not None and self._checkpoint[0] > n_keep:
            self._checkpoint = None

    def _save_state(self) -> tuple[int, ctypes.Array]:
        L = llama()
        flags = L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY  # the recurrent part only: the KV cache rolls back by itself
        size = L.llama_state_seq_get_size_ext(self.handle, self.seq, flags)
        state = (ctypes.c_uint8 * size)()
        L.llama_state_seq_get_data_ext(self.handle, state, size, self.seq, flags)
        return len(self.tokens), state

    def _restore_state(self) -> None:
        L = llama()
        assert self._checkpoint is not None
        _, state = self._checkpoint
        if not L.llama_state_seq_set_data_ext(self.handle, state, len(state), self.seq, L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY):
            raise SpecrunError(f"llama.cpp could not restore the {self.model.role} model's recurrent state")

    def listen(self, listener: Listener | None, layers: tuple[int, ...] = ()) -> None:
        """Hand `listener` the tokens, first position and hidden rows of every decode of this
        sequence from now on; None stops it. The rows: the NextN embeddings an MTP head reads, or
        with `layers`, the inputs of those layers side by side (what an EAGLE-3 drafter reads)."""
        self.model._call_llama(self._listen, listener, layers)

    def _listen(self, listener: Listener | None, layers: tuple[int, ...]) -> None:
        self._listener, shared = listener, self._shared
        listened = any(sequence._listener is not None for sequence in shared.sequences.values())
        for layer in set(shared.layers) | set(layers):  # llama.cpp keeps a layer's inputs only while asked
            drafter_calls().llama_set_embeddings_layer_inp(self.handle, layer, listened and layer in layers)
        shared.layers = layers if listened else ()
        llama_ext().llama_set_embeddings_nextn(self.handle, listened and not layers, False)  # every row, not only outputs


def _free_context(batch, ctx) -> None:
    L = llama()
    L.llama_batch_free(batch)
    L.llama_free(ctx)
