"""The public Python API: load models by name, then generate, stream or chat.

`import specrun` exports these names (docs/python-api.md shows them at work); every
other module is internal and may change between releases.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Union

from specrun import backend
from specrun.backend import rpc
from specrun.chat.formats import Message, choose_format
from specrun.chat.reply import Piece, Reply
from specrun.chat.runner import ChatRunner
from specrun.config import SessionConfig
from specrun.core.events import Stats, StepEvent
from specrun.drafts import registry
from specrun.hub import resolve_pair
from specrun.session import Session

ModelRef = Union[str, Path]  # a GGUF path, alias[:QUANT], owner/repo[:QUANT], owner/repo/file.gguf or ollama:NAME[:TAG]


def load(
    target: ModelRef | None = None,
    draft: ModelRef | None = None,
    *,
    quant: str | None = None,
    draft_quant: str | None = None,
    offline: bool = False,
    on_resolve: Callable[[str], None] | None = None,
    **options: Any,
) -> Session:
    """Load a target (and a draft model) into a `Session`, as the CLI's --target and --draft do.

    `target` and `draft` are GGUF paths or model specs: `alias[:QUANT]` (see
    `specrun models --aliases`), `owner/repo[:QUANT]`, `owner/repo/file.gguf` or
    `ollama:NAME[:TAG]`. No target means the embedded Gemma 3 270M (the `demo` extra). A
    file Ollama, LM Studio or llama.cpp already keeps is used where it lies; otherwise
    it is downloaded into the Hugging Face cache, unless `offline`. Without a quant, the
    largest that fits in memory is chosen; `on_resolve` receives the line that says
    which file was chosen and why.

    `options` are `SessionConfig`'s other fields: `lookup=True` drafts by prompt lookup,
    `k` sets the draft length ("auto", "llama.cpp" or a number), `sampler` takes a
    `SamplerSettings`, `store_tokens` keeps n-grams of earlier generations to draft from,
    `sources` names further registered draft sources (`specrun.drafts.registry.names()`),
    and `n_ctx`, `threads`, `n_gpu_layers`, `rpc` and the rest set up llama.cpp.
    Raises `SpecrunError` (one line saying what to do) for a bad name, a failed
    download, a draft whose vocabulary does not match the target's, or a bad setting.
    """
    return Session(
        resolve(target, draft, quant=quant, draft_quant=draft_quant, offline=offline, on_resolve=on_resolve, **options)
    )


def resolve(
    target: ModelRef | None = None,
    draft: ModelRef | None = None,
    *,
    quant: str | None = None,
    draft_quant: str | None = None,
    offline: bool = False,
    on_resolve: Callable[[str], None] | None = None,
    **options: Any,
) -> SessionConfig:
    """The `SessionConfig` that `load` would load, with the arguments of `load`: the model
    files are found (and downloaded) but not loaded. `Session(config)` loads them."""
    SessionConfig.check_settings(options)  # before any download: a bad setting fails at once
    for name in ("rpc", "draft_rpc"):  # HOST:PORT strings, or one comma-separated string
        if name in options:
            value = options[name]
            options[name] = rpc.parse_endpoints((value if isinstance(value, str) else ",".join(value)) or None, name)
    servers = tuple(dict.fromkeys((*options.get("rpc", ()), *options.get("draft_rpc", ()))))
    if servers:  # before any download: a server that is down fails in a second
        backend.check_rpc(servers)
    kind = registry.named_by_draft(draft)
    if kind is not None:  # a source that drafts as a model (mtp: the target's own MTP layers), no second GGUF
        options["sources"] = (*options.get("sources", ()), kind)
        draft = None
    registry.check_names(options.get("sources", ()))
    target_model, draft_model = resolve_pair(
        None if target is None else str(target),
        None if draft is None else str(draft),
        quant=quant,
        draft_quant=draft_quant,
        offline=offline,
        report=on_resolve or (lambda line: None),
        rpc=options.get("rpc", ()),
    )
    return SessionConfig(target=target_model.path, draft=draft_model.path if draft_model else None, **options)


class Chat:
    """A conversation with the session's target: the model's chat template formats the
    turns, and each reply prefills only the new turn (the earlier ones stay in the cache).

    `chat_format` names one of llama-cpp-python's formats (e.g. "chatml") or "plain"
    (a User:/Assistant: transcript); by default the GGUF's own template is used, and a
    model without one gets the plain transcript. `max_tokens` bounds each reply and is
    kept free in the context: when a conversation outgrows the context, its oldest
    exchanges are left out.
    """

    def __init__(self, session: Session, system: str | None = None, *, chat_format: str | None = None, max_tokens: int = 512):
        self.session = session
        self._runner = ChatRunner(session, choose_format(session.target_model, chat_format), max_tokens, system)

    def send(self, message: str, on_text: Callable[[str, str], None] | None = None) -> Reply:
        """Reply to `message`; the reply becomes part of the conversation.

        `on_text(text, source)` receives the reply as it is written, piece by piece, with
        where its tokens came from ("draft", "target" or "bonus"); text that could begin
        one of the format's stop strings is held back until it is clear it does not.
        """
        turn = self._runner.prepare(message)
        return self._runner.reply(turn, _TextView(on_text), time.perf_counter())

    @property
    def messages(self) -> list[Message]:
        """The conversation so far as chat messages: the system message, then user and assistant turns."""
        return self._runner.conversation.messages()

    @property
    def totals(self) -> Stats:
        """Counters and timings summed over every reply so far (`reset` keeps them)."""
        return self._runner.totals

    def reset(self) -> None:
        """Start a new conversation on the same session (the system message stays)."""
        self._runner.reset()


class _TextView:
    """Hands a reply's final text pieces to a callback; steps are not reported."""

    def __init__(self, on_text: Callable[[str, str], None] | None):
        self.on_text = on_text

    def show(self, pieces: list[Piece]) -> None:
        if self.on_text is not None:
            for text, source in pieces:
                self.on_text(text, source)

    def step(self, event: StepEvent, stats: Stats) -> None:
        pass
