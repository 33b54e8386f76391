"""The one resolver every command uses: a model spec in, the GGUF to load out.

`locate_model` says where a spec's GGUF is, or which hub files it would come from, without
downloading anything; `resolve_model` is that and the download.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Callable

from specrun.errors import SpecrunError
from specrun.hub import embedded, stores
from specrun.hub.embedded import DEFAULT_ALIAS
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
from specrun.hub.stores import StoredModel

if TYPE_CHECKING:  # annotations only: importing it at run time is _hub()'s cost
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
    # The store it was found in without asking the hub: "hf" (the Hugging Face cache, offline),
    # "ollama", "lmstudio", "llama.cpp"; None for a path, the embedded model and the hub's files.
    store: str | None = None


@dataclass(frozen=True)
class ModelLocation:
    """Where a spec's GGUF is on disk, or the hub files it comes from."""

    repo: str | None  # owner/name on the hub; None for local and embedded files
    quant: str | None
    reason: str  # one line for stderr: which file and why
    alias: str | None = None
    files: tuple[Path, ...] = ()  # on disk, first part first; () when the hub's list chose it (hub_files)
    size_bytes: int = 0
    profile: ModelProfile | None = None  # the alias's
    store: str | None = None  # as ResolvedModel.store
    listing: RepoListing | None = None  # the file list (the hub's or the cache's) the file was chosen from
    # The files of listing.repo it comes from, when the hub's list chose them (resolve_model
    # fetches those the cache lacks); () when on disk.
    hub_files: tuple[RepoFile, ...] = ()

    @property
    def path(self) -> Path | None:
        """The GGUF to load (first part of a split set); None when it comes from the hub."""
        return self.files[0] if self.files else None


class HubLookupError(SpecrunError):
    """The hub step found no file: offline with nothing cached, the hub refusing or unreachable,
    no such file or quant. `repo` and `profile` are what was known of the model before it."""

    def __init__(self, message: str, repo: str, profile: ModelProfile | None):
        super().__init__(message)
        self.repo, self.profile = repo, profile


@dataclass(frozen=True)
class ModelRequest:
    """An alias or hub spec, and how to choose among its files."""

    parsed: ModelSpec
    profile: ModelProfile | None  # the alias's
    quant: str | None  # asked for, by --quant or the spec; None lets the memory decide
    budget_bytes: int | None  # the memory to fit in; None: measure it
    reserve_bytes: int  # kept for the draft and the caches
    excluded: frozenset[str]  # quants never chosen automatically
    rpc: tuple[str, ...]  # the servers whose free memory counts

    @property
    def repo(self) -> str:
        repo = self.profile.repo if self.profile else self.parsed.repo
        assert repo is not None  # parse_spec gives an alias or a repo
        return repo

    @property
    def pattern(self) -> str | None:
        return self.profile.file_pattern if self.profile else None

    @property
    def expected_file(self) -> str | None:
        """The file a named file or an alias's quant stands for, for messages."""
        if self.parsed.filename is not None:
            return self.parsed.filename
        return self.pattern.replace("{quant}", self.quant) if self.pattern and self.quant else None

    def budget(self) -> MemoryBudget | None:
        if self.budget_bytes is not None:
            return MemoryBudget(self.budget_bytes, "the given budget")
        return memory_budget(rpc=self.rpc)


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

    The file `locate_model` finds (its docstring says how the quant is chosen), downloaded
    into the Hugging Face cache when it is not there yet. A file that Ollama, LM Studio or
    llama.cpp already keeps is used where it lies.
    """
    location = locate_model(spec, quant=quant, offline=offline, memory_budget_bytes=memory_budget_bytes,
                            reserve_bytes=reserve_bytes, for_draft=for_draft, rpc=rpc)
    files = location.files or downloaded(location, show_progress)
    return ResolvedModel(
        files[0], location.repo, location.quant, location.reason, alias=location.alias, files=files,
        size_bytes=location.size_bytes, profile=location.profile, store=location.store,
    )


def locate_model(
    spec: str,
    *,
    quant: str | None = None,
    offline: bool = False,
    memory_budget_bytes: int | None = None,
    reserve_bytes: int = 0,
    for_draft: bool = False,
    rpc: tuple[str, ...] = (),
    disk_first: bool = False,
) -> ModelLocation:
    """Where a spec's GGUF is, or which hub files it would come from; nothing is downloaded.

    In order: a local path; an `ollama:` model where Ollama keeps it; the embedded default;
    a file Ollama, LM Studio or llama.cpp already keeps; else the file the hub's list offers
    (the cache's list when offline or the hub is unreachable), in the cache when it is there.
    Without a quant, the largest that fits the memory it will run in after reserve_bytes (the
    draft, another model) is chosen, that memory including the free memory of the `rpc`
    servers its layers go to; `quant` overrides the spec's; for_draft leaves 16-bit quants out.
    disk_first counts the Hugging Face cache among those stores, so that a file already there
    is taken before the hub is asked; otherwise the hub's list decides, and the cache saves
    the download. A failure of the hub step is a HubLookupError.
    """
    wanted = checked_quant(quant, "--quant") if quant else None
    local = local_model_path(spec)
    if local is not None:
        size = local.stat().st_size
        return ModelLocation(None, quant_of(local.name), f"{local}: local file", files=(local,), size_bytes=size)
    profiles = load_profiles()
    name = ollama_name(spec)
    if name is not None:
        return ollama_location(name, wanted, profiles)
    parsed = parse_spec(spec, profiles)
    request = ModelRequest(
        parsed, profiles.get(parsed.alias) if parsed.alias else None, wanted or parsed.quant,
        memory_budget_bytes, reserve_bytes, NEVER_AUTO_FOR_DRAFT if for_draft else NEVER_AUTO, rpc,
    )
    return (embedded_location(request) or stored_location(request, profiles, include_hf=disk_first)
            or hub_location(request, spec, offline))


def _hub() -> ModuleType:
    """specrun.hub.download: with huggingface_hub it takes about 175 ms to import (`python -X
    importtime -c 'import specrun.hub.download'`), so only specs that reach the hub pay for it."""
    from specrun.hub import download

    return download


def ollama_location(name: str, wanted: str | None, profiles: dict[str, ModelProfile]) -> ModelLocation:
    """ollama:NAME[:TAG]: the model layer of that manifest, loaded where Ollama keeps it."""
    model = stores.ollama_model(name, profiles)
    if wanted and model.quant != wanted:
        raise SpecrunError(
            f"ollama:{model.name} holds {model.quant or 'an unnamed quant'}, not {wanted}: Ollama keeps "
            f"one quant per tag, so name the tag that has it"
        )
    assert model.path is not None  # ollama_model() refuses unusable models
    return ModelLocation(
        model.repo, model.quant,
        f"ollama:{model.name}: {model.quant or 'GGUF'} ({format_bytes(model.size)}) from {model.where}: {model.path}",
        alias=model.alias, files=model.parts, size_bytes=model.size,
        profile=profiles.get(model.alias or ""), store=model.source,
    )


def embedded_location(request: ModelRequest) -> ModelLocation | None:
    """gemma-3-270m comes from the installed PyPI package, without the network."""
    if request.parsed.alias != DEFAULT_ALIAS or request.quant not in (None, EMBEDDED_QUANT):
        return None
    if not embedded.embedded_installed():
        return None
    path = embedded.embedded_model_path()
    return ModelLocation(
        None, EMBEDDED_QUANT, f"{DEFAULT_ALIAS}: {EMBEDDED_QUANT} embedded with specrun (no download)",
        alias=DEFAULT_ALIAS, files=(path,), size_bytes=path.stat().st_size, profile=request.profile,
    )


def stored_location(request: ModelRequest, profiles: dict[str, ModelProfile],
                    include_hf: bool = False) -> ModelLocation | None:
    """A file of this model that Ollama, LM Studio or llama.cpp (and, with include_hf, the
    Hugging Face cache) already keeps, or None.

    Asked for a quant or a file: that one, when a store has it. Asked for neither: the
    largest stored quant that fits in memory; when none fits, the hub decides as usual.
    """
    found = stores.matching(stores.stored_models(profiles, include_hf), request.repo,
                            request.parsed.filename, request.pattern)
    if request.quant is not None:
        found = [m for m in found if m.quant == request.quant]
    if not found:
        return None
    name = request.parsed.alias or request.repo
    if request.parsed.filename is not None or request.quant is not None:
        chosen = found[0]
        reason = f"{name}: {request.parsed.filename or request.quant} ({format_bytes(chosen.size)}) as asked"
    else:
        fitting = largest_stored(request, found)
        if fitting is None:
            return None
        chosen, reason = fitting
    assert chosen.path is not None  # matching() keeps usable models only
    return ModelLocation(
        request.repo, chosen.quant, f"{reason}; already on disk in {chosen.where}: {chosen.path}",
        alias=request.parsed.alias, files=chosen.parts, size_bytes=chosen.size, profile=request.profile,
        store=chosen.source,
    )


def largest_stored(request: ModelRequest, found: list[StoredModel]) -> tuple[StoredModel, str] | None:
    """The largest stored quant that fits in memory, and why; None when none fits."""
    by_label: dict[str, StoredModel] = {}
    for model in found:
        by_label.setdefault(model.quant or model.file or model.name, model)
    choices = {label: QuantChoice(label, (RepoFile(str(m.path), m.size),)) for label, m in by_label.items()}
    name = request.parsed.alias or request.repo
    choice = fit_quant(name, choices, request.budget(), request.reserve_bytes, "stored ", request.excluded)
    return (by_label[choice.quant_choice.quant], choice.reason) if choice.fits else None


def hub_location(request: ModelRequest, spec: str, offline: bool) -> ModelLocation:
    """The file the hub's list offers (the cache's when offline or the hub is unreachable):
    where the cache keeps it, or the files to download."""
    try:
        listing = repo_listing(request.repo, offline or _hub().offline_mode(), spec, request.expected_file)
        choice = choose_file(listing, request)
        files = cached_files(listing, choice.quant_choice.parts, spec) if listing.cached else ()
    except SpecrunError as exc:
        raise HubLookupError(str(exc), request.repo, request.profile) from exc
    return ModelLocation(
        listing.repo, choice.quant_choice.quant, choice.reason, alias=request.parsed.alias, files=files,
        size_bytes=choice.quant_choice.size, profile=request.profile, store="hf" if listing.cached else None,
        listing=listing, hub_files=() if listing.cached else choice.quant_choice.parts,
    )


def downloaded(location: ModelLocation, show_progress: bool) -> tuple[Path, ...]:
    """The hub files a location names, fetched into the Hugging Face cache."""
    assert location.listing is not None  # a location without files has its hub's list
    return tuple(_hub().download(location.listing, location.hub_files, show_progress=show_progress))


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


def cached_files(listing: RepoListing, parts: tuple[RepoFile, ...], spec: str) -> tuple[Path, ...]:
    """Where the cache keeps the files of a cached listing; one gone since it was listed is an error."""
    paths = []
    for part in parts:
        path = _hub().cached_path(listing.repo, listing.commit, part.path)
        if path is None:
            raise SpecrunError(f"{spec}: {part.path} vanished from the cache: run `specrun pull {spec}`")
        paths.append(path)
    return tuple(paths)


@dataclass(frozen=True)
class ChosenQuant:
    quant_choice: QuantChoice
    reason: str
    fits: bool = True  # False when even the smallest quant exceeds the memory budget


def choose_file(listing: RepoListing, request: ModelRequest) -> ChosenQuant:
    """The file named, the quant asked for, or the largest that fits; one the list lacks is an error."""
    name = request.parsed.alias or listing.repo
    if request.parsed.filename is not None:
        filename = request.parsed.filename
        return ChosenQuant(named_file(listing, filename), f"{name}: {filename} as named")
    choices = group_quants(listing.files, request.pattern)
    if not choices:
        raise SpecrunError(no_gguf_message(listing, request.pattern))
    where = "cached " if listing.cached else ""
    if request.quant is None:
        return fit_quant(name, choices, request.budget(), request.reserve_bytes, where, request.excluded)
    if request.quant not in choices:
        raise SpecrunError(
            f"{name} has no {where}{request.quant} GGUF{missing_note(listing, request.pattern, request.quant)}; "
            f"{where}quants: {', '.join(sorted(choices))}"
        )
    chosen = choices[request.quant]
    return ChosenQuant(chosen, f"{name}: {request.quant} ({format_bytes(chosen.size)}) as asked")


def fit_quant(
    name: str,
    choices: dict[str, QuantChoice],
    budget: MemoryBudget | None,
    reserve_bytes: int,
    where: str = "",
    excluded: frozenset[str] = NEVER_AUTO,
) -> ChosenQuant:
    """The largest quant whose run size fits the budget after the reserve."""
    candidates = sorted((c for q, c in choices.items() if q not in excluded), key=lambda c: c.size)
    if not candidates:
        candidates = sorted(choices.values(), key=lambda c: c.size)
    if budget is None:
        chosen = choices.get(FALLBACK_QUANT) or candidates[0]
        return ChosenQuant(chosen, f"{name}: {chosen.quant} ({format_bytes(chosen.size)}), free memory unknown")
    room = budget.bytes - reserve_bytes
    reserve_note = f" after {format_bytes(reserve_bytes)} kept for the draft and cache" if reserve_bytes else ""
    fitting = [c for c in candidates if run_bytes(c.size) <= room]
    if not fitting:
        smallest = candidates[0]
        return ChosenQuant(
            smallest,
            f"{name}: {smallest.quant} ({format_bytes(smallest.size)}), the smallest {where}quant; none fits in "
            f"{format_bytes(budget.bytes)} of {budget.where}{reserve_note}, expect partial offload or swapping",
            fits=False,
        )
    chosen = fitting[-1]
    return ChosenQuant(
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
