"""llama.cpp's draft/target vocabulary rule, reporting every failed check with evidence.

The facts come from a loaded model (backend) or a GGUF header (no weights); the rule is
the same: same vocab type, same bos/eos ids and add-flags, sizes within 128, and
identical token text from id 5 up to the smaller vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

MAX_SIZE_DIFFERENCE = 128  # llama.cpp SPEC_VOCAB_MAX_SIZE_DIFFERENCE
FIRST_CHECKED_TOKEN = 5  # llama.cpp SPEC_VOCAB_CHECK_START_TOKEN_ID


@dataclass(frozen=True)
class VocabFacts:
    vocab_type: str  # "spm", "bpe", "wpm", "ugm", "rwkv", "plamo2", "none"
    n_tokens: int
    bos: int  # -1 when the model has none
    eos: int
    add_bos: bool
    add_eos: bool
    tokens: Sequence[str]  # token text by id


@dataclass(frozen=True)
class CompatReport:
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def check_vocab(target: VocabFacts, draft: VocabFacts) -> CompatReport:
    problems: list[str] = []
    if target.vocab_type != draft.vocab_type:
        problems.append(f"vocab type differs: target {target.vocab_type}, draft {draft.vocab_type}")
    for field in ("bos", "eos", "add_bos", "add_eos"):
        t, d = getattr(target, field), getattr(draft, field)
        if t != d:
            problems.append(f"{field} differs: target {t}, draft {d}")
    size_gap = abs(target.n_tokens - draft.n_tokens)
    if size_gap > MAX_SIZE_DIFFERENCE:
        problems.append(
            f"vocab sizes differ by {size_gap} (> {MAX_SIZE_DIFFERENCE}): "
            f"target {target.n_tokens}, draft {draft.n_tokens}"
        )
    mismatch = first_token_mismatch(target.tokens, draft.tokens)
    if mismatch is not None:
        token_id, t_text, d_text = mismatch
        problems.append(f"token {token_id} differs: target {t_text!r}, draft {d_text!r}")
    return CompatReport(tuple(problems))


def first_token_mismatch(
    target_tokens: Sequence[str], draft_tokens: Sequence[str]
) -> tuple[int, str, str] | None:
    """First id >= 5 whose text differs, with both texts; None when all agree."""
    for token_id in range(FIRST_CHECKED_TOKEN, min(len(target_tokens), len(draft_tokens))):
        if target_tokens[token_id] != draft_tokens[token_id]:
            return token_id, target_tokens[token_id], draft_tokens[token_id]
    return None
