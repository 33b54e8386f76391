"""`pair check`: llama.cpp's compatibility rule plus what the pair will cost and gain."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specrun import settings
from specrun.backend.compat import CompatReport, check_vocab
from specrun.core.policy import AUTO_ROLLBACK, rollback_tokens
from specrun.headers.arch import DRAFTER, Traits, drafter_misfit, header_traits, state_bytes
from specrun.headers.read import ModelFacts
from specrun.hub.memory import MemoryBudget, memory_budget
from specrun.pair.cost import (
    MODEL_ASSUMPTIONS,
    DecodeCost,
    best_k,
    decode_cost,
    kv_cache_bytes,
    verdict,
)
from specrun.pair.sources import locate
from specrun.pair.translated import TranslatedPair, translated_pair
from specrun.settings import parse_k

DEFAULT_CTX = 4096

# Acceptance priors (per drafted token) before anything is measured: rough guesses.
# Reported same-family rates with llama.cpp range from 34% (Qwen2.5-Coder-32B + 3B) to
# 72% (Llama-3.1-8B + 3.2-1B); `--acceptance` or a measured rate replaces them.
PRIOR_SAME_FAMILY = 0.7
PRIOR_TUNED_DIFFERENTLY = 0.55  # a fine-tuned target drifts from its base family
PRIOR_OTHER_FAMILY = 0.4


@dataclass(frozen=True)
class Prior:
    alpha: float
    why: str


@dataclass(frozen=True)
class PairCheck:
    target: ModelFacts
    draft: ModelFacts
    compat: CompatReport
    target_cost: DecodeCost
    draft_cost: DecodeCost
    prior: Prior
    n_ctx: int
    budget: MemoryBudget | None = None  # the memory the pair would run in, RPC servers included
    translation: TranslatedPair | None = None  # two vocabularies, both files on disk: how they line up
    rollback: int = AUTO_ROLLBACK  # drafted tokens a recurrent target keeps snapshots for: the k's longest draft

    @property
    def translated(self) -> bool:
        """The vocabularies differ (llama.cpp's rule fails): specrun drafts through text."""
        return not self.compat.ok

    @property
    def target_traits(self) -> Traits:
        return traits_of(self.target)

    @property
    def draft_traits(self) -> Traits:
        return traits_of(self.draft)

    @property
    def can_draft(self) -> bool:
        """False for a target whose recurrent state llama.cpp cannot roll back, for a separate MTP
        drafter, and for vocabularies known to share almost nothing."""
        if not self.target_traits.speculates or self.draft_traits.mtp == DRAFTER or self.drafter_misfit:
            return False
        return not self.translated or self.translation is None or self.translation.overlap.usable

    @property
    def drafter_misfit(self) -> str | None:
        """Why a trained drafter cannot draft for this target (None: it can, or the draft is a model)."""
        trained = self.draft_traits.trained
        if trained is None:
            return None
        width = int(self.target.key("embedding_length", 0))
        return drafter_misfit(trained, self.draft.vocab.n_tokens, self.target.n_layers, width, self.target.vocab.n_tokens)

    @property
    def has_weights(self) -> bool:
        """False for vocab-only files: costs and ratios are then unknown."""
        return bool(self.target_cost.per_token_bytes and self.draft_cost.per_token_bytes)

    @property
    def cost_ratio(self) -> float | None:
        """The draft's cost per target token drafted, against the target's: bytes of weights read per
        token, times the draft tokens a target token takes when translated."""
        if not self.has_weights:
            return None
        per_target = self.translation.draft_per_target if self.translation is not None else 1.0
        return per_target * self.draft_cost.per_token_bytes / self.target_cost.per_token_bytes

    @property
    def param_ratio(self) -> float | None:
        return self.draft.n_params / self.target.n_params if self.has_weights else None

    @property
    def size_ratio(self) -> float:
        return self.draft.file_size / self.target.file_size

    @property
    def state_memory_bytes(self) -> int | None:
        """The recurrent states (0 for transformers): the target's own copy and one snapshot per token
        a draft may lose, and a draft's own copy and the checkpoint specrun keeps of it before it drafts;
        None where specrun does not know a state's size."""
        target, draft = state_bytes(self.target.meta), state_bytes(self.draft.meta)
        if target is None or draft is None:
            return None
        return target * snapshot_copies(self.target_traits, self.rollback) + draft * 2

    @property
    def memory_bytes(self) -> int | None:
        """Both files' weights, both f16 KV caches at n_ctx and the recurrent states (compute buffers extra)."""
        caches = [kv_cache_bytes(m.meta, self.n_ctx) for m in (self.target, self.draft)]
        states = self.state_memory_bytes
        if None in caches or states is None or not self.has_weights:
            return None
        return self.target.file_size + self.draft.file_size + sum(caches) + states  # type: ignore[arg-type]

    @property
    def fits(self) -> bool | None:
        """Whether both models and their caches fit the budget; None when either is unknown."""
        if self.budget is None or self.memory_bytes is None:
            return None
        return self.memory_bytes <= self.budget.bytes

    @property
    def verdict(self) -> str:
        if not self.target_traits.speculates:
            return (
                f"cannot draft: llama.cpp cannot roll back the target's recurrent state ({self.target.arch}), "
                "so no draft can be verified on it; run it plainly"
            )
        if self.draft_traits.mtp == DRAFTER:
            return (
                "cannot draft: the draft is a separate MTP drafter (a gemma4-assistant, or MTP layers alone), "
                "which specrun cannot run yet; a target with MTP layers of its own drafts with --draft mtp"
            )
        if self.drafter_misfit:
            return f"cannot draft: {self.drafter_misfit}"
        if not self.can_draft:
            o = self.translation.overlap  # type: ignore[union-attr]
            return (
                f"cannot draft: the vocabularies share almost nothing ({o.shared} byte strings, "
                f"{o.draft_share:.1%} of the draft's text tokens)"
            )
        if self.cost_ratio is None:
            vocab_only = [m.source for m in (self.target, self.draft) if not m.tensors]
            return f"no cost estimate: vocab-only file without weights: {', '.join(vocab_only)}"
        return verdict(self.cost_ratio, self.prior.alpha)

    @property
    def best_k(self) -> tuple[int, float] | None:
        return best_k(self.prior.alpha, self.cost_ratio) if self.cost_ratio is not None else None

    def warnings(self) -> list[str]:
        """Facts that change what the user should expect, in plain words."""
        found = []
        head = self.draft_cost
        if self.has_weights and head.head_share >= 0.5:
            tied = ", tied to token_embd so read in full" if head.head_tied else ""
            shape = " x ".join(str(d) for d in reversed(head.head_shape))
            found.append(
                f"the draft's output head ({shape}{tied}) is {head.head_share:.0%} of its "
                "per-token cost: removing layers cannot make this draft much cheaper"
            )
        hint = finetune_hint(self.target, self.draft)
        if hint:
            found.append(hint)
        return found

    def as_json(self) -> dict[str, Any]:
        k, speedup = self.best_k or (None, None)
        return {
            "compatible": self.compat.ok,
            "translated": self.translated,
            "can_draft": self.can_draft,
            "translation": self.translation.as_json() if self.translation is not None else None,
            "problems": list(self.compat.problems),
            "notes": list(self.compat.notes),
            "target": model_json(self.target, self.target_cost),
            "draft": model_json(self.draft, self.draft_cost),
            "param_ratio": self.param_ratio,
            "size_ratio": self.size_ratio,
            "cost_ratio": self.cost_ratio,
            "memory_bytes": self.memory_bytes,
            "memory_ctx": self.n_ctx,
            "rollback": self.rollback,
            "state_memory_bytes": self.state_memory_bytes,
            "memory_available": self.budget.bytes if self.budget else None,
            "memory_available_in": self.budget.where if self.budget else None,
            "fits": self.fits,
            "acceptance_prior": self.prior.alpha,
            "acceptance_prior_reason": self.prior.why,
            "best_k": k,
            "predicted_speedup": speedup,
            "verdict": self.verdict,
            "warnings": self.warnings(),
            "cost_model": MODEL_ASSUMPTIONS,
        }


def check_models(
    target: str,
    draft: str,
    *,
    ctx: int = DEFAULT_CTX,
    acceptance: float | None = None,
    offline: bool = False,
    rpc: tuple[str, ...] = (),
    k: int | str = "auto",
) -> PairCheck:
    """`pair check` of two model specs: their headers (from disk, else the hub's by range
    requests) and the memory they would run in at draft length `k`, the `rpc` servers' free
    memory included."""
    settings.check(ctx=ctx, acceptance=acceptance)
    rollback = rollback_tokens(parse_k(k))
    known = locate(target, offline), locate(draft, offline)
    target_facts, draft_facts = known[0].facts, known[1].facts
    assert target_facts is not None and draft_facts is not None  # without profile_fallback, locate reads a header or raises
    result = check_pair(target_facts, draft_facts, ctx, acceptance, budget=memory_budget(rpc=rpc))
    return with_translation(replace(result, rollback=rollback), known[0].path, known[1].path)


def traits_of(model: ModelFacts) -> Traits:
    return header_traits(model.meta, (t.name for t in model.tensors))


def snapshot_copies(traits: Traits, rollback: int) -> int:
    """Copies llama.cpp keeps of a target's recurrent state: its own, and one per token a draft may
    lose where it rolls back."""
    return 1 + rollback if traits.rolls_back else 1


def with_translation(result: PairCheck, target: Path | None, draft: Path | None) -> PairCheck:
    """A translated pair with how its vocabularies line up, read from the two files when both are on disk."""
    if result.translated and target is not None and draft is not None:
        return replace(result, translation=translated_pair(target, draft))
    return result


def check_pair(
    target: ModelFacts,
    draft: ModelFacts,
    ctx: int = DEFAULT_CTX,
    acceptance: float | None = None,
    why: str = "given",
    budget: MemoryBudget | None = None,
) -> PairCheck:
    """The pair's compatibility, costs and predicted speed-up; memory counted for `ctx` tokens,
    acceptance assumed from the families unless given."""
    settings.check(ctx=ctx, acceptance=acceptance)
    prior = Prior(acceptance, why) if acceptance is not None else acceptance_prior(target, draft)
    return PairCheck(
        target, draft, check_vocab(target.vocab, draft.vocab), decode_cost(target), decode_cost(draft), prior, ctx, budget
    )


def acceptance_prior(target: ModelFacts, draft: ModelFacts) -> Prior:
    if target.family.lower() != draft.family.lower():
        return Prior(PRIOR_OTHER_FAMILY, f"different families ({target.family}, {draft.family})")
    if finetune_hint(target, draft):
        return Prior(PRIOR_TUNED_DIFFERENTLY, f"same family ({target.family}), tuned differently")
    return Prior(PRIOR_SAME_FAMILY, f"same family ({target.family})")


def is_finetuned(model: ModelFacts) -> bool:
    return bool(model.base_models or model.meta.get("general.finetune"))


def finetune_hint(target: ModelFacts, draft: ModelFacts) -> str | None:
    """A hint when the target is a fine-tune and the draft is not tuned the same way."""
    if not is_finetuned(target):
        return None
    t_tune = str(target.meta.get("general.finetune", "")).lower()
    d_tune = str(draft.meta.get("general.finetune", "")).lower()
    if t_tune and t_tune == d_tune:
        return None
    base = ", ".join(target.base_models) or "its base model"
    tuned = f" ({t_tune})" if t_tune else ""
    return (
        f"the target is fine-tuned{tuned} from {base}: prefer a draft tuned the same way; "
        "acceptance with an untuned draft is usually lower"
    )


def model_json(model: ModelFacts, cost: DecodeCost) -> dict[str, Any]:
    return {
        "source": model.source,
        "architecture": model.arch,
        "name": model.meta.get("general.name"),
        "family": model.family,
        "base_models": list(model.base_models),
        "params": model.n_params,
        "file_bytes": model.file_size,
        "layers": model.n_layers,
        "vocab_type": model.vocab.vocab_type,
        "vocab_size": model.vocab.n_tokens,
        "bytes_per_token": cost.per_token_bytes,
        "head_bytes": cost.head_bytes,
        "head_tied": cost.head_tied,
        **traits_of(model).as_json(),
        "state_bytes": state_bytes(model.meta),  # one copy of its recurrent state; 0 without one
    }
