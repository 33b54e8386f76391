"""numpy views of the float buffers llama.cpp hands out (logits, an MTP head's hidden rows)."""

from __future__ import annotations

import ctypes

import numpy as np


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
