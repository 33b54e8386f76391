"""Each stream's draft sources: the registered kinds the settings ask for, built once per stream
and chained in the order they are asked (copies first, a draft model last)."""

from __future__ import annotations

from specrun.backend import Context, ModelOptions
from specrun.config import SessionConfig
from specrun.core.drafting import DraftSource
from specrun.drafts import registry
from specrun.drafts.chain import chained, leaves
from specrun.drafts.registry import Loader, SourceSite
from specrun.drafts.store import NgramStore


def source_names(config: SessionConfig) -> list[str]:
    """The sources `config` asks for, in the order the chain asks them: copies first (this
    request's context, then what earlier ones wrote), then the sources named, a draft model last."""
    c = config
    named = [*(["lookup"] if c.lookup else []), *(["store"] if c.store_tokens else []), *c.sources]
    return list(dict.fromkeys([*named, *([registry.draft_file_kind(c.draft)] if c.draft is not None else [])]))


def target_options(config: SessionConfig) -> ModelOptions:
    """The target's placement, and what the sources asked for ask of its load (MTP layers)."""
    c = config
    options = ModelOptions(n_gpu_layers=c.n_gpu_layers, rpc_servers=c.rpc, tensor_split=c.tensor_split)
    for name in source_names(config):
        asks = registry.kind(name).target_options
        options = asks(options) if asks is not None else options
    return options


class Drafters:
    """The sources of every stream of `target`'s context; the store is shared."""

    def __init__(self, target: Context, config: SessionConfig, store: NgramStore | None, loader: Loader):
        self.target, self.config, self.store, self.loader = target, config, store, loader
        self.names = source_names(config)
        self._sources: dict[tuple[str, int], DraftSource] = {}
        self._chains: dict[int, DraftSource | None] = {}

    def chain(self, slot: int) -> DraftSource | None:
        """Stream `slot`'s chain of the sources the settings ask for, in `names`' order."""
        if slot not in self._chains:
            self._chains[slot] = chained([self.source(name, slot) for name in self.names])
        return self._chains[slot]

    def source(self, name: str, slot: int = 0) -> DraftSource:
        """Stream `slot`'s source of the registered kind `name` (`specrun.drafts.registry`), built
        on first use and kept: the one in the stream's chain, when the chain asks it."""
        if (name, slot) not in self._sources:
            site = SourceSite(slot, self.target.sequence(slot), self.config, self.store, self.loader)
            self._sources[name, slot] = registry.kind(name).build(site)
        return self._sources[name, slot]

    def follow(self, drafter: DraftSource | None, slot: int) -> None:
        """The stream's sources that follow the target's decodes (an MTP head) follow them while a
        generation drafts with them, and rest during others (plain decoding is then timed without them)."""
        asked = leaves(drafter) if drafter is not None else []
        for (name, at), source in self._sources.items():
            follow = registry.kind(name).follow
            if at == slot and follow is not None:
                follow(source, source in asked)
