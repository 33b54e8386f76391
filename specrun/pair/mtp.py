"""`pair check TARGET mtp` and `pair suggest`'s first line: a target's own MTP (NextN) layers as its draft.

Their cost per draft token comes from the header like a draft model's (the MTP layers and the
output head they share, against a decode of the model's own layers); their memory is the target's
with one more KV cache, that of the MTP layers' context. How often the head's guesses are
accepted is not assumed: it is measured (`specrun generate --draft mtp --compare-plain`), or given
with --acceptance.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specrun import settings
from specrun.core.policy import AUTO_ROLLBACK, rollback_tokens
from specrun.errors import SpecrunError
from specrun.headers.arch import DRAFTER, HEADS, SEPARATE, SEPARATE_DRAFTERS, state_bytes
from specrun.headers.read import ModelFacts
from specrun.hub.memory import MemoryBudget, memory_budget
from specrun.pair.check import DEFAULT_CTX, model_json, snapshot_copies, traits_of
from specrun.pair.cost import MODEL_ASSUMPTIONS, best_k, decode_cost, kv_cache_bytes, mtp_cost, verdict
from specrun.pair.sources import Known, locate
from specrun.settings import parse_k

MTP_SPEC = "mtp"  # what --draft takes for the target's own MTP layers
UNMEASURED = (
    "acceptance of MTP heads is not assumed: measure it (specrun generate --draft mtp --compare-plain) or give --acceptance"
)


@dataclass(frozen=True)
class MtpCheck:
    target: ModelFacts
    n_ctx: int = DEFAULT_CTX
    rollback: int = AUTO_ROLLBACK  # drafted tokens a recurrent target keeps snapshots for
    acceptance: float | None = None  # given, never assumed
    budget: MemoryBudget | None = None

    @property
    def mtp_layers(self) -> int:
        return traits_of(self.target).mtp_layers or 0

    @property
    def can_draft(self) -> bool:
        """False where llama.cpp cannot roll the target's recurrent state back (Qwen3-Next)."""
        return traits_of(self.target).speculates

    @property
    def cost_ratio(self) -> float | None:
        """The MTP layers' bytes read per draft token against a decode of the target's own layers."""
        target = decode_cost(self.target).per_token_bytes
        return mtp_cost(self.target).per_token_bytes / target if target else None

    @property
    def state_memory_bytes(self) -> int | None:
        one = state_bytes(self.target.meta)  # the target's: the MTP layers' own context keeps none
        return one * snapshot_copies(traits_of(self.target), self.rollback) if one is not None else None

    @property
    def memory_bytes(self) -> int | None:
        """The weights, the f16 KV caches of the model's layers and of its MTP layers' context at
        n_ctx, and the recurrent state's copies (compute buffers extra)."""
        caches = kv_cache_bytes(self.target.meta, self.n_ctx), kv_cache_bytes(self.target.meta, self.n_ctx, mtp=True)
        states = self.state_memory_bytes
        if None in caches or states is None or self.cost_ratio is None:
            return None
        return self.target.file_size + sum(caches) + states  # type: ignore[arg-type]

    @property
    def fits(self) -> bool | None:
        if self.budget is None or self.memory_bytes is None:
            return None
        return self.memory_bytes <= self.budget.bytes

    @property
    def best_k(self) -> tuple[int, float] | None:
        if self.acceptance is None or self.cost_ratio is None:
            return None
        return best_k(self.acceptance, self.cost_ratio)

    @property
    def verdict(self) -> str:
        if not self.can_draft:
            return traits_of(self.target).recurrent_note()
        if self.cost_ratio is None:
            return f"no cost estimate: {self.target.source} is a vocab-only file without weights"
        if self.acceptance is None:
            return f"its MTP layers cost {self.cost_ratio:.0%} of the target per token; {UNMEASURED}"
        return verdict(self.cost_ratio, self.acceptance)

    def as_json(self) -> dict[str, Any]:
        k, speedup = self.best_k or (None, None)
        return {
            "draft": MTP_SPEC,
            "target": model_json(self.target, decode_cost(self.target)),
            "mtp_layers": self.mtp_layers,
            "can_draft": self.can_draft,
            "cost_ratio": self.cost_ratio,
            "mtp_bytes_per_token": mtp_cost(self.target).per_token_bytes,
            "memory_bytes": self.memory_bytes,
            "memory_ctx": self.n_ctx,
            "rollback": self.rollback,
            "state_memory_bytes": self.state_memory_bytes,
            "memory_available": self.budget.bytes if self.budget else None,
            "memory_available_in": self.budget.where if self.budget else None,
            "fits": self.fits,
            "acceptance_prior": self.acceptance,
            "best_k": k,
            "predicted_speedup": speedup,
            "verdict": self.verdict,
            "cost_model": MODEL_ASSUMPTIONS,
        }


def check_mtp(
    target: str,
    *,
    ctx: int = DEFAULT_CTX,
    acceptance: float | None = None,
    offline: bool = False,
    rpc: tuple[str, ...] = (),
    k: int | str = "auto",
) -> MtpCheck:
    """`pair check TARGET mtp`: the target's header, refused in one line when it has no MTP layers."""
    settings.check(ctx=ctx, acceptance=acceptance)
    rollback = rollback_tokens(parse_k(k))
    known = locate(target, offline)
    assert known.facts is not None  # locate without a profile fallback answers with a header
    refuse_without_heads(known.facts, target)
    return MtpCheck(known.facts, ctx, rollback, acceptance, memory_budget(rpc=rpc))


def refuse_without_heads(model: ModelFacts, spec: str) -> None:
    """The library's line for --draft mtp on a model without MTP layers, with what to do instead here."""
    traits = traits_of(model)
    name = Path(model.source).name
    if traits.mtp == DRAFTER:
        raise SpecrunError(
            f"{name} is an MTP drafter ({model.arch}), not a model to generate with: give the model it drafts for as the target"
        )
    if traits.mtp != HEADS:
        drafter = SEPARATE_DRAFTERS.get(model.arch, "a model of its own")
        separate = f"; its MTP drafter is a separate {drafter}, which specrun cannot run yet" if traits.mtp == SEPARATE else ""
        raise SpecrunError(
            f"the target model {name} has no MTP (NextN) layers, so it cannot draft for itself{separate}: "
            f"check a draft model instead (specrun pair suggest --target {spec} lists some)"
        )


@dataclass(frozen=True)
class OwnHeads:
    """`pair suggest`'s first line for a target with MTP layers: `--draft mtp`, no second model."""

    target: Known
    check: MtpCheck | None  # from the target's header; None when only its profile says it has them

    def as_json(self) -> dict[str, Any]:
        check = self.check
        return {
            "draft": MTP_SPEC,
            "origin": "own MTP layers",
            "evidence": self.target.evidence,
            "on_disk": str(self.target.path) if self.target.path else None,
            "store": self.target.store,
            "predicted_speedup": None,
            "k": None,
            "mtp_layers": check.mtp_layers if check else None,
            "cost_ratio": check.cost_ratio if check else None,
            "memory_bytes": check.memory_bytes if check else None,
            "verdict": check.verdict if check else f"MTP heads per its profile; {UNMEASURED}",
        }
