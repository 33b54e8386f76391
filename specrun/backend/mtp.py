"""A model's own multi-token-prediction layers (MTP / NextN), on a context of their own.

The head follows a target context over the same model, as llama.cpp's draft-mtp does
(common/speculative.cpp, `common_speculative_impl_draft_mtp`): after every target decode it
decodes the same tokens, each paired with the target's hidden row of the position before it
(`process`), so its KV cache stays in step with the target's. To draft it decodes the last
token with the hidden row before it, then each drafted token with the head's own hidden row
(`decode_many`). Rows carry a token and a hidden row, both of which a plain `llama_batch`
takes (llama.cpp's `llama_batch_compat`). The heads of a target's sequences (one per stream)
share one MTP context: the rows that follow the target wait in its batch and go with the next
decode, and the streams' drafting rows go together, one decode for every stream's next position.
"""

from __future__ import annotations

import weakref
from typing import Any, Sequence

import numpy as np

from specrun.backend.context import Context
from specrun.backend.library import llama, llama_ext
from specrun.backend.model import Model
from specrun.backend.threads import ThreadPool
from specrun.backend.views import BatchViews, FloatViews, row_views
from specrun.errors import SpecrunError

Row = tuple[int, int, int, np.ndarray]
"""A row of the heads' batch: sequence, token, position, and the hidden row it reads."""


def context_beside(target: Context, model: Model, mtp: bool = False):
    """A llama.cpp context over `model` (the target's own, for its MTP layers, or a trained
    drafter) beside the target's cache: one sequence per target sequence, in one unified cache
    as the target's, each its share of n_ctx, decoding on the target's threads (they decode in
    turn, never at once). A drafter may borrow the target's token embeddings and output head
    (`ctx_other`). The caller frees it, and releases the threads."""
    L = llama()
    params = L.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch = target.n_ctx * target.n_seq, target.n_batch, target.n_batch
    params.n_seq_max = target.n_seq
    params.kv_unified = True
    params.n_threads = params.n_threads_batch = target.n_threads
    if mtp:
        params.ctx_type = L.LLAMA_CONTEXT_TYPE_MTP
    params.ctx_other = target.handle
    params.no_perf = True
    ctx = L.llama_init_from_model(model.handle, params)
    if not ctx:
        raise SpecrunError(
            f"llama.cpp could not create a drafting context for {model.path.name} (SPECRUN_DEBUG=1 shows llama.cpp's log)"
        )
    target.threads.attach(ctx)
    return ctx


class _HeadContext:
    """The llama.cpp MTP context over a target's cache: one sequence per target sequence, in one
    unified cache as the target's, each its share of n_ctx; and the batch its rows wait in."""

    def __init__(self, target: Context, drafter: Model | None = None):
        L = llama()
        model = drafter or target.model
        self.model = model
        self.n_batch = target.n_batch
        self.n_embd = model.n_embd_out
        self.ctx = context_beside(target, model, mtp=drafter is None)
        self.threads = target.threads
        # An MTP graph computes its hidden rows for every row of a decode, and llama.cpp hands out
        # the first ones as the output rows' when asked for those only: so an MTP head reads them
        # all and takes its drafting rows' at their place in the batch, behind the rows that wait.
        # EAGLE-3's decoder graph does the same with its logits: its drafting rows decode apart
        # from the rows that wait (as llama.cpp's draft-eagle3 decodes them) and are the outputs.
        self.joins_waiting = drafter is None
        llama_ext().llama_set_embeddings_nextn(self.ctx, True, not self.joins_waiting)
        # A plain llama_batch may carry a token and a hidden row per row (llama.cpp's
        # llama_batch_compat, as its MTP hooks use): rows are written into numpy views of its
        # arrays and the decode is one call, with no ctypes call per row. llama_batch_init
        # allocates the hidden rows and no tokens, so the token array is this object's own.
        self.batch = L.llama_batch_init(self.n_batch, self.n_embd, 1)
        self._tokens = (L.llama_token * self.n_batch)()
        self.batch.token = self._tokens
        self.token, self.pos, self.wants, self.seq_ids = BatchViews.of(self.batch, self.n_batch)
        self.hidden = np.ctypeslib.as_array(self.batch.embd, shape=(self.n_batch, self.n_embd))
        self.views = FloatViews()
        # Rows that follow the target, not decoded yet, at the batch's start: (sequence, position)
        # each. They go with the next drafting rows, and those a rollback drops are never decoded.
        self.waiting: list[tuple[int, int]] = []
        self.encoder: Any = None  # an EAGLE-3 drafter's batch of the target's features (`encode`), made on first use
        model.own(self)
        if drafter is not None:
            target.model.own(self)  # it reads the target's context: it goes before the target's weights too

    def close(self) -> None:
        if self.ctx:
            L = llama()
            self.batch.token = None  # this object's array, not llama_batch_init's: not for llama_batch_free
            L.llama_batch_free(self.batch)
            if self.encoder is not None:
                L.llama_batch_free(self.encoder)
            L.llama_free(self.ctx)
            self.threads.release()
            self.ctx = None

    def follow(self, seq: int, tokens: Sequence[int], pos0: int, hidden: np.ndarray) -> None:
        """Rows that wait for the next decode: `tokens` of sequence `seq` from position pos0, each
        reading `hidden[i]`. While nothing drafts (auto declining), a full batch decodes alone."""
        done = 0
        while done < len(tokens):
            if len(self.waiting) == self.n_batch:
                self._decode()
            n = min(len(tokens) - done, self.n_batch - len(self.waiting))
            self._put(len(self.waiting), seq, tokens[done : done + n], pos0 + done, hidden[done : done + n], False)
            self.waiting += [(seq, pos) for pos in range(pos0 + done, pos0 + done + n)]
            done += n

    def drop(self, seq: int, n_keep: int) -> None:
        """Forget the waiting rows of `seq` from position n_keep on."""
        kept = [i for i, (s, pos) in enumerate(self.waiting) if s != seq or pos < n_keep]
        if len(kept) == len(self.waiting):
            return
        if kept != list(range(len(kept))):  # another sequence's rows follow the dropped ones: move them up
            self.token[: len(kept)], self.pos[: len(kept)] = self.token[kept], self.pos[kept]
            self.hidden[: len(kept)] = self.hidden[kept]
            for row, i in enumerate(kept):
                self.seq_ids[row][0] = self.waiting[i][0]
        self.waiting = [self.waiting[i] for i in kept]

    def decode(self, drafting: Sequence[Row]) -> int:
        """Decode the rows that wait, and the `drafting` rows (sequence, token, position, the
        hidden row it reads) after them: those give logits, and hidden rows, in their order. The
        batch row of the first drafting row (where its hidden row is)."""
        if self.waiting and (len(self.waiting) + len(drafting) > self.n_batch or not self.joins_waiting):
            drafting = [(*row[:3], row[3].copy()) for row in drafting]  # they may read the output the next decode replaces
            self._decode()
        first = len(self.waiting)
        for n, (seq, token, pos, hidden) in enumerate(drafting, first):
            self._put(n, seq, (token,), pos, hidden, True)
        self._decode(first + len(drafting))
        return first

    def encode(self, features: np.ndarray) -> np.ndarray:
        """An EAGLE-3 drafter's encoder over rows of the target's features (its layers' inputs side
        by side): the fused row of each, a view valid until the context's next pass. The encoder
        reads no positions and writes no cache; llama.cpp checks the positions against sequence
        0's all the same, so they follow it, as llama.cpp's draft-eagle3 numbers them."""
        L, (n, width) = llama(), features.shape
        if self.encoder is None:
            self.encoder = L.llama_batch_init(self.n_batch, width, 1)  # rows of features, no tokens
            self.feature_pos, wants, seq_ids = row_views(self.encoder, self.n_batch)
            wants[:] = 1
            for seq_id in seq_ids:
                seq_id[0] = 0
            self.features = np.ctypeslib.as_array(self.encoder.embd, shape=(self.n_batch, width))
        first = L.llama_memory_seq_pos_max(L.llama_get_memory(self.ctx), 0) + 1
        self.features[:n], self.feature_pos[:n] = features, np.arange(first, first + n)
        self.encoder.n_tokens = n
        status = L.llama_encode(self.ctx, self.encoder)
        if status != 0:
            raise SpecrunError(f"the EAGLE-3 drafter's encoder failed with status {status}")
        return self.views.rows(llama_ext().llama_get_embeddings_nextn(self.ctx), n, self.n_embd)

    def _put(self, n: int, seq: int, tokens: Sequence[int], pos: int, hidden: np.ndarray, wants: bool) -> None:
        """Write rows into the batch from its row n on (their hidden rows in one copy)."""
        self.hidden[n : n + len(tokens)] = hidden
        for token in tokens:
            self.token[n], self.pos[n], self.wants[n] = token, pos, wants
            self.seq_ids[n][0] = seq
            n, pos = n + 1, pos + 1

    def _decode(self, rows: int | None = None) -> None:
        self.batch.n_tokens = len(self.waiting) if rows is None else rows
        self.waiting = []
        status = llama().llama_decode(self.ctx, self.batch)
        if status != 0:
            raise SpecrunError(f"the MTP head's decode failed with status {status}")


_HEADS: weakref.WeakKeyDictionary[Context, dict[Model | None, _HeadContext]] = weakref.WeakKeyDictionary()
"""The heads' context of each target cache and drafter (None: the target's own MTP layers), made
once, keyed by the cache's sequence 0."""


def _heads_of(target: Context, drafter: Model | None) -> _HeadContext:
    heads = _HEADS.setdefault(target.sequence(0), {})
    if drafter not in heads:
        heads[drafter] = _HeadContext(target, drafter)
    return heads[drafter]


class SharedHead:
    """One sequence of a drafting context beside the target's cache (`_shared`, which keeps the
    rows that wait for its next decode): what an MTP head and a block drafter's head both are.
    `tokens` is what its cache holds, position by position; `cache` names the cache in errors."""

    _shared: Any
    seq: int
    tokens: list[int]
    cache = "the drafter's cache"

    @property
    def n_batch(self) -> int:
        return self._shared.n_batch

    @property
    def threads(self) -> ThreadPool:
        """The CPU threads its context decodes on: its target's."""
        return self._shared.threads

    def shares_cache(self, other: object) -> bool:
        """Whether `other` is a head of the same context (one `decode_many` takes both)."""
        return isinstance(other, SharedHead) and other._shared is self._shared

    def truncate(self, n_keep: int) -> None:
        """Forget positions from n_keep on, the waiting rows and drafting rows included (its cache
        is attention only: any tail drops)."""
        L, shared = llama(), self._shared
        if n_keep < len(self.tokens):
            shared.drop(self.seq, n_keep)
            if not L.llama_memory_seq_rm(L.llama_get_memory(shared.ctx), self.seq, n_keep, -1):
                raise SpecrunError(f"llama.cpp refused to roll {self.cache} back")
            del self.tokens[n_keep:]


class MtpHead(SharedHead):
    """The MTP layers of `target`'s model drafting for that sequence of its cache (one head:
    llama.cpp's single trained head), or a trained `drafter` of its own file that reads the
    target's features (EAGLE-3's decoder, its encoder in `encode`). A draft cache as a draft
    model's `Context` is: `eval` and `decode_many` decode drafting rows, each reading the hidden
    row its head was given (`reads`)."""

    cache = "the MTP head's cache"

    def __init__(self, target: Context, drafter: Model | None = None):
        model = drafter or target.model
        if drafter is None and not model.n_nextn:
            raise SpecrunError(
                f"the target model {model.path.name} has no MTP (NextN) layers, so it cannot draft for "
                "itself: drop --draft mtp, or give a draft model (--draft PATH) or --lookup"
            )
        self._shared = _heads_of(target, drafter)
        self.model = model
        self.seq = target.seq
        self.n_embd = model.n_embd_out
        self.tokens: list[int] = []  # what its cache holds, position by position: the target's text, then drafting rows
        self.reads = np.zeros(self.n_embd, dtype=np.float32)  # the hidden row its next drafting row reads
        self.row = np.zeros(self.n_embd, dtype=np.float32)  # its own hidden row of its last drafting row

    def encode(self, features: np.ndarray) -> np.ndarray:
        """An EAGLE-3 drafter's fused rows of the target's features (see `_HeadContext.encode`)."""
        return self._shared.encode(features)

    def process(self, tokens: Sequence[int], pos0: int, hidden: np.ndarray) -> None:
        """Follow the target's `tokens` from position pos0, each with `hidden[i]`, the target's
        hidden row of the position before it: rows that wait for the context's next decode."""
        self.truncate(pos0)
        self._shared.follow(self.seq, tokens, pos0, hidden)
        self.tokens.extend(tokens)

    def eval(self, tokens: Sequence[int], logits_rows: int = 1) -> np.ndarray:
        """One drafting row on its own (one stream); see `decode_many`."""
        return self.decode_many([(self, tokens, 1)])[0]

    def decode_many(self, parts: Sequence[tuple[MtpHead, Sequence[int], int]]) -> list[np.ndarray]:
        """One decode of a drafting row of each part's head (heads of this context): its token at
        the end of the head's cache, reading the head's `reads`; with the rows that wait. For each,
        the logits of the token after it (shape (1, n_vocab)); its hidden row goes to `row`. Both
        are views, valid until the context's next decode (which copies a `reads` into its batch first)."""
        L, LX, shared = llama(), llama_ext(), self._shared
        if any(len(tokens) != 1 or not head.shares_cache(self) for head, tokens, _ in parts):
            raise ValueError("each part: a head of this MTP context and one token")
        first = shared.decode([(head.seq, tokens[0], len(head.tokens), head.reads) for head, tokens, _ in parts])
        # The drafting rows are the decode's only output rows (their logits), in the parts' order.
        rows = shared.views.rows(LX.llama_get_embeddings_nextn(shared.ctx), first + len(parts), self.n_embd)[first:]
        logits = shared.views.rows(L.llama_get_logits(shared.ctx), len(parts), self.model.n_vocab)
        for i, (head, tokens, _) in enumerate(parts):
            head.tokens.append(tokens[0])
            head.row = rows[i]
        return [logits] if len(parts) == 1 else [logits[i : i + 1] for i in range(len(parts))]
