"""Drafting with a model of another vocabulary: any small GGUF drafts for any target.

Both sides are joined through text. `VocabBridge` knows, once per pair, each token's bytes
and which tokens the two vocabularies share. `TextStream` holds the history as the draft
should read it: the target's text bytes, with each special token the draft has an
equivalent for (start, end of turn) as one slot of its own.

`TranslatingDraft` keeps the draft's KV cache holding that stream in the draft's own
tokenization, converting only what was accepted since the last step: the draft tokens of
its last guess that the accepted text confirms stay in the cache as they are; the rest is
re-encoded from a few tokens before the boundary (so a merge across it comes out as the
draft's own), and the cache rolls back to where the two encodings agree. Never the whole
history per step (llama.cpp's removed code re-tokenized all of it every step). Where a policy
bounds catching up and the cache lacks more than `FeedCost.window` tokens (a new prompt), it
starts over from the draft's start token and the stream's last `window` target tokens.

Its guesses reach the target one of two ways (`mode`):
- "text": the drafted text is tokenized with the target, so the target verifies its own
  canonical tokens (one Gemma token where SmolLM2 drafted two); a deterministic proposal,
  verified by argmax when greedy and by sample-and-match above 0;
- "tokens": token-level intersection (arXiv 2502.05202): the draft's distribution restricted
  to its tokens that have a same-bytes target token, renormalised, so at temperature > 0
  the p/q rule stays exact with that q.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass
from typing import Literal, Mapping, Sequence

import numpy as np

from specrun.backend import Context
from specrun.core.drafting import Draft, DraftRequest, DraftSource, NeedsDecodes, Proposal
from specrun.core.policy import Budget
from specrun.core.sampling import Distribution
from specrun.drafts.drafting_loop import FeedCost, Guess, Picker, catch_up_seconds, guessed
from specrun.drafts.vocab_bridge import SPECIAL, TextStream, VocabBridge
from specrun.drafts.word_tokens import whole_characters
from specrun.sequences import common_prefix

LOOKBEHIND = 4  # draft tokens re-encoded before the boundary, so merges across it come out as the draft's own
Mode = Literal["text", "tokens"]
TRANSLATIONS: tuple[Mode, ...] = ("text", "tokens")
# Its counters (Stats.counters): seconds keeping its text in step with the target's (re-encoding the
# accepted text, tokenizing the guess for the target; inside draft_s), and the draft tokens fed to
# its cache for the text accepted since the last step, re-encoded from a window of the text or its
# own guess that the text confirmed (already cached).
TRANSLATE_S, REENCODED, KEPT = "translate_s", "draft_tokens_reencoded", "draft_tokens_kept"


@dataclass(frozen=True)
class TranslationStats:
    """What a translated draft's counters say, for the front ends that show them."""

    seconds: float  # keeping the draft's text in step with the target's (inside draft_s)
    reencoded: int  # draft tokens fed to its cache re-encoded from a window of the accepted text
    kept: int  # its own guesses the accepted text confirmed

    @classmethod
    def of(cls, counters: Mapping[str, float]) -> TranslationStats | None:
        """From Stats.counters; None where no translated draft fed its cache."""
        reencoded, kept = int(counters.get(REENCODED, 0)), int(counters.get(KEPT, 0))
        return cls(counters.get(TRANSLATE_S, 0.0), reencoded, kept) if reencoded + kept else None

    @property
    def reencoded_share(self) -> float:
        """Of the draft tokens fed to its cache, the share re-encoded from the accepted text."""
        return self.reencoded / (self.reencoded + self.kept)


class TranslatingDraft:
    """A draft model with its own vocabulary, kept in step with the target's history through text."""

    counters: tuple[str, ...] = (TRANSLATE_S, REENCODED, KEPT)
    parts: tuple[DraftSource, ...] = ()
    runs_model = True

    def __init__(self, context: Context, bridge: VocabBridge, sample: bool = True, mode: Mode = "text"):
        """`sample`: at temperature > 0, sample the drafts (tokens mode verifies them by the p/q rule)."""
        self.context, self.bridge, self.sample, self.mode = context, bridge, sample, mode
        self.names = ("translated" if mode == "text" else "translated-tokens",)
        self.picker = Picker(context.model.n_vocab)
        self.stream = TextStream(bridge)
        self.ends: list[int] = []  # stream offset after each token in the draft's cache (parallel to context.tokens)
        self.base = 0  # stream offset the cache's text starts at, after the draft's start token (0: all of it)
        self.feed = FeedCost()
        self._checked = 0  # cached tokens known to match the stream
        self._confirmed_guess = 0  # tokens of the drafter's own guesses the stream confirmed, since the last report

    # --- keeping the cache in step ---------------------------------------------------
    def rollback(self, history: Sequence[int]) -> None:
        self._follow(history)
        self._keep(self._confirmed())

    def _follow(self, history: Sequence[int]) -> None:
        unchanged = self.stream.follow(history)
        self._checked = min(self._checked, bisect.bisect_right(self.ends, unchanged))

    def _confirmed(self) -> int:
        """How many cached draft tokens the stream has, in the same place (only those past the
        last check are compared: the guess of the last step)."""
        values = self.stream.values
        start = self.ends[self._checked - 1] if self._checked else self.base
        for i in range(self._checked, len(self.ends)):
            end = self.ends[i]
            if end > len(values) or tuple(values[start:end]) != self.bridge.draft_units(self.context.tokens[i]):
                break
            start = end
            self._checked = i + 1
            self._confirmed_guess += 1  # past the last check, every cached token is a guess
        return self._checked

    def _keep(self, n: int) -> None:
        self.context.truncate(n)
        del self.ends[n:]
        self._checked = min(self._checked, n)

    def _catch_up(self) -> tuple[list[int], list[int]]:
        """The draft tokens the cache lacks for the stream, with their ends: the stream re-encoded
        from LOOKBEHIND tokens back (never across a special slot), the cache keeping what both
        encodings agree on. So the draft reads the text as its own tokenizer writes it: target
        tokens taken one for one through same-bytes draft tokens split words where its tokenizer
        would not, which cost 8% of its accepted tokens per step (SmolLM2 drafting Gemma, k 8)."""
        confirmed = self._confirmed()
        if not confirmed:
            self.base = 0  # the text before the window changed: start over from the stream's start
        back = max(confirmed - LOOKBEHIND, 0)
        specials = [i + 1 for i in range(back, confirmed) if not self.bridge.draft_pieces[self.context.tokens[i]]]
        back = max([back, *specials])
        tokens, ends = self._encode(self.ends[back - 1] if back else self.base)
        cached = self.context.tokens[back:confirmed]
        same = common_prefix(cached, tokens)
        self._keep(back + same)
        return tokens[same:], ends[same:]

    def _fits_whole(self, window: int | None) -> bool:
        """Whether a cache that holds a window should be fed all of the text now: catching up is
        not windowed (None), or all of it fits the window."""
        return bool(self.base) and (window is None or len(self.stream.target) <= window)

    def _restart(self, window: int) -> tuple[list[int], list[int]]:
        """The cache emptied, and the tokens to feed it anew: the draft's start token and the
        stream from `window` target tokens back (all of it where it is no longer), not from
        inside a character."""
        stream, first = self.stream, max(len(self.stream.target) - window, 0)
        while 0 < first < len(stream.target) and 0x80 <= stream.values[stream.ends[first - 1]] < 0xC0:
            first += 1  # a UTF-8 continuation byte: the character began in the token before
        self.base = stream.ends[first - 1] if first else 0
        self._keep(0)
        tokens, ends = self._encode(self.base)
        if self.base and self.bridge.draft_bos is not None:
            return [self.bridge.draft_bos, *tokens], [self.base, *ends]  # its end: where the text goes on
        return tokens, ends

    def _encode(self, start: int) -> tuple[list[int], list[int]]:
        """The draft's tokens for the stream from `start` on, and each one's end offset; text that
        ends inside a character waits for the rest of it."""
        tokens: list[int] = []
        ends: list[int] = []
        values, at = self.stream.values, start
        while at < len(values):
            if values[at] >= SPECIAL:
                tokens.append(values[at] - SPECIAL)
                at += 1
                ends.append(at)
                continue
            stop = next((i for i in range(at, len(values)) if values[i] >= SPECIAL), len(values))
            spelled = self.bridge.spell(whole_characters(bytes(values[at:stop])))
            for token in spelled:
                at += len(self.bridge.draft_pieces[token])
                tokens.append(token)
                ends.append(at)
            if at < stop:
                break  # an incomplete character at the end of the text, or a byte the draft cannot spell
        return tokens, ends

    def _decode(self, tokens: list[int], ends: list[int], from_stream: bool) -> NeedsDecodes[np.ndarray]:
        """Decode `tokens` onto the cache; without any, the cache's last token again, for its logits.
        `from_stream`: they are the stream's (else a guess, checked against the stream next step)."""
        if not tokens:
            tokens, ends = [self.context.tokens[-1]], [self.ends[-1]]
            self._keep(len(self.ends) - 1)
        logits = yield from self.feed.eval(self.context, tokens)
        self.ends += ends
        if from_stream:
            self._checked = len(self.ends)
        return logits

    # --- drafting ----------------------------------------------------------------------
    def propose(self, history: Sequence[int], request: DraftRequest) -> Proposal:
        budget = request.offer(self.names[0], min(request.limit, self.context.free_slots - 2))
        if budget.k < 1:
            return Draft.under(budget)
        started = time.perf_counter()
        self._follow(history)
        new, new_ends = self._catch_up()
        window = self.feed.window_for(request.catch_up)
        if self._fits_whole(window):
            new, new_ends = self._restart(len(self.stream.target))  # all of it, from the start
        elif window is not None and len(new) > window:
            new, new_ends = self._restart(window)
        kept, self._confirmed_guess = self._confirmed_guess, 0
        translating = time.perf_counter() - started
        pending = self.stream.values[new_ends[-1] if new_ends else self.ends[-1] if self.ends else 0 :]
        if (not new and not self.ends) or any(v >= SPECIAL for v in pending) or len(new) + budget.k + 1 > self.context.free_slots:
            return Draft()  # nothing to draft from yet, or no room left in the draft's cache
        started = time.perf_counter()
        logits = yield from self._decode(new, new_ends, from_stream=True)
        if window is not None and self.base and self.feed.covers(len(self.stream.target)):
            new, new_ends = self._restart(len(self.stream.target))  # that feed timed feeding cheap enough for all of it
            logits = yield from self._decode(new, new_ends, from_stream=True)
        catch_up_s = catch_up_seconds(len(new), budget.k, time.perf_counter() - started)
        self.context.checkpoint()  # a recurrent draft rolls its 1-token decodes back to here
        guess = yield from self._guess(logits, budget, request)
        started = time.perf_counter()
        tokens, dists, confidences = self._for_target(guess, bytes(pending))
        translating += time.perf_counter() - started
        counters = {TRANSLATE_S: translating, REENCODED: len(new), KEPT: kept}
        return Draft(
            tokens[: request.limit], budget, dists=dists, confidences=confidences, counters=counters, catch_up_s=catch_up_s
        )

    def _guess(self, logits: np.ndarray, budget: Budget, request: DraftRequest) -> NeedsDecodes[Guess]:
        """Up to budget.k draft tokens from the cache's end, each decoded onto it but the last;
        it ends at the draft's end of generation or a token the target cannot take."""
        sample = self.sample and not request.sampler.settings.greedy
        text = self.mode == "text"
        return (
            yield from guessed(
                self._masked(logits[-1]),
                budget,
                request,
                self.picker,
                sample,
                self._next_row,
                allowed=lambda token: self.bridge.translatable(token, text),
                ends=lambda token: token in self.bridge.draft.eog_ids,
                text=self.context.tokens,  # its own view of the text
                targets_vocabulary=False,
            )
        )

    def _next_row(self, token: int) -> NeedsDecodes[np.ndarray]:
        end = self.ends[-1] + len(self.bridge.draft_units(token))
        return self._masked((yield from self._decode([token], [end], from_stream=False))[-1])

    def _masked(self, row: np.ndarray) -> np.ndarray:
        """In tokens mode, the row without the draft tokens the target has no same-bytes token for."""
        if self.mode != "text":
            np.putmask(row, self.bridge.unmapped, -np.inf)
        return row

    def _for_target(self, guess: Guess, pending: bytes) -> tuple[list[int], list[Distribution] | None, list[float] | None]:
        """The guess as target tokens, with q over target ids (tokens mode, sampled) and confidences."""
        if self.mode == "text":
            return self._text_for_target(guess, pending), None, None
        if pending:
            return [], None, None  # the draft's tokens would repeat bytes the target already wrote
        tokens = [int(self.bridge.to_target[token]) for token in guess.tokens]
        dists = [Distribution(self.bridge.to_target[q.ids], q.probs) for q in guess.dists] if guess.dists else None
        return tokens, dists, guess.confidences or None

    def _text_for_target(self, guess: Guess, pending: bytes) -> list[int]:
        """The drafted text's whole characters tokenized by the target, all of them, as llama.cpp
        did: its last token may be the start of a longer one the target writes, but verifying it
        costs a row, and where it is the target's own it saves a step; telling the two apart
        would cost a draft decode a step for the token after it."""
        pieces = self.bridge.draft_pieces
        ended = bool(guess.tokens) and guess.tokens[-1] in self.bridge.draft.eog_ids
        text = b"".join(pieces[token] for token in (guess.tokens[:-1] if ended else guess.tokens))
        if not text.startswith(pending):
            return []  # the draft did not finish the character the target began
        drafted = text[len(pending) :]
        seen = whole_characters(drafted)
        tokens = (self.bridge.target_tokens(seen) or []) if seen else []
        return tokens + [self.bridge.target_end] if ended and seen == drafted else tokens
