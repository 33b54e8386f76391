"""What a benchmark compares: plain decoding and speculative methods at several k."""

from __future__ import annotations

from dataclasses import dataclass

from specrun.core.drafting import DraftSource
from specrun.drafts import registry
from specrun.drafts.chain import chained, model_part
from specrun.errors import SpecrunError
from specrun.session import Session
from specrun.settings import parse_k

PLAIN = "plain"
DRAFT = "draft"  # the draft --draft names: a GGUF, or a source that drafts as a model (--draft mtp)
# Methods that ask several sources in turn, each by its registered name (or the draft).
CHAINS = {"hybrid": ("lookup", DRAFT), "store": ("lookup", "store")}
NEEDS_DRAFT_MODEL = {DRAFT, "hybrid"}
NEEDS_STORE = {"store"}


def method_names() -> list[str]:
    """Plain decoding (the baseline, always measured), lookup, the draft and the chains as they
    have always been listed, then every other registered source alone."""
    return list(dict.fromkeys([PLAIN, "lookup", DRAFT, *CHAINS, *registry.names()]))


def sources_of(methods: list[str]) -> tuple[str, ...]:
    """The registered sources the methods ask for (the draft and the store are set up by their own options)."""
    names = [name for method in methods for name in CHAINS.get(method, (method,))]
    return tuple(dict.fromkeys(name for name in names if name not in (PLAIN, DRAFT, "store")))


def drafter(session: Session, method: str, slot: int = 0) -> DraftSource | None:
    """What drafts for `method` on stream `slot`: None for plain, else the session's own sources."""
    if method == PLAIN:
        return None
    return chained(
        [
            _draft(session, slot) if name == DRAFT else session.drafters.source(name, slot)
            for name in CHAINS.get(method, (method,))
        ]
    )


def _draft(session: Session, slot: int) -> DraftSource:
    model = model_part(session.drafters.chain(slot))  # alone, or chained with lookup and store
    if model is None:
        raise SpecrunError("the draft method needs a draft model: pass --draft PATH")
    return model


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
    known = method_names()
    if not names:
        raise SpecrunError(f"--methods is empty: give a comma list of {', '.join(known)}")
    for name in names:
        if name not in known:
            raise SpecrunError(f"--methods: unknown method {name!r} (known: {', '.join(known)})")
    return list(dict.fromkeys(names))


def plan_variants(methods: list[str], ks: list[int | str]) -> list[Variant]:
    """Plain first, then every speculative method at every k, in the order given."""
    variants = [Variant(PLAIN)]
    for method in methods:
        if method != PLAIN:
            variants += [Variant(method, k) for k in ks]
    return variants
