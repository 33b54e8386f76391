"""`pair suggest`: compatible drafts for a target, ranked by a stated cost model.

Candidates come from three places: the profiles (drafts listed for the target and the
smaller models of its family), the local caches, and (online) a hub search for the
target's family. Each is judged from its GGUF header alone, like `pair check`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Iterable

from specrun.errors import SpecrunError
from specrun.pair.check import PairCheck, check_pair
from specrun.pair.header import ModelFacts
from specrun.pair.sources import load_facts

PREFERRED_QUANTS = ("Q4_K_M", "Q8_0", "Q4_0", "Q5_K_M", "Q6_K")
HUB_SEARCH_LIMIT = 20
HUB_HEADERS_MAX = 8  # remote headers read per search: a few MB each


@dataclass(frozen=True)
class Candidate:
    spec: str  # what to pass as --draft
    origin: str  # "profile", "cache" or "hub"


@dataclass(frozen=True)
class Suggestion:
    spec: str
    origin: str
    check: PairCheck

    @property
    def speedup(self) -> float:
        best = self.check.best_k
        return best[1] if best else 0.0

    def as_json(self) -> dict:
        k, speedup = self.check.best_k or (None, None)
        details = self.check.as_json()
        shared = {key: value for key, value in details.items()
                  if key not in ("target", "draft", "cost_model")}
        return {"draft": self.spec, "origin": self.origin, "predicted_speedup": speedup, "k": k,
                "draft_model": details["draft"], **shared}


def family_key(text: str) -> str:
    """'Qwen2.5' / 'qwen2.5' / 'gemma-3' -> 'qwen25' / 'gemma3' for loose matching."""
    return re.sub(r"[^a-z0-9]", "", text.lower())


def profile_candidates(target_spec: str, target: ModelFacts) -> list[Candidate]:
    """The target profile's drafts first, then smaller models of the same family."""
    from specrun.hub.profiles import load_profiles

    profiles = load_profiles()
    keys = {family_key(target.family), family_key(target.arch)}
    own = profiles.get(target_spec.split(":")[0].lower())
    ordered = list(own.drafts) if own else []
    family = [p for p in profiles.values() if family_key(p.family) in keys or (own and p.family == own.family)]
    ordered += [p.alias for p in sorted(family, key=lambda p: p.params)]
    return [Candidate(alias, "profile") for alias in dict.fromkeys(ordered)]


def cache_candidates() -> list[Candidate]:
    """Complete GGUFs in the Hugging Face cache and specrun's own cache folder."""
    from specrun.default_model import cache_dir
    from specrun.hub.cache import cached_models
    from specrun.hub.profiles import load_profiles

    found = [Candidate(str(m.path), "cache") for m in cached_models(load_profiles())
             if m.complete and m.parts == 1]
    folder = cache_dir()
    if folder.is_dir():
        found += [Candidate(str(p), "cache") for p in sorted(folder.glob("*.gguf"))]
    return found


def hub_candidates(target: ModelFacts, limit: int = HUB_HEADERS_MAX) -> list[Candidate]:
    """GGUF repositories the hub finds for the target's family and base models."""
    from huggingface_hub import HfApi

    from specrun.hub.download import hub_endpoint, hub_errors
    from specrun.hub.quants import RepoFile, group_quants

    api = HfApi(endpoint=hub_endpoint())
    terms = [target.family, *(base.split("/")[-1] for base in target.base_models)]
    found: list[Candidate] = []
    for term in dict.fromkeys(terms):
        with hub_errors(term):
            models = list(api.list_models(search=term, filter="gguf", sort="downloads",
                                          limit=HUB_SEARCH_LIMIT, expand=["siblings"]))
        for model in models:
            files = [RepoFile(s.rfilename, s.size or 0) for s in model.siblings or []]
            choices = group_quants(files)
            quant = next((q for q in PREFERRED_QUANTS if q in choices), None)
            if quant is None or len(choices[quant].parts) != 1:
                continue
            found.append(Candidate(f"{model.id}/{choices[quant].first.path}", "hub"))
    return found[:limit]


def suggest(target_spec: str, offline: bool, top: int,
            report: Callable[[str], None] = lambda line: None) -> tuple[ModelFacts, list[Suggestion]]:
    from specrun.hub.download import NetworkUnavailable, offline_mode

    offline = offline or offline_mode()  # HF_HUB_OFFLINE=1 means --offline
    target = load_facts(target_spec, offline)
    candidates = profile_candidates(target_spec, target) + cache_candidates()
    if not offline:
        try:
            candidates += hub_candidates(target)
        except (SpecrunError, NetworkUnavailable) as exc:  # unreachable: the local candidates remain
            report(f"hub search skipped: {exc}")
    suggestions = judged(target, dedupe(candidates), offline, report)
    suggestions.sort(key=lambda s: (-s.speedup, s.check.draft.file_size))
    return target, suggestions[:top]


def dedupe(candidates: Iterable[Candidate]) -> list[Candidate]:
    seen: dict[str, Candidate] = {}
    for candidate in candidates:
        seen.setdefault(candidate.spec, candidate)
    return list(seen.values())


def judged(target: ModelFacts, candidates: list[Candidate], offline: bool,
           report: Callable[[str], None]) -> list[Suggestion]:
    """Compatible candidates cheaper than the target, each read once by its header."""
    kept: dict[tuple, Suggestion] = {}
    skipped: list[str] = []
    for candidate in candidates:
        try:
            draft = load_facts(candidate.spec, offline, for_draft=True)
        except SpecrunError as exc:
            skipped.append(f"{candidate.spec} ({exc})")
            continue
        result = check_pair(target, draft)
        same_file = (draft.file_size, draft.n_params) == (target.file_size, target.n_params)
        if not result.compat.ok or same_file or result.cost_ratio is None or result.cost_ratio >= 1:
            continue
        key = (draft.file_size, draft.n_params, draft.meta.get("general.name"))
        kept.setdefault(key, Suggestion(candidate.spec, candidate.origin, result))
    if skipped:
        report(f"{len(skipped)} candidates not readable, e.g. {skipped[0]}")
    return list(kept.values())

