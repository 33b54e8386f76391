"""`pair suggest`: drafts for a target, ranked by a stated cost model.

Candidates come from the profiles (drafts listed for the target and the other models of
its family), the files already on disk (the Hugging Face cache, Ollama, LM Studio,
llama.cpp, specrun's cache) and, online, a hub search for the target's family; a file on
disk with another vocabulary is offered as a translated draft. Local knowledge comes first:
a file on disk is judged by its header, a hub file by its remote header, and with neither
(offline) a profile model by its profile: the same tokenizer and the parameters each reads per
token. Each suggestion says which. A target with MTP layers of its own has them listed first
(`--draft mtp`); one whose recurrent state llama.cpp cannot roll back gets no drafts at all.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from specrun import settings
from specrun.errors import SpecrunError
from specrun.headers.arch import HEADS, TRAINED_DRAFTERS, Traits, profile_traits
from specrun.hub.embedded import cache_dir
from specrun.hub.profiles import load_profiles
from specrun.hub.quants import RepoFile, group_quants
from specrun.hub.stores import stored_models
from specrun.pair.check import (
    PRIOR_OTHER_FAMILY,
    PRIOR_SAME_FAMILY,
    PairCheck,
    Prior,
    check_pair,
    traits_of,
    with_translation,
)
from specrun.pair.cost import best_k, verdict
from specrun.pair.mtp import MtpCheck, OwnHeads
from specrun.pair.sources import PROFILE, Known, locate

PREFERRED_QUANTS = ("Q4_K_M", "Q8_0", "Q4_0", "Q5_K_M", "Q6_K")
HUB_SEARCH_LIMIT = 20
HUB_HEADERS_MAX = 8  # remote headers read per search: a few MB each
STORE_ORIGINS = {"hf": "cache", "ollama": "ollama", "lmstudio": "lmstudio", "llama.cpp": "llama.cpp"}


@dataclass(frozen=True)
class Candidate:
    spec: str  # what to pass as --draft
    origin: str  # "profile", "cache" (HF or specrun's), "ollama", "lmstudio", "llama.cpp" or "hub"


@dataclass(frozen=True)
class ProfileEstimate:
    """A pair judged from profiles: vocabulary by the shared tokenizer, cost by parameter counts."""

    tokenizer: str
    cost_ratio: float  # draft/target parameters read per token, as if both had the same quant
    prior: Prior

    @property
    def best_k(self) -> tuple[int, float]:
        return best_k(self.prior.alpha, self.cost_ratio)


@dataclass(frozen=True)
class Suggestion:
    spec: str
    origin: str
    draft: Known
    check: PairCheck | None = None  # both headers read
    estimate: ProfileEstimate | None = None  # otherwise, from the profiles

    @property
    def evidence(self) -> str:
        return self.draft.evidence if self.check is not None else PROFILE

    @property
    def best(self) -> tuple[int, float] | None:
        return self.check.best_k if self.check is not None else self.estimate.best_k  # type: ignore[union-attr]

    @property
    def speedup(self) -> float:
        return self.best[1] if self.best else 0.0

    @property
    def cost_ratio(self) -> float:
        ratio = self.check.cost_ratio if self.check is not None else self.estimate.cost_ratio  # type: ignore[union-attr]
        return ratio or 0.0

    @property
    def prior(self) -> Prior:
        return self.check.prior if self.check is not None else self.estimate.prior  # type: ignore[union-attr]

    @property
    def memory_bytes(self) -> int | None:
        return self.check.memory_bytes if self.check is not None else None

    @property
    def translated(self) -> bool:
        """Another vocabulary than the target's: it drafts through the translating source."""
        return self.check is not None and self.check.translated

    def as_json(self) -> dict:
        k, speedup = self.best or (None, None)
        place = {
            "evidence": self.evidence,
            "on_disk": str(self.draft.path) if self.draft.path else None,
            "store": self.draft.store,
        }
        if self.check is None:
            return {
                "draft": self.spec,
                "origin": self.origin,
                **place,
                "predicted_speedup": speedup,
                "k": k,
                "draft_model": profile_json(self.draft),
                **estimate_json(self.estimate),  # type: ignore[arg-type]
            }
        details = self.check.as_json()
        shared = {key: value for key, value in details.items() if key not in ("target", "draft", "cost_model")}
        return {
            "draft": self.spec,
            "origin": self.origin,
            **place,
            "predicted_speedup": speedup,
            "k": k,
            "draft_model": details["draft"],
            **shared,
        }


def profile_json(model: Known) -> dict:
    profile = model.profile
    assert profile is not None
    return {
        "alias": profile.alias,
        "family": profile.family,
        "tokenizer": profile.tokenizer,
        "params": model.facts.n_params if has_weights(model) else profile.params,  # type: ignore[union-attr]
    }


def estimate_json(estimate: ProfileEstimate) -> dict:
    k, speedup = estimate.best_k
    return {
        "compatible": True,
        "problems": [],
        "notes": [f"same tokenizer per the profiles ({estimate.tokenizer})"],
        "param_ratio": estimate.cost_ratio,
        "size_ratio": None,
        "cost_ratio": estimate.cost_ratio,
        "memory_bytes": None,
        "acceptance_prior": estimate.prior.alpha,
        "acceptance_prior_reason": estimate.prior.why,
        "best_k": k,
        "predicted_speedup": speedup,
        "verdict": verdict(estimate.cost_ratio, estimate.prior.alpha),
        "warnings": [],
    }


def family_key(text: str) -> str:
    """'Qwen2.5' / 'qwen2.5' / 'gemma-3' -> 'qwen25' / 'gemma3' for loose matching."""
    return re.sub(r"[^a-z0-9]", "", text.lower())


def has_weights(model: Known) -> bool:
    return model.facts is not None and bool(model.facts.tensors)


def profile_candidates(target: Known) -> list[Candidate]:
    """The target profile's drafts first (its trained drafters among them), then the models of its
    family (or tokenizer); a trained drafter drafts only for the targets that list it."""
    profiles = load_profiles()
    own = target.profile
    keys = {family_key(target.facts.family), family_key(target.facts.arch)} if target.facts else set()
    ordered = list(own.drafts) if own else []
    related = [
        p
        for p in profiles.values()
        if not p.drafter and (family_key(p.family) in keys or (own and (p.family == own.family or p.tokenizer == own.tokenizer)))
    ]
    ordered += [p.alias for p in sorted(related, key=lambda p: p.params)]
    own_alias = own.alias if own else None
    return [Candidate(alias, "profile") for alias in dict.fromkeys(ordered) if alias != own_alias]


def stored_candidates(target: Known, report: Callable[[str], None]) -> list[Candidate]:
    """Single-file GGUFs already on disk, smaller than the target (a larger file is no cheaper draft)."""
    models = [m for m in stored_models(load_profiles()) if m.usable and len(m.parts) == 1]
    files = [
        (m.path, m.size, f"ollama:{m.name}" if m.source == "ollama" else str(m.path), STORE_ORIGINS[m.source])
        for m in models
        if m.path is not None
    ]  # all of them: usable ones have a path
    folder = cache_dir()
    if folder.is_dir():
        files += [(p, p.stat().st_size, str(p), "cache") for p in sorted(folder.glob("*.gguf"))]
    if target.facts is None:
        # Without the target's header a file's vocabulary cannot be compared with it; the
        # files a profile knows are judged through their alias instead.
        unknown = [m.name for m in models if m.alias is None]
        if unknown:
            report(
                f"{len(unknown)} models on disk not judged (e.g. {unknown[0]}): no profile knows "
                "them and the target's header is needed to compare their vocabulary"
            )
        return []
    if not has_weights(target):
        return [Candidate(spec, origin) for _, _, spec, origin in files]
    own = (target.path or Path()).resolve()
    return [
        Candidate(spec, origin) for path, size, spec, origin in files if size < target.facts.file_size and path.resolve() != own
    ]


def hub_candidates(target: Known, limit: int = HUB_HEADERS_MAX) -> list[Candidate]:
    """GGUF repositories the hub finds for the target's family and base models."""
    # huggingface_hub's client is slow to import (docs/benchmarks.md, "Small costs behind the code"):
    # paid only by a hub search, not by every command's start.
    from huggingface_hub import HfApi

    from specrun.hub.download import hub_endpoint, hub_errors

    assert target.facts is not None
    api = HfApi(endpoint=hub_endpoint())
    terms = [target.facts.family, *(base.split("/")[-1] for base in target.facts.base_models)]
    found: list[Candidate] = []
    for term in dict.fromkeys(terms):
        with hub_errors(term):
            models = list(
                api.list_models(search=term, filter="gguf", sort="downloads", limit=HUB_SEARCH_LIMIT, expand=["siblings"])
            )
        for model in models:
            files = [RepoFile(s.rfilename, s.size or 0) for s in model.siblings or []]
            choices = group_quants(files)
            quant = next((q for q in PREFERRED_QUANTS if q in choices), None)
            if quant is None or len(choices[quant].parts) != 1:
                continue
            found.append(Candidate(f"{model.id}/{choices[quant].first.path}", "hub"))
    return found[:limit]


def suggest(
    target_spec: str, offline: bool, top: int, report: Callable[[str], None] = lambda line: None
) -> tuple[Known, OwnHeads | None, list[Suggestion]]:
    """The target as known; its own MTP layers, when it has them, which come first; and the drafts
    that fit it best, best first, `top` in all. None for a target llama.cpp cannot roll back."""
    from specrun.hub.download import NetworkUnavailable, offline_mode  # huggingface_hub, as in hub_candidates

    settings.check(top=top)
    offline = offline or offline_mode()  # HF_HUB_OFFLINE=1 means --offline
    target = locate(target_spec, offline, profile_fallback=True)
    if target.note and not offline:  # offline, the profile is the expected answer
        report(f"target judged from its profile: {target.note}")
    traits = known_traits(target)
    if not traits.speculates:
        return target, None, []
    own = OwnHeads(target, MtpCheck(target.facts) if target.facts else None) if traits.mtp == HEADS else None
    candidates = profile_candidates(target) + stored_candidates(target, report)
    if not offline and target.facts is not None:
        try:
            candidates += hub_candidates(target)
        except (SpecrunError, NetworkUnavailable) as exc:  # unreachable: the local candidates remain
            report(f"hub search skipped: {exc}")
    suggestions = judged(target, dedupe(candidates), offline, report)
    suggestions.sort(key=lambda s: (-s.speedup, s.cost_ratio))
    return target, own, suggestions[: top - (own is not None)]


def known_traits(model: Known) -> Traits:
    """What the model is for drafting: from its header, else its profile."""
    if model.facts is not None:
        return traits_of(model.facts)
    assert model.profile is not None  # locate answers with a header or a profile
    return profile_traits(model.profile.mtp, model.profile.hybrid)


def dedupe(candidates: Iterable[Candidate]) -> list[Candidate]:
    seen: dict[str, Candidate] = {}
    for candidate in candidates:
        seen.setdefault(candidate.spec, candidate)
    return list(seen.values())


def judged(target: Known, candidates: list[Candidate], offline: bool, report: Callable[[str], None]) -> list[Suggestion]:
    """Candidates that can draft for the target and are cheaper, each read once, each file judged once."""
    kept: dict[object, Suggestion] = {}
    skipped: list[str] = []
    for candidate in candidates:
        try:
            draft = locate(candidate.spec, offline, for_draft=True, profile_fallback=target.profile is not None)
        except SpecrunError as exc:
            skipped.append(f"{candidate.spec} ({exc})")
            continue
        suggestion = judge(target, draft, candidate)
        if suggestion is None:
            continue
        if draft.path is not None:
            key: object = draft.path.resolve()
        elif draft.facts is not None:
            key = (draft.facts.file_size, draft.facts.n_params, draft.facts.meta.get("general.name"))
        else:
            key = candidate.spec
        kept.setdefault(key, suggestion)
    if skipped:
        report(f"{len(skipped)} candidates not readable, e.g. {skipped[0]}")
    return list(kept.values())


def judge(target: Known, draft: Known, candidate: Candidate) -> Suggestion | None:
    """A suggestion when the draft can draft for the target and is cheaper; None otherwise. A
    draft with another vocabulary is judged translated where both files are on disk (how the
    vocabularies line up is read from them), and left out elsewhere."""
    if target.facts is not None and draft.facts is not None:
        result = with_translation(check_pair(target.facts, draft.facts), target.path, draft.path)
        same_file = (draft.facts.file_size, draft.facts.n_params) == (target.facts.file_size, target.facts.n_params)
        unread = result.translated and result.translation is None
        if unread or not result.can_draft or same_file or result.cost_ratio is None or result.cost_ratio >= 1:
            return None
        return Suggestion(candidate.spec, candidate.origin, draft, check=result)
    estimate = profile_estimate(target, draft)
    if estimate is None:
        return None
    return Suggestion(candidate.spec, candidate.origin, draft, estimate=estimate)


def profile_estimate(target: Known, draft: Known) -> ProfileEstimate | None:
    """Both profiles known and sharing a tokenizer: cost from the parameters each reads per token
    (a mixture of experts' active ones, which its header's total would overstate)."""
    t, d = target.profile, draft.profile
    if t is None or d is None or t.alias == d.alias or t.tokenizer != d.tokenizer:
        return None
    if d.drafter and d.alias not in t.drafts:  # trained to read another target's features
        return None
    ratio = d.active_params / t.active_params
    if ratio >= 1 or d.params >= t.params:  # a larger model is no draft, however few parameters it reads a token
        return None
    if d.drafter:
        prior = Prior(PRIOR_SAME_FAMILY, f"a {TRAINED_DRAFTERS[d.drafter]} drafter trained for {t.alias}, per the profiles")
    elif t.family == d.family:
        prior = Prior(PRIOR_SAME_FAMILY, f"same family ({t.family}), per the profiles")
    else:
        prior = Prior(PRIOR_OTHER_FAMILY, f"different families ({t.family}, {d.family}), one tokenizer")
    return ProfileEstimate(t.tokenizer, ratio, prior)
