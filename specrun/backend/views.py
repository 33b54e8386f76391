"""numpy views of the buffers llama.cpp hands out (logits, an MTP head's hidden rows) and of a
batch's arrays, which decodes write row by row."""

from __future__ import annotations

import ctypes
from typing import NamedTuple

import numpy as np

from specrun.backend.library import drafter_calls


class BatchViews(NamedTuple):
    """Zero-copy views of a `llama_batch`'s arrays, each row of one sequence (`seq_ids[n][0]`);
    `wants`: whether a row gives logits."""

    token: np.ndarray
    pos: np.ndarray
    wants: np.ndarray
    seq_ids: list

    @classmethod
    def of(cls, batch, size: int) -> BatchViews:
        """The views of `batch` (from llama_batch_init, `size` rows, one sequence id a row, which
        this sets to one)."""
        return cls(np.ctypeslib.as_array(batch.token, shape=(size,)), *row_views(batch, size))


def row_views(batch, size: int) -> tuple[np.ndarray, np.ndarray, list]:
    """Views of a `llama_batch`'s positions, output flags and sequence ids, one sequence a row
    (which this sets): what a batch of feature rows (no tokens) has too."""
    np.ctypeslib.as_array(batch.n_seq_id, shape=(size,))[:] = 1
    return (
        np.ctypeslib.as_array(batch.pos, shape=(size,)),
        np.ctypeslib.as_array(ctypes.cast(batch.logits, ctypes.POINTER(ctypes.c_int8)), shape=(size,)),
        [batch.seq_id[i] for i in range(size)],
    )


class FloatViews:
    """numpy views of a float buffer llama.cpp hands out (logits, hidden rows), made once per
    address and shape: `np.ctypeslib.as_array` builds ctypes types and parses a buffer format on
    every call, which costs far more than a decode's own host work when the caches are cold."""

    def __init__(self) -> None:
        self._views: dict[tuple[int, int, int], np.ndarray] = {}

    def rows(self, pointer, n_rows: int, width: int) -> np.ndarray:
        """The first n_rows rows of `width` floats at `pointer` (a view, valid while llama.cpp keeps the buffer)."""
        key = (ctypes.addressof(pointer.contents), n_rows, width)
        view = self._views.get(key)
        if view is None:
            if len(self._views) > 1024:  # buffers llama.cpp reallocated elsewhere
                self._views.clear()
            view = self._views[key] = np.ctypeslib.as_array(pointer, shape=(n_rows, width))
        return view


def layer_inputs(views: FloatViews, ctx, layers: tuple[int, ...], n_rows: int, width: int) -> np.ndarray:
    """The inputs of the target's `layers` at the last decode's n_rows rows, side by side: what an
    EAGLE-3 drafter's encoder reads (a copy: llama.cpp keeps each layer's in a buffer of its own)."""
    read = drafter_calls().llama_get_embeddings_layer_inp
    return np.concatenate([views.rows(read(ctx, layer), n_rows, width) for layer in layers], axis=1)
