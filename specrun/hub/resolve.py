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
from specrun.hub.choice import ModelRequest, choose_file, fit_quant
from specrun.hub.embedded import DEFAULT_ALIAS
from specrun.hub.memory import format_bytes, run_bytes
from specrun.hub.profiles import ModelProfile, load_profiles
from specrun.hub.quants import (
    NEVER_AUTO,
    NEVER_AUTO_FOR_DRAFT,
    QuantChoice,
    RepoFile,
    quant_of,
)
from specrun.hub.spec import checked_quant, local_model_path, ollama_name, parse_spec
from specrun.hub.stores import StoredModel

if TYPE_CHECKING:  # annotations only: importing it at run time is _hub()'s cost
    from specrun.hub.download import RepoListing

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
    location = locate_model(
        spec,
        quant=quant,
        offline=offline,
        memory_budget_bytes=memory_budget_bytes,
        reserve_bytes=reserve_bytes,
        for_draft=for_draft,
        rpc=rpc,
    )
    files = location.files or downloaded(location, show_progress)
    return ResolvedModel(
        files[0],
        location.repo,
        location.quant,
        location.reason,
        alias=location.alias,
        files=files,
        size_bytes=location.size_bytes,
        profile=location.profile,
        store=location.store,
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
        parsed,
        profiles.get(parsed.alias) if parsed.alias else None,
        wanted or parsed.quant,
        memory_budget_bytes,
        reserve_bytes,
        NEVER_AUTO_FOR_DRAFT if for_draft else NEVER_AUTO,
        rpc,
    )
    return (
        embedded_location(request)
        or stored_location(request, profiles, include_hf=disk_first)
        or hub_location(request, spec, offline)
    )


def _hub() -> ModuleType:
    """specrun.hub.download: with huggingface_hub it is slow to import (docs/benchmarks.md, "Small
    costs behind the code"), so only specs that reach the hub pay for it."""
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
        model.repo,
        model.quant,
        f"ollama:{model.name}: {model.quant or 'GGUF'} ({format_bytes(model.size)}) from {model.where}: {model.path}",
        alias=model.alias,
        files=model.parts,
        size_bytes=model.size,
        profile=profiles.get(model.alias or ""),
        store=model.source,
    )


def embedded_location(request: ModelRequest) -> ModelLocation | None:
    """gemma-3-270m comes from the installed PyPI package, without the network."""
    if request.parsed.alias != DEFAULT_ALIAS or request.quant not in (None, EMBEDDED_QUANT):
        return None
    if not embedded.embedded_installed():
        return None
    path = embedded.embedded_model_path()
    return ModelLocation(
        None,
        EMBEDDED_QUANT,
        f"{DEFAULT_ALIAS}: {EMBEDDED_QUANT} embedded with specrun (no download)",
        alias=DEFAULT_ALIAS,
        files=(path,),
        size_bytes=path.stat().st_size,
        profile=request.profile,
    )


def stored_location(request: ModelRequest, profiles: dict[str, ModelProfile], include_hf: bool = False) -> ModelLocation | None:
    """A file of this model that Ollama, LM Studio or llama.cpp (and, with include_hf, the
    Hugging Face cache) already keeps, or None.

    Asked for a quant or a file: that one, when a store has it. Asked for neither: the
    largest stored quant that fits in memory; when none fits, the hub decides as usual.
    """
    found = stores.matching(stores.stored_models(profiles, include_hf), request.repo, request.parsed.filename, request.pattern)
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
        request.repo,
        chosen.quant,
        f"{reason}; already on disk in {chosen.where}: {chosen.path}",
        alias=request.parsed.alias,
        files=chosen.parts,
        size_bytes=chosen.size,
        profile=request.profile,
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
        listing.repo,
        choice.quant_choice.quant,
        choice.reason,
        alias=request.parsed.alias,
        files=files,
        size_bytes=choice.quant_choice.size,
        profile=request.profile,
        store="hf" if listing.cached else None,
        listing=listing,
        hub_files=() if listing.cached else choice.quant_choice.parts,
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
            f"{spec}: {what} in the Hugging Face cache ({hub.hub_cache_dir()}) and {state}: connect and run `specrun pull {spec}`"
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
