"""Draft sources by name: the one list the library, the CLI (`--source`), bench and the server read,
and what a source's builder is given (`SourceSite`, loading through a `Loader`).

A source of one's own is its module with one `register` call, imported in drafts/__init__.py.
Its builder gets a `SourceSite` (the stream it drafts for and what the session shares), never
the session; what else its kind needs, it declares when it registers: an option of the target's
load (MTP layers), following the target's decodes, a check on every model a session loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol, TypeVar

from specrun.backend import Context, Model, ModelOptions
from specrun.errors import SpecrunError
from specrun.headers.arch import TRAINED_DRAFTERS, TrainedDrafter, drafter_misfit, trained_drafter
from specrun.headers.read import read_keys

if TYPE_CHECKING:
    from specrun.config import SessionConfig
    from specrun.core.drafting import DraftSource
    from specrun.drafts.store import NgramStore

Made = TypeVar("Made")


class Loader(Protocol):
    """What a builder loads through (the session's `Resources`): models and caches with the
    session's settings, freed when it closes, and what the streams share, made once."""

    def load_model(self, path: Path, role: str, options: ModelOptions) -> Model: ...

    def open_context(self, model: Model, n_ctx: int | None = None, rollback: int = 0) -> Context: ...

    def once(self, key: str, make: Callable[[], Made]) -> Made: ...


@dataclass(frozen=True)
class SourceSite:
    """What a source's builder may use: one stream of a session, and what the session shares."""

    slot: int  # the stream (0 .. parallel - 1)
    target: Context  # the stream's sequence of the target's cache; target.model is the target model
    config: SessionConfig  # the session's settings (the draft model's path, sampling, n-gram sizes, ...)
    store: NgramStore | None  # the session's store of earlier requests, when it keeps one
    resources: Loader  # loads models and caches, and what the streams share


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


def model_checks() -> list[Callable[[Model], None]]:
    """The checks registered kinds run on every model a session loads (each raises to refuse one)."""
    return [kind.check_model for kind in _KINDS.values() if kind.check_model is not None]


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
