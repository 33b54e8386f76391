"""Two vocabularies joined through text: which tokens stand for the same bytes (`VocabBridge`),
and the history as a draft of another vocabulary reads it (`TextStream`)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from specrun.backend import Model
from specrun.drafts.word_tokens import by_words, utf8_runs
from specrun.errors import IncompatibleError
from specrun.sequences import History, common_prefix

SPECIAL = 256  # stream values from here on are the draft's special tokens (SPECIAL + id); below, text bytes
MIN_SHARED = 0.1  # refused below this share of the smaller vocabulary's text tokens shared with the other


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
        first_target: dict[
            bytes, int
        ] = {}  # bytes -> the target id the target writes them with: the lowest, bytes fallbacks last
        byte_tokens = target.byte_tokens
        for token, piece in enumerate(self.target_pieces):
            if piece and (piece not in first_target or first_target[piece] in byte_tokens):
                first_target[piece] = token
        self.target_end = target.turn_end  # what a draft's end of turn becomes
        self.draft_end = draft.turn_end
        self.draft_bos = draft.bos if draft.add_bos and draft.bos >= 0 else None
        self.draft_specials = self._specials(draft, self.draft_pieces)
        target_specials = self._specials(target, self.target_pieces)
        # Token-level intersection: each draft token's target token, -1 where none: the one with the
        # same vocabulary entry if there is one (two byte fallbacks <0x64>), else one with its bytes.
        entries = {text: token for token, text in enumerate(target.vocab_facts().tokens)}
        to_target = []
        for text, piece in zip(draft.vocab_facts().tokens, self.draft_pieces):
            same = entries.get(text)
            to_target.append(
                same
                if piece and same is not None and self.target_pieces[same] == piece
                else first_target.get(piece, -1)
                if piece
                else -1
            )
        self.to_target = np.array(to_target, dtype=np.int64)
        for spelled, token in self.draft_specials.items():
            self.to_target[token] = target_specials.get(spelled, -1)
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
        for valid, run in utf8_runs(text):
            encoded = by_words(self.draft, self.draft_pieces, self._draft_words, run) if valid else None
            if encoded is None:
                encoded = [self.draft_bytes[b] for b in itertools.takewhile(self.draft_bytes.__contains__, run)]
                if len(encoded) < len(run):
                    return tokens + encoded
            tokens += encoded
        return tokens

    def target_tokens(self, text: bytes) -> list[int] | None:
        """`text` in the target's tokens, as the target's tokenizer writes it (`by_words`)."""
        return by_words(self.target, self.target_pieces, self._target_words, text)

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
        self._follows: History | None = None  # the History it was last made, which still starts `target`

    def follow(self, history: Sequence[int]) -> int:
        """Make the stream `history`'s; return how long the part it kept is. Following the same
        History again, only what was added to it since is compared: the rest is unchanged."""
        keep = len(self.target) if history is self._follows else common_prefix(self.target, history)
        del self.target[keep:], self.ends[keep:]
        kept = self.ends[-1] if self.ends else len(self.start)
        del self.values[kept:]
        for token in history[keep:]:
            self.values += self.bridge.units(token)
            self.target.append(token)
            self.ends.append(len(self.values))
        self._follows = history if isinstance(history, History) else None
        return kept
