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
import itertools
import time
from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np

from specrun.backend import Context, Model
from specrun.drafters import Draft, FeedCost, Translation, catch_up_seconds
from specrun.errors import IncompatibleError
from specrun.policy import Budget, DraftPolicy, Source
from specrun.sampling import Distribution, Sampler, filtered

SPECIAL = 256  # stream values from here on are the draft's special tokens (SPECIAL + id); below, text bytes
LOOKBEHIND = 4  # draft tokens re-encoded before the boundary, so merges across it come out as the draft's own
WORDS_KEPT = 65536  # words whose target tokens a bridge remembers (then it starts afresh)
MIN_SHARED = 0.1  # refused below this share of the smaller vocabulary's text tokens shared with the other
Mode = Literal["text", "tokens"]
TRANSLATIONS: tuple[Mode, ...] = ("text", "tokens")


@dataclass(frozen=True)
class Overlap:
    """How much two vocabularies share: text tokens with a same-bytes token on the other side."""

    draft_tokens: int  # the draft's text tokens (control tokens left out)
    target_tokens: int
    shared: int  # distinct byte strings both have

    @property
    def draft_share(self) -> float:
        return self.shared / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def target_share(self) -> float:
        return self.shared / self.target_tokens if self.target_tokens else 0.0

    @property
    def usable(self) -> bool:
        smaller = min(self.draft_tokens, self.target_tokens)
        return bool(smaller) and self.shared / smaller >= MIN_SHARED


class VocabBridge:
    """Which tokens of a target's and a draft's vocabularies stand for the same bytes."""

    def __init__(self, target: Model, draft: Model):
        self.target, self.draft = target, draft
        self.target_pieces, self.draft_pieces = target.pieces(), draft.pieces()
        first_target = {}  # bytes -> the target id the target writes them with: the lowest, bytes fallbacks last
        byte_tokens = target.byte_tokens
        for token, piece in enumerate(self.target_pieces):
            if piece and (piece not in first_target or first_target[piece] in byte_tokens):
                first_target[piece] = token
        self.target_end = target.eot if target.eot >= 0 else target.eos  # what a draft's end of turn becomes
        self.draft_end = draft.eot if draft.eot >= 0 else draft.eos
        self.draft_bos = draft.bos if draft.add_bos and draft.bos >= 0 else None
        self.draft_specials = self._specials(draft, self.draft_pieces)
        target_specials = self._specials(target, self.target_pieces)
        # Token-level intersection: each draft token's target token, -1 where none: the one with the
        # same vocabulary entry if there is one (two byte fallbacks <0x64>), else one with its bytes.
        entries = {text: token for token, text in enumerate(target.vocab_facts().tokens)}
        to_target = []
        for text, piece in zip(draft.vocab_facts().tokens, self.draft_pieces):
            same = entries.get(text)
            to_target.append(same if piece and same is not None and self.target_pieces[same] == piece
                             else first_target.get(piece, -1) if piece else -1)
        self.to_target = np.array(to_target, dtype=np.int64)
        for text, token in self.draft_specials.items():
            self.to_target[token] = target_specials.get(text, -1)
        for token in draft.eog_ids:
            self.to_target[token] = self.target_end
        self.unmapped = self.to_target < 0
        self.draft_bytes = {piece[0]: token for token, piece in enumerate(self.draft_pieces) if len(piece) == 1}
        drafts = {piece for piece in self.draft_pieces if piece}
        self.overlap = Overlap(len(drafts), len(first_target), len(drafts & first_target.keys()))
        self._units: dict[int, tuple[int, ...]] = {}
        self._target_words: dict[bytes, list[int] | None] = {}
        self._draft_words: dict[bytes, list[int] | None] = {}

    @staticmethod
    def _specials(model: Model, pieces: list[bytes]) -> dict[bytes, int]:
        """Control tokens by their spelled-out text (`<|im_start|>`)."""
        found: dict[bytes, int] = {}
        for token, piece in enumerate(pieces):
            if not piece:
                text = model.token_bytes(token, special=True)
                if text:
                    found.setdefault(text, token)
        return found

    def check(self, target_name: str, draft_name: str) -> None:
        """Refuse a pair whose vocabularies share almost nothing: its drafts could not be right."""
        o = self.overlap
        if not o.usable:
            raise IncompatibleError(
                f"draft {draft_name} shares almost no tokens with target {target_name} ({o.shared} of its "
                f"{o.draft_tokens} have a same-bytes target token, {100 * o.draft_share:.1f}%): its text could "
                f"not be what the target writes; pick a draft for the same language and script"
            )

    def units(self, target_token: int) -> tuple[int, ...]:
        """What one target token adds to the stream the draft reads."""
        units = self._units.get(target_token)
        if units is None:
            units = self._units[target_token] = self._target_units(target_token)
        return units

    def _target_units(self, token: int) -> tuple[int, ...]:
        piece = self.target_pieces[token]
        if piece:
            return tuple(piece)
        if token == self.target.bos:
            return ()  # the draft's own start token opens its stream
        if token in self.target.eog_ids:
            return (SPECIAL + self.draft_end,)
        text = self.target.token_bytes(token, special=True)
        same = self.draft_specials.get(text)
        return (SPECIAL + same,) if same is not None else tuple(text)  # a marker the draft lacks: read as text

    def spell(self, text: bytes) -> list[int]:
        """The draft's tokens for `text`, as its tokenizer writes them, and exactly its bytes: a
        stretch the tokenizer would change (bytes that are not UTF-8, a space it adds in front)
        is spelled byte by byte, and the spelling stops before a byte the draft has no token for."""
        tokens: list[int] = []
        for valid, run in _utf8_runs(text):
            encoded = _by_words(self.draft, self.draft_pieces, self._draft_words, run) if valid else None
            if encoded is None:
                encoded = [self.draft_bytes[b] for b in itertools.takewhile(self.draft_bytes.__contains__, run)]
                if len(encoded) < len(run):
                    return tokens + encoded
            tokens += encoded
        return tokens

    def target_tokens(self, text: bytes) -> list[int] | None:
        """`text` in the target's tokens, as the target's tokenizer writes it (`_by_words`)."""
        return _by_words(self.target, self.target_pieces, self._target_words, text)

    def translatable(self, draft_token: int, as_text: bool) -> bool:
        """Whether a drafted token can reach the target: as text any text token can; as a token,
        one with a target counterpart; a control token only through its counterpart."""
        return self.to_target[draft_token] >= 0 or (as_text and bool(self.draft_pieces[draft_token]))

    def draft_units(self, draft_token: int) -> tuple[int, ...]:
        piece = self.draft_pieces[draft_token]
        return tuple(piece) if piece else (SPECIAL + draft_token,)


class TextStream:
    """The history as the draft reads it (text bytes and special slots), grown and cut as the
    history is, with where each target token of it ends."""

    def __init__(self, bridge: VocabBridge):
        self.bridge = bridge
        self.start = [SPECIAL + bridge.draft_bos] if bridge.draft_bos is not None else []
        self.values: list[int] = list(self.start)
        self.target: list[int] = []  # the target tokens it was made from
        self.ends: list[int] = []  # stream length after each of them

    def follow(self, history: Sequence[int]) -> int:
        """Make the stream `history`'s; return how long the part it kept is."""
        keep = _common_prefix(self.target, history)
        del self.target[keep:], self.ends[keep:]
        kept = self.ends[-1] if self.ends else len(self.start)
        del self.values[kept:]
        for token in history[keep:]:
            self.values += self.bridge.units(token)
            self.target.append(token)
            self.ends.append(len(self.values))
        return kept


@dataclass
class Guess:
    """The draft's own tokens of one step, with what the drafter knows of each."""

    draft: list[int]
    dists: list[Distribution]  # q of each, when sampled
    confidences: list[float]


class TranslatingDraft:
    """A draft model with its own vocabulary, kept in step with the target's history through text."""

    name = "translated"

    def __init__(self, context: Context, bridge: VocabBridge, sample: bool = True, mode: Mode = "text"):
        """`sample`: at temperature > 0, sample the drafts (tokens mode verifies them by the p/q rule)."""
        self.context, self.bridge, self.sample, self.mode = context, bridge, sample, mode
        self.stream = TextStream(bridge)
        self.ends: list[int] = []  # stream offset after each token in the draft's cache (parallel to context.tokens)
        self.base = 0  # stream offset the cache's text starts at, after the draft's start token (0: all of it)
        self.feed = FeedCost()
        self._checked = 0  # cached tokens known to match the stream
        self._confirmed_guess = 0  # tokens of the drafter's own guesses the stream confirmed, since the last report
        self._scratch = np.empty(context.model.n_vocab, dtype=bool)
        self._softmax = np.empty(context.model.n_vocab, dtype=np.float32)

    @property
    def model(self) -> "TranslatingDraft":
        return self

    @property
    def source(self) -> Source:
        return "translated" if self.mode == "text" else "translated-tokens"

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
        same = _common_prefix(cached, tokens)
        self._keep(back + same)
        return tokens[same:], ends[same:]

    def _fits_whole(self, window: int | None) -> bool:
        """Whether a cache that holds a window should be fed all of the text now: the policy
        does not bound catching up (None), or all of it fits the window."""
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
            spelled = self.bridge.spell(_whole_characters(bytes(values[at:stop])))
            for token in spelled:
                at += len(self.bridge.draft_pieces[token])
                tokens.append(token)
                ends.append(at)
            if at < stop:
                break  # an incomplete character at the end of the text, or a byte the draft cannot spell
        return tokens, ends

    def _decode(self, tokens: list[int], ends: list[int], from_stream: bool) -> np.ndarray:
        """Decode `tokens` onto the cache; without any, the cache's last token again, for its logits.
        `from_stream`: they are the stream's (else a guess, checked against the stream next step)."""
        if not tokens:
            tokens, ends = [self.context.tokens[-1]], [self.ends[-1]]
            self._keep(len(self.ends) - 1)
        logits = self.feed.eval(self.context, tokens)
        self.ends += ends
        if from_stream:
            self._checked = len(self.ends)
        return logits

    # --- drafting ----------------------------------------------------------------------
    def propose(self, history: Sequence[int], limit: int, policy: DraftPolicy, sampler: Sampler) -> Draft:
        budget = policy.cap(self.source, min(limit, self.context.free_slots - 2))
        if budget.k < 1:
            return Draft(self.source)
        started = time.perf_counter()
        self._follow(history)
        new, new_ends = self._catch_up()
        window = self.feed.window if policy.bounds_catch_up else None
        if self._fits_whole(window):
            new, new_ends = self._restart(len(self.stream.target))  # all of it, from the start
        elif window is not None and len(new) > window:
            new, new_ends = self._restart(window)
        kept, self._confirmed_guess = self._confirmed_guess, 0
        translating = time.perf_counter() - started
        pending = self.stream.values[new_ends[-1] if new_ends else self.ends[-1] if self.ends else 0:]
        if (not new and not self.ends) or any(v >= SPECIAL for v in pending) or \
                len(new) + budget.k + 1 > self.context.free_slots:
            return Draft(self.source)  # nothing to draft from yet, or no room left in the draft's cache
        started = time.perf_counter()
        logits = self._decode(new, new_ends, from_stream=True)
        if window is not None and self._fits_whole(self.feed.window):
            new, new_ends = self._restart(len(self.stream.target))  # that feed timed feeding cheap enough for all of it
            logits = self._decode(new, new_ends, from_stream=True)
        catch_up_s = catch_up_seconds(len(new), budget.k, time.perf_counter() - started)
        guess = self._guess(logits, budget, policy, sampler)
        started = time.perf_counter()
        tokens, dists, confidences = self._for_target(guess, bytes(pending))
        translating += time.perf_counter() - started
        fed = Translation(translating, reencoded=len(new), kept=kept)
        return Draft(self.source, tokens[:limit], dists, confidences, fed, catch_up_s)

    def _guess(self, logits: np.ndarray, budget: Budget, policy: DraftPolicy, sampler: Sampler) -> Guess:
        """Up to budget.k draft tokens from the cache's end, each decoded onto it but the last."""
        sample = self.sample and not sampler.settings.greedy
        text = self.mode == "text"
        guess = Guess([], [], [])
        for i in range(budget.k):
            row = logits[-1]
            if not text:
                np.putmask(row, self.bridge.unmapped, -np.inf)  # only tokens the target has
            token, q, confidence = self._pick(row, sampler, sample, policy.wants_confidence)
            kept = policy.keep(budget, confidence) if self.bridge.translatable(token, text) else None
            if kept is None:
                break
            budget = kept
            guess.draft.append(token)
            guess.confidences.append(confidence)
            if q is not None:
                guess.dists.append(q)
            if token in self.bridge.draft.eog_ids or i == budget.k - 1:
                break
            logits = self._decode([token], [self.ends[-1] + len(self.bridge.draft_units(token))], from_stream=False)
        return guess

    def _pick(self, row: np.ndarray, sampler: Sampler, sample: bool, wants_confidence: bool) -> tuple[int, Distribution | None, float]:
        """The next draft token, the distribution it was sampled from (None: argmax), its probability."""
        if sample:
            q = filtered(row, sampler.settings, self._scratch)
            token = q.sample(sampler.rng)
            return token, q, q.prob(token)
        token = int(np.argmax(row))
        if not wants_confidence:
            return token, None, 1.0
        np.subtract(row, row[token], out=self._softmax)
        np.exp(self._softmax, out=self._softmax)
        return token, None, float(1.0 / self._softmax.sum())

    def _for_target(self, guess: Guess, pending: bytes) -> tuple[list[int], list[Distribution] | None, list[float] | None]:
        """The guess as target tokens, with q over target ids (tokens mode, sampled) and confidences."""
        if self.mode == "text":
            return self._text_for_target(guess, pending), None, None
        if pending:
            return [], None, None  # the draft's tokens would repeat bytes the target already wrote
        tokens = [int(self.bridge.to_target[token]) for token in guess.draft]
        dists = [Distribution(self.bridge.to_target[q.ids], q.probs) for q in guess.dists] if guess.dists else None
        return tokens, dists, guess.confidences or None

    def _text_for_target(self, guess: Guess, pending: bytes) -> list[int]:
        """The drafted text's whole characters tokenized by the target, all of them, as llama.cpp
        did: its last token may be the start of a longer one the target writes, but verifying it
        costs a row, and where it is the target's own it saves a step; telling the two apart
        would cost a draft decode a step for the token after it."""
        pieces = self.bridge.draft_pieces
        ended = bool(guess.draft) and guess.draft[-1] in self.bridge.draft.eog_ids
        text = b"".join(pieces[token] for token in (guess.draft[:-1] if ended else guess.draft))
        if not text.startswith(pending):
            return []  # the draft did not finish the character the target began
        drafted = text[len(pending):]
        seen = _whole_characters(drafted)
        tokens = (self.bridge.target_tokens(seen) or []) if seen else []
        return tokens + [self.bridge.target_end] if ended and seen == drafted else tokens


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    limit = min(len(a), len(b))
    if list(a[:limit]) == list(b[:limit]):  # the usual case, compared in C
        return limit
    return next(i for i in range(limit) if a[i] != b[i])


def exact_tokens(model: Model, pieces: list[bytes], text: bytes) -> list[int] | None:
    """`text` as `model`'s tokenizer writes it, with exactly its bytes; None when it cannot.

    A SentencePiece tokenizer that puts a space in front of any text it is given (its dummy
    prefix) is given a newline first to take the space, and the tokens of the newline dropped.
    """
    tokens = model.tokenize(text, add_special=False, parse_special=False)
    if b"".join(pieces[t] for t in tokens) == text:
        return tokens
    led = model.tokenize(b"\n" + text, add_special=False, parse_special=False)
    spelled = b""
    for i, token in enumerate(led):
        spelled += pieces[token]
        if spelled.endswith(b"\n") and b"".join(pieces[t] for t in led[i + 1 :]) == text:
            return led[i + 1 :]
    return None


def _by_words(model: Model, pieces: list[bytes], known: dict[bytes, list[int] | None], text: bytes) -> list[int] | None:
    """`text` in `model`'s tokens, word by word: each space after a word starts a new piece, and
    each piece is tokenized once and remembered in `known`. Where the model has no token across
    such a space (Gemma 3 has one in 262k, BPE pre-tokenizers none), this is the tokenization of
    the whole; a lookup spares the tokenizer, whose tables a decode has just pushed out of the
    CPU's caches."""
    tokens: list[int] = []
    for word in _words(text):
        if word not in known:
            if len(known) >= WORDS_KEPT:
                known.clear()
            known[word] = exact_tokens(model, pieces, word)
        if known[word] is None:
            return None
        tokens += known[word]
    return tokens


def _words(text: bytes) -> list[bytes]:
    """`text` cut before each space that follows something else (a run of spaces stays whole)."""
    cuts = [i for i in range(1, len(text)) if text[i] == 32 and text[i - 1] not in b" \t\n"]
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


def _utf8_runs(data: bytes) -> list[tuple[bool, bytes]]:
    """`data` cut into stretches of valid UTF-8 (True) and of bytes that are not (False)."""
    runs: list[tuple[bool, bytes]] = []
    while data:
        try:
            data.decode("utf-8")
            runs.append((True, data))
            break
        except UnicodeDecodeError as error:
            if error.start:
                runs.append((True, data[: error.start]))
            runs.append((False, data[error.start : error.end]))
            data = data[error.end :]
    return runs


def _whole_characters(data: bytes) -> bytes:
    """`data` without an incomplete UTF-8 character at its end."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return data  # ASCII: nothing incomplete after it
        if byte >= 0xC0:  # the lead byte of the last character: is its sequence whole?
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return data if back >= need else data[:-back]
    return data
