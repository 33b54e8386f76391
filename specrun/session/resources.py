"""What a session loads (models, caches, the thread pool), freed in reverse order when it closes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence, TypeVar

from specrun.backend import Context, ContextOptions, Model, ModelOptions, ThreadPool
from specrun.config import SessionConfig
from specrun.settings import BATCH

Made = TypeVar("Made")


class Closable(Protocol):
    def close(self) -> None: ...


class Resources:
    """Models and caches a session loads, freed in reverse order when it closes; and what a kind of
    source shares between the session's streams (a draft model's cache), made once."""

    def __init__(self, config: SessionConfig, model_checks: Sequence[Callable[[Model], None]] = ()):
        """`model_checks`: run on every model loaded, each raising to refuse it (the draft kinds'
        `registry.model_checks()`: an MTP drafter cannot run as a model of its own)."""
        self.config = config
        self._model_checks = tuple(model_checks)
        self._owned: list[Closable] = []
        self._made: dict[str, Any] = {}
        self.threads = ThreadPool(config.threads)  # every context's: a session decodes on one thread, in turn

    def load_model(self, path: Path, role: str, options: ModelOptions) -> Model:
        """`path` loaded with the session's placement settings and `options`' own, refused by any
        of the model checks."""
        c = self.config
        options = replace(options, repack=c.repack, rpc_timeout=c.rpc_timeout)
        model = self.own(Model(path, options, role))
        for check in self._model_checks:
            check(model)
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
