"""How a pair with two vocabularies would draft: what the vocabularies share, and how a sample
text's tokens line up. Read from the two tokenizers alone (llama.cpp loads a GGUF's vocabulary
without its weights in under a second), through the same bridge the translating draft uses."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specrun.backend import Model, ModelOptions
from specrun.drafts.vocab_bridge import Overlap, VocabBridge
from specrun.drafts.word_tokens import exact_tokens

SAMPLE = (
    "The history of the city begins with a small settlement on the river, where traders met to exchange "
    "grain, salt and cloth.\n\ndef mean(values):\n    return sum(values) / len(values)\n"
)


@dataclass(frozen=True)
class TranslatedPair:
    overlap: Overlap
    target_tokens: int  # SAMPLE in the target's tokens
    draft_tokens: int  # ... and in the draft's
    shared_boundaries: int  # byte offsets where a token ends in both (the end of the text included)

    @property
    def draft_per_target(self) -> float:
        """Draft tokens drafted per target token proposed: what a translated draft token costs more."""
        return self.draft_tokens / self.target_tokens if self.target_tokens else 1.0

    def as_json(self) -> dict:
        o = self.overlap
        return {
            "draft_share": o.draft_share,
            "target_share": o.target_share,
            "shared_tokens": o.shared,
            "usable": o.usable,
            "sample_target_tokens": self.target_tokens,
            "sample_draft_tokens": self.draft_tokens,
            "sample_shared_boundaries": self.shared_boundaries,
            "draft_tokens_per_target_token": self.draft_per_target,
        }


def translated_pair(target_path: Path, draft_path: Path) -> TranslatedPair:
    """The report for two GGUFs on disk."""
    options = ModelOptions(vocab_only=True)
    target, draft = Model(target_path, options, "target"), Model(draft_path, options, "draft")
    try:
        bridge = VocabBridge(target, draft)
        if not bridge.overlap.usable:  # no sample: a vocabulary this foreign may lack the bytes to spell it
            return TranslatedPair(bridge.overlap, 0, 0, 0)
        text = SAMPLE.encode()
        on_target = exact_tokens(target, bridge.target_pieces, text) or []
        on_draft = bridge.spell(text)
    finally:
        draft.close()
        target.close()
    ends = [_ends(tokens, pieces) for tokens, pieces in ((on_target, bridge.target_pieces), (on_draft, bridge.draft_pieces))]
    return TranslatedPair(bridge.overlap, len(on_target), len(on_draft), len(set(ends[0]) & set(ends[1])))


def _ends(tokens: list[int], pieces: list[bytes]) -> list[int]:
    ends, at = [], 0
    for token in tokens:
        at += len(pieces[token])
        ends.append(at)
    return ends
