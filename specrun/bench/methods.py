"""What a benchmark compares: plain decoding and speculative methods at several k."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from specrun.core.policy import parse_k
from specrun.drafts.base import Chain, DraftSource, model_part
from specrun.errors import SpecrunError
from specrun.session import Session

PLAIN = "plain"


def _lookup(session: Session, slot: int = 0) -> DraftSource:
    return session.source("lookup", slot)  # fresh per run: its index is the run's history


def _draft_model(session: Session, slot: int = 0) -> DraftSource:
    model = model_part(session.drafter_for(slot))  # alone, or chained with lookup and store
    if model is None:
        raise SpecrunError("the draft method needs a draft model: pass --draft PATH")
    return model


def _hybrid(session: Session, slot: int = 0) -> DraftSource:
    return Chain(_lookup(session, slot), _draft_model(session, slot))  # lookup when the context matches, else the model


def _store(session: Session, slot: int = 0) -> DraftSource:
    # Lookup in the prompt first, then the n-grams of the run's earlier prompts and outputs.
    return Chain(_lookup(session, slot), session.source("store", slot))


# Method name -> drafter for one run on a stream (slot). Plain decoding is the baseline, always measured.
METHODS: dict[str, Callable[..., DraftSource | None]] = {
    PLAIN: lambda session, slot=0: None,
    "lookup": _lookup,
    "draft": _draft_model,
    "hybrid": _hybrid,
    "store": _store,
}
NEEDS_DRAFT_MODEL = {"draft", "hybrid"}
NEEDS_STORE = {"store"}


@dataclass(frozen=True)
class Variant:
    """One thing measured on every prompt: a method at one k (k = 0 for plain).

    k is a draft length, "auto" or "llama.cpp" (policies that choose k per step).
    """

    method: str
    k: int | str = 0

    @property
    def key(self) -> str:
        return PLAIN if self.method == PLAIN else f"{self.method}_k{str(self.k).replace('.', '')}"

    @property
    def label(self) -> str:
        return PLAIN if self.method == PLAIN else f"{self.method} k{self.k}"


def k_order(k: int | str) -> int:
    """Sort key for k values: draft lengths by size, then the policies (which may draft longer)."""
    return k if isinstance(k, int) else 1_000_000 + ("auto", "llama.cpp").index(k)


def parse_k_values(text: str) -> list[int | str]:
    items = [item for item in text.split(",") if item.strip()]
    if not items:
        raise SpecrunError("--k is empty: give a comma list like 2,4,8")
    return list(dict.fromkeys(parse_k(item.strip()) for item in items))


def parse_methods(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise SpecrunError(f"--methods is empty: give a comma list of {', '.join(METHODS)}")
    for name in names:
        if name not in METHODS:
            raise SpecrunError(f"--methods: unknown method {name!r} (known: {', '.join(METHODS)})")
    return list(dict.fromkeys(names))


def plan_variants(methods: list[str], ks: list[int | str]) -> list[Variant]:
    """Plain first, then every speculative method at every k, in the order given."""
    variants = [Variant(PLAIN)]
    for method in methods:
        if method != PLAIN:
            variants += [Variant(method, k) for k in ks]
    return variants
