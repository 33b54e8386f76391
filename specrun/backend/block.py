"""A block drafter (DFlash) beside its target, on a llama.cpp context of its own.

As llama.cpp's draft-dflash drives one (common/speculative.cpp,
`common_speculative_impl_draft_dflash`): the inputs of the target layers the drafter reads, at
each position the target decodes, go into the drafter's cache at that same position (a row of
features, which the drafter's graph fuses with `fc` and writes as keys and values only:
`follow`). A draft is one decode of a block [last token, mask, mask, ...] at the positions after
the text, non-causal unless the drafter says otherwise, whose rows after the first give the
logits of the drafted tokens (`decode_many`); the block leaves the cache before the target
verifies (`truncate`). The feature rows wait in their batch until the next block decode, or
until it fills: a step that does not draft costs a row copy, and rows a rollback drops are
never decoded. The blocks of a target's sequences (one per stream) go in one decode.
"""

from __future__ import annotations

import weakref
from typing import Sequence

import numpy as np

from specrun.backend.context import Context
from specrun.backend.library import llama
from specrun.backend.model import Model
from specrun.backend.mtp import SharedHead, context_beside
from specrun.backend.views import BatchViews, FloatViews, row_views
from specrun.errors import SpecrunError


class _BlockContext:
    """The drafter's context over a target's cache, its batch of feature rows waiting to be
    written into the cache, and its batch of blocks."""

    def __init__(self, target: Context, drafter: Model, width: int, causal: bool):
        L = llama()
        self.model, self.n_batch = drafter, target.n_batch
        self.ctx = context_beside(target, drafter)
        self.threads = target.threads
        L.llama_set_causal_attn(self.ctx, causal)  # a DFlash block attends both ways unless it was trained causal
        self.rows = L.llama_batch_init(self.n_batch, width, 1)  # feature rows: no tokens
        self.row_pos, wants, self.row_seqs = row_views(self.rows, self.n_batch)
        wants[:] = 0  # they write the cache and give nothing back
        self.features = np.ctypeslib.as_array(self.rows.embd, shape=(self.n_batch, width))
        self.waiting: list[tuple[int, int]] = []  # (sequence, position) of each waiting row
        self.blocks = L.llama_batch_init(self.n_batch, 0, 1)
        self.token, self.pos, self.wants, self.seq_ids = BatchViews.of(self.blocks, self.n_batch)
        self.views = FloatViews()
        drafter.own(self)
        target.model.own(self)  # it reads the target's context: it goes before the target's weights too

    def close(self) -> None:
        if self.ctx:
            L = llama()
            L.llama_batch_free(self.rows)
            L.llama_batch_free(self.blocks)
            L.llama_free(self.ctx)
            self.threads.release()
            self.ctx = None

    def follow(self, seq: int, pos0: int, features: np.ndarray) -> None:
        """Feature rows of sequence `seq` from position pos0 on, to wait for the next decode."""
        done = 0
        while done < len(features):
            if len(self.waiting) == self.n_batch:
                self._write_waiting()
            at, n = len(self.waiting), min(len(features) - done, self.n_batch - len(self.waiting))
            self.features[at : at + n] = features[done : done + n]
            self.row_pos[at : at + n] = np.arange(pos0 + done, pos0 + done + n)
            for row in range(at, at + n):
                self.row_seqs[row][0] = seq
            self.waiting += [(seq, pos) for pos in range(pos0 + done, pos0 + done + n)]
            done += n

    def drop(self, seq: int, n_keep: int) -> None:
        """Forget the waiting rows of `seq` from position n_keep on."""
        kept = [i for i, (s, pos) in enumerate(self.waiting) if s != seq or pos < n_keep]
        if len(kept) == len(self.waiting):
            return
        self.features[: len(kept)], self.row_pos[: len(kept)] = self.features[kept], self.row_pos[kept]
        for row, i in enumerate(kept):
            self.row_seqs[row][0] = self.waiting[i][0]
        self.waiting = [self.waiting[i] for i in kept]

    def decode(self, blocks: Sequence[tuple[int, Sequence[int], int, int]]) -> np.ndarray:
        """The waiting rows written, then one decode of `blocks` (sequence, tokens, first
        position, logits rows: its last ones): the logits rows of all, in their order (a view,
        valid until the next decode)."""
        self._write_waiting()
        n = all_rows = 0
        for seq, tokens, pos0, rows in blocks:
            first_out = n + len(tokens) - rows
            for pos, token in enumerate(tokens, pos0):
                self.token[n], self.pos[n], self.wants[n] = token, pos, n >= first_out
                self.seq_ids[n][0] = seq
                n += 1
            all_rows += rows
        self._decode(self.blocks, n)
        return self.views.rows(llama().llama_get_logits(self.ctx), all_rows, self.model.n_vocab)

    def _write_waiting(self) -> None:
        if self.waiting:
            n, self.waiting = len(self.waiting), []
            self._decode(self.rows, n)

    def _decode(self, batch, n: int) -> None:
        batch.n_tokens = n
        status = llama().llama_decode(self.ctx, batch)
        if status != 0:
            raise SpecrunError(f"the {self.model.path.name} drafter's decode failed with status {status}")


_CONTEXTS: weakref.WeakKeyDictionary[Context, dict[Model, _BlockContext]] = weakref.WeakKeyDictionary()
"""The drafter's context beside each target cache, made once, keyed by the cache's sequence 0."""


class BlockHead(SharedHead):
    """A block drafter drafting for one sequence of `target`'s cache, which reads the inputs of
    the target's layers (`width` floats a position, side by side). A draft cache as a draft
    model's `Context` is: `eval` and `decode_many` decode blocks after what it holds."""

    def __init__(self, target: Context, drafter: Model, width: int, causal: bool = False, equal_blocks: bool = False):
        contexts = _CONTEXTS.setdefault(target.sequence(0), {})
        if drafter not in contexts:
            contexts[drafter] = _BlockContext(target, drafter, width, causal)
        self._shared = contexts[drafter]
        self.equal_blocks = equal_blocks  # a decode takes blocks of one length only (DSpark's graph asks it)
        self.model = drafter
        self.seq = target.seq
        self.tokens: list[int] = []  # the text its cache holds (features), then a block's tokens

    def follow(self, tokens: Sequence[int], pos0: int, features: np.ndarray) -> None:
        """The target decoded `tokens` from position pos0, whose layer inputs are `features`."""
        self.truncate(pos0)
        self._shared.follow(self.seq, pos0, features)
        self.tokens.extend(tokens)

    def eval(self, tokens: Sequence[int], logits_rows: int = 1) -> np.ndarray:
        """One block on its own (one stream); see `decode_many`."""
        return self.decode_many([(self, tokens, logits_rows)])[0]

    def decode_many(self, parts: Sequence[tuple[BlockHead, Sequence[int], int]]) -> list[np.ndarray]:
        """One decode of a block of each part's head (heads of this context), after what its
        cache holds: for each, the logits of its block's last rows (views, valid until the
        context's next decode)."""
        if not all(head.shares_cache(self) and 0 < rows <= len(tokens) for head, tokens, rows in parts):
            raise ValueError("each part: a head of this context, a block, and up to that many logits rows")
        lengths = {len(tokens) for _, tokens, _ in parts}
        if self.equal_blocks and len(lengths) > 1:  # a decode per length, whose rows the next one overwrites: copied
            decoded: dict[int, np.ndarray] = {}
            for n in lengths:
                group = [part for part in parts if len(part[1]) == n]
                decoded |= {id(part): rows.copy() for part, rows in zip(group, self.decode_many(group))}
            return [decoded[id(part)] for part in parts]
        logits = self._shared.decode([(head.seq, tokens, len(head.tokens), rows) for head, tokens, rows in parts])
        views, row = [], 0
        for head, tokens, rows in parts:
            head.tokens.extend(tokens)
            views.append(logits[row : row + rows])
            row += rows
        return views
