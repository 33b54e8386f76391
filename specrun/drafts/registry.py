"""Draft sources by name: the one list the library, the CLI (`--source`), bench and the server read.

A source of one's own is its module with one `register` call, imported in drafts/__init__.py.
Its builder gets a `SourceSite` (the stream it drafts for and what the session shares), never
the session; what else its kind needs, it declares when it registers: an option of the target's
load (MTP layers), following the target's decodes, a check on every model a session loads.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol, TypeVar

from specrun.backend import Context, ContextOptions, Model, ModelOptions, ThreadPool
from specrun.errors import SpecrunError
from specrun.headers.arch import TRAINED_DRAFTERS, TrainedDrafter, drafter_misfit, trained_drafter
from specrun.headers.read import read_keys
from specrun.settings import BATCH

if TYPE_CHECKING:
    from specrun.config import SessionConfig
    from specrun.drafts.base import DraftSource
    from specrun.drafts.store import NgramStore

Made = TypeVar("Made")


class Closable(Protocol):
    def close(self) -> None: ...


class Resources:
    """Models and caches a session loads, freed in reverse order when it closes; and what a kind of
    source shares between the session's streams (a draft model's cache), made once."""

    def __init__(self, config: SessionConfig):
        self.config = config
        self._owned: list[Closable] = []
        self._made: dict[str, Any] = {}
        self.threads = ThreadPool(config.threads)  # every context's: a session decodes on one thread, in turn

    def load_model(self, path: Path, role: str, options: ModelOptions) -> Model:
        """`path` loaded with the session's placement settings and `options`' own, refused by any
        kind's check of models (an MTP drafter cannot run as a model of its own)."""
        c = self.config
        options = replace(options, repack=c.repack, rpc_timeout=c.rpc_timeout)
        model = self.own(Model(path, options, role))
        for kind in _KINDS.values():
            if kind.check_model is not None:
                kind.check_model(model)
        return model

    def open_context(self, model: Model, n_ctx: int | None = None, rollback: int = 0) -> Context:
        """A cache of `model` with the session's settings, a sequence a stream (`n_ctx` tokens in all, default the session's)."""
        c = self.config
        options = ContextOptions(
            n_ctx=c.n_ctx if n_ctx is None else n_ctx,
            n_batch=BATCH,
            n_ubatch=c.n_ubatch,
            n_threads=c.threads,
            flash_attn=c.flash_attn,
            rollback=rollback,
            sequences=c.parallel,
        )
        return self.own(Context(model, options, self.threads))

    def once(self, key: str, make: Callable[[], Made]) -> Made:
        """What `make` makes, made on the first call with `key` only: shared by every stream."""
        if key not in self._made:
            self._made[key] = make()
        return self._made[key]

    def own(self, resource: Made) -> Made:
        """Free `resource` (anything with close()) when the session closes."""
        self._owned.append(resource)  # type: ignore[arg-type]
        return resource

    def close(self) -> None:
        for resource in reversed(self._owned):
            resource.close()
        self._owned.clear()
        self._made.clear()

    @property
    def closed(self) -> bool:
        return not self._owned


@dataclass(frozen=True)
class SourceSite:
    """What a source's builder may use: one stream of a session, and what the session shares."""

    slot: int  # the stream (0 .. parallel - 1)
    target: Context  # the stream's sequence of the target's cache; target.model is the target model
    config: SessionConfig  # the session's settings (the draft model's path, sampling, n-gram sizes, ...)
    store: NgramStore | None  # the session's store of earlier requests, when it keeps one
    resources: Resources  # loads models and caches, and what the streams share


Builder = Callable[[SourceSite], "DraftSource"]
"""Builds the source of one stream; a session builds one per stream and keeps it across generations."""


@dataclass(frozen=True)
class Kind:
    """A registered kind of source: how to build one, and what else it asks of a session."""

    build: Builder
    target_options: Callable[[ModelOptions], ModelOptions] | None = None  # what it asks of the target's load
    follow: Callable[[Any, bool], None] | None = None  # (source, on): follow the target's decodes while it drafts
    check_model: Callable[[Model], None] | None = None  # run on every model a session loads: raise to refuse it
    named_by_draft: bool = False  # `--draft NAME` (specrun.load(draft=NAME)) asks for it instead of a GGUF


_KINDS: dict[str, Kind] = {}


def register(
    name: str,
    build: Builder,
    *,
    target_options: Callable[[ModelOptions], ModelOptions] | None = None,
    follow: Callable[[Any, bool], None] | None = None,
    check_model: Callable[[Model], None] | None = None,
    named_by_draft: bool = False,
) -> None:
    """Make `name` a draft source sessions can be asked for: `specrun.load(..., sources=[name])`,
    `--source NAME`, `bench --methods NAME`."""
    _KINDS[name] = Kind(build, target_options, follow, check_model, named_by_draft)


def names() -> list[str]:
    return sorted(_KINDS)


def kind(name: str) -> Kind:
    """The kind registered as `name`, or one line naming the kinds there are."""
    found = _KINDS.get(name)
    if found is None:
        raise SpecrunError(f"unknown draft source {name!r}: choose one of {', '.join(names())}")
    return found


def check_names(sources: tuple[str, ...] | list[str]) -> None:
    """Fail with one line for a source no module registered, before anything loads."""
    for name in sources:
        kind(name)


def draft_file_kind(path: Path) -> str:
    """The source a `--draft` GGUF drafts as: "eagle3", "dflash" or "dspark" for those trained
    drafters (each a registered source), else "draft" (a model of its own, or a file the draft
    model's load reports on)."""
    try:
        keys = read_keys(path)
    except SpecrunError:
        return "draft"
    drafter = trained_drafter(keys.meta, keys.tensor_names)
    return drafter.kind if drafter else "draft"


def load_trained_drafter(site: SourceSite, kind: str) -> tuple[Model, TrainedDrafter]:
    """The `kind` drafter of `--draft`, loaded (once per session, through `Resources.once`), and what
    its header says; one line where it is no such drafter or cannot read this target, before any decode."""
    c, target, name = site.config, site.target.model, TRAINED_DRAFTERS[kind]
    a = "an" if name[0] in "AEIOU" else "a"
    if c.draft is None:
        raise SpecrunError(f"the {kind} source needs {a} {name} drafter: pass --draft FILE (specrun.load(target, draft))")
    keys = read_keys(c.draft)
    found = trained_drafter(keys.meta, keys.tensor_names)
    if found is None or found.kind != kind:
        raise SpecrunError(
            f"{c.draft.name} is not {a} {name} drafter ({found.name if found else keys.meta.get('general.architecture')})"
        )
    placement = ModelOptions(n_gpu_layers=c.draft_n_gpu_layers, rpc_servers=c.draft_rpc)
    drafter = site.resources.load_model(c.draft, "draft", placement)
    problem = drafter_misfit(found, drafter.n_vocab, target.n_layer, target.n_embd, target.n_vocab)
    if problem:
        raise SpecrunError(
            f"the {name} drafter {c.draft.name} does not fit the target {c.target.name}: {problem}; "
            "give the drafter trained for this target"
        )
    return drafter, found


def named_by_draft(draft: object) -> str | None:
    """The kind `--draft` names when its value is a registered name such as "mtp" (else None: a model)."""
    return draft if isinstance(draft, str) and draft in _KINDS and _KINDS[draft].named_by_draft else None
