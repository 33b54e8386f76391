"""Drafting with a second, smaller GGUF on a KV cache of its own: `--draft PATH`, the "draft" source.

Where its vocabulary is the target's (llama.cpp's rule), `DraftModel` drafts target tokens;
where it is not, `TranslatingDraft` (translated.py) joins the two through text.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from specrun.backend import Context, ModelOptions
from specrun.backend.compat import check_vocab
from specrun.core.drafting import Draft, DraftRequest, DraftSource, NeedsDecodes, Proposal
from specrun.drafts.drafting_loop import FeedCost, Picker, catch_up_seconds, guessed
from specrun.drafts.registry import SourceSite, register
from specrun.drafts.translated import TranslatingDraft
from specrun.drafts.vocab_bridge import VocabBridge
from specrun.errors import SpecrunError
from specrun.sequences import History


class DraftModel:
    """A second, smaller GGUF run on its own KV cache, greedily or by sampling.

    The cache holds the history, or, where catching up is windowed and feeding all the cache
    lacks would cost more than `FeedCost.window` allows, the history's first token (the start
    token, which attention leans on) and its last `window` tokens.
    """

    names: tuple[str, ...] = ("draft",)
    counters: tuple[str, ...] = ()
    parts: tuple[DraftSource, ...] = ()
    runs_model = True

    def __init__(self, context: Context, sample: bool = True):
        """`sample`: at temperature > 0, sample the drafts (verified by the p/q rule); else greedy."""
        self.context = context
        self.sample = sample
        self.feed = FeedCost()
        self.picker = Picker(context.model.n_vocab)
        self.start = 0  # where in the history the cache's window begins, after its first token (0: all of it)
        self._window: tuple[History, int, History] | None = None  # (history, start, what `_windowed` made of it)

    def propose(self, history: Sequence[int], request: DraftRequest) -> Proposal:
        budget = request.offer(self.names[0], min(request.limit, self.context.free_slots - 1))
        if budget.k < 1:
            return Draft.under(budget)
        started = time.perf_counter()
        fed, logits = yield from self._catch_up(history, self.feed.window_for(request.catch_up))
        if self.start and self.feed.covers(len(history) - 1):
            fed, logits = yield from self._catch_up(history, None)  # that feed timed feeding cheap enough for all of it
        catch_up_s = catch_up_seconds(fed, budget.k, time.perf_counter() - started)
        self.context.checkpoint()  # a recurrent draft rolls its 1-token decodes back to here
        sample = self.sample and not request.sampler.settings.greedy
        guess = yield from guessed(logits[-1], budget, request, self.picker, sample, self._next_row, text=history)
        return guess.draft(budget, sample, request.policy.wants_confidence, catch_up_s)

    def _next_row(self, token: int) -> NeedsDecodes[np.ndarray]:
        return (yield from self.feed.eval(self.context, [token]))[-1]

    def _catch_up(self, history: Sequence[int], window: int | None) -> NeedsDecodes[tuple[int, np.ndarray]]:
        """Feed the cache what it lacks of its view of `history` (its cached prefix reused; after
        a fully accepted draft, just that); how many tokens that was, and the last one's logits."""
        view = self._view(history, window)
        if len(self.context.tokens) == len(view):
            self.context.truncate(len(view) - 1)  # we need the last position's logits again
        missing = view[len(self.context.tokens) :]
        return len(missing), (yield from self.feed.eval(self.context, missing))

    def _view(self, history: Sequence[int], window: int | None) -> Sequence[int]:
        """What the cache should hold of `history`, its longest cached prefix kept: all of it, or
        where catching up is windowed and it lacks more than the window, its first and last tokens."""
        window = len(history) if window is None else window
        if self.start >= len(history) - 1 or len(history) <= window + 1:
            self.start = 0  # rolled back into the window's gap, or all of it fits the window now
        view = self._windowed(history)
        if len(view) - self.context.reuse_prefix(view) > window:
            self.start = len(history) - window
            view = self._windowed(history)
            self.context.reuse_prefix(view)
        return view

    def _windowed(self, history: Sequence[int]) -> Sequence[int]:
        """The history without the window's gap (its first token, then from `start` on). While a
        generation's History grows it is the same History, extended by what was added, so that
        the cache compares only that (`Context.reuse_prefix`)."""
        if not self.start:
            return history
        of, start, view = self._window or (None, 0, History())
        if of is history and start == self.start:
            view.extend(history[start + len(view) - 1 :])
        else:
            view = History([*history[:1], *history[self.start :]])
            self._window = (history, self.start, view) if isinstance(history, History) else None
        return view

    def rollback(self, history: Sequence[int]) -> None:
        self.context.reuse_prefix(self._windowed(history) if self.start < len(history) - 1 else history)


def _load(site: SourceSite) -> tuple[Context, VocabBridge | None]:
    """The draft model's cache, one sequence a stream, and the bridge to the target's vocabulary
    where the two differ. The same text often takes a draft of another vocabulary more tokens
    than the target: its cache has twice the room."""
    c = site.config
    if c.draft is None:
        raise SpecrunError("the draft source needs a draft model: pass --draft PATH (specrun.load(target, draft))")
    placement = ModelOptions(n_gpu_layers=c.draft_n_gpu_layers, rpc_servers=c.draft_rpc)
    draft = site.resources.load_model(c.draft, "draft", placement)
    target = site.target.model
    if check_vocab(target.vocab_facts(), draft.vocab_facts()).ok:
        return site.resources.open_context(draft), None
    bridge = VocabBridge(target, draft)
    bridge.check(c.target.name, c.draft.name)
    return site.resources.open_context(draft, 2 * c.n_ctx), bridge


def _build(site: SourceSite) -> DraftModel | TranslatingDraft:
    context, bridge = site.resources.once("draft", lambda: _load(site))
    c = site.config
    if bridge is None:
        return DraftModel(context.sequence(site.slot), sample=c.draft_sampling)
    return TranslatingDraft(context.sequence(site.slot), bridge, c.draft_sampling, c.translation)


register("draft", _build)
