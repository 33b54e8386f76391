"""llama.cpp's grammar sampler as a state that says which tokens a grammar allows next.

`GrammarState` wraps one `llama_sampler_init_grammar`: `allows(ids)` asks llama.cpp about a
few tokens (the filtered support of a row: tens of tokens, microseconds), `mask(logits)` about
the whole vocabulary (milliseconds over 262k tokens: only when none of the few is allowed),
`accept` / `try_accept` advance it by a token the grammar allows, `clone` copies it to walk a draft.
"""

from __future__ import annotations

import ctypes

import numpy as np

from specrun.backend.library import llama
from specrun.backend.model import Model
from specrun.errors import SpecrunError

TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])  # struct llama_token_data


class GrammarState:
    """Where a generation stands in a grammar (llama.cpp's grammar sampler)."""

    def __init__(self, model: Model, gbnf: str, what: str = "grammar", _pointer=None):
        L = llama()
        self.model, self.what = model, what
        self._sampler = _pointer or L.llama_sampler_init_grammar(model._vocab, gbnf.encode(), b"root")
        if not self._sampler:
            raise SpecrunError(f"llama.cpp cannot parse the {what}'s GBNF (SPECRUN_DEBUG=1 shows where): fix the grammar")
        self._gbnf = gbnf

    def clone(self) -> "GrammarState":
        return GrammarState(self.model, self._gbnf, self.what, llama().llama_sampler_clone(self._sampler))

    def accept(self, token: int) -> None:
        """Advance by `token`, or refuse it with an error where the grammar forbids it."""
        if not self.try_accept(token):
            raise SpecrunError(f"token {token} ({self.model.piece(token)!r}) is not allowed by the {self.what} here")

    def try_accept(self, token: int) -> bool:
        """Advance by `token` if the grammar allows it; whether it did. llama.cpp ends the process
        on a token its grammar forbids, so that is asked first."""
        if not self.allows(np.array([token]))[0]:
            return False
        llama().llama_sampler_accept(self._sampler, token)
        return True

    def allows(self, ids: np.ndarray) -> np.ndarray:
        """For each token id, whether the grammar allows it next."""
        data = np.zeros(len(ids), dtype=TOKEN_DATA)
        data["id"] = ids
        return np.isfinite(self._apply(data)["logit"])

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """A copy of a vocabulary-wide row with -inf for every token the grammar forbids."""
        data = np.empty(len(logits), dtype=TOKEN_DATA)
        data["id"] = np.arange(len(logits), dtype=np.int32)
        data["logit"] = logits
        data["p"] = 0.0
        return self._apply(data)["logit"].copy()

    def _apply(self, data: np.ndarray) -> np.ndarray:
        L = llama()
        array = L.llama_token_data_array(
            data=data.ctypes.data_as(ctypes.POINTER(L.llama_token_data)), size=len(data), selected=-1, sorted=False
        )
        L.llama_sampler_apply(self._sampler, ctypes.byref(array))
        return data

    def close(self) -> None:
        if self._sampler:
            llama().llama_sampler_free(self._sampler)
            self._sampler = None

    def __del__(self) -> None:
        self.close()
