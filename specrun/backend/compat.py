"""llama.cpp's draft/target vocabulary rule, reporting every failed check with evidence.

The facts come from a loaded model (backend) or a GGUF header (no weights); the rule is
the same: same vocab type, same bos/eos add-flags (and ids when the token is added),
sizes within 128, and identical token text from id 5 up to the smaller vocabulary.
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
    notes: tuple[str, ...] = ()  # differences llama.cpp tolerates, worth knowing

    @property
    def ok(self) -> bool:
        return not self.problems


def check_vocab(target: VocabFacts, draft: VocabFacts) -> CompatReport:
    problems: list[str] = []
    if target.vocab_type != draft.vocab_type:
        problems.append(f"vocab type differs: target {target.vocab_type}, draft {draft.vocab_type}")
    notes: list[str] = []
    for special in ("bos", "eos"):
        problem, note = _special_token_check(target, draft, special)
        problems += [problem] if problem else []
        notes += [note] if note else []
    size_gap = abs(target.n_tokens - draft.n_tokens)
    if size_gap > MAX_SIZE_DIFFERENCE:
        problems.append(
            f"vocab sizes differ by {size_gap} (> {MAX_SIZE_DIFFERENCE}): target {target.n_tokens}, draft {draft.n_tokens}"
        )
    mismatch = first_token_mismatch(target.tokens, draft.tokens)
    if mismatch is not None:
        token_id, t_text, d_text = mismatch
        problems.append(f"token {token_id} differs: target {t_text!r}, draft {d_text!r}")
    return CompatReport(tuple(problems), tuple(notes))


def _special_token_check(target: VocabFacts, draft: VocabFacts, special: str) -> tuple[str | None, str | None]:
    """(problem, note) for bos or eos, as common_speculative_are_compatible checks them.

    The add-flags must match; the ids matter only when the token is added to the prompt,
    so llama.cpp accepts e.g. Llama 2 with Phi-3 (eos 2 vs 32000, neither adds eos).
    """
    t_add, d_add = getattr(target, f"add_{special}"), getattr(draft, f"add_{special}")
    t_id, d_id = getattr(target, special), getattr(draft, special)
    if t_add != d_add:
        return f"add_{special} differs: target {t_add}, draft {d_add}", None
    if t_id == d_id:
        return None, None
    if t_add:
        return f"{special} id differs: target {t_id}, draft {d_id}", None
    return None, f"{special} id differs (target {t_id}, draft {d_id}) but neither adds it"


def first_token_mismatch(target_tokens: Sequence[str], draft_tokens: Sequence[str]) -> tuple[int, str, str] | None:
    """First id >= 5 whose text differs, with both texts; None when all agree."""
    for token_id in range(FIRST_CHECKED_TOKEN, min(len(target_tokens), len(draft_tokens))):
        if target_tokens[token_id] != draft_tokens[token_id]:
            return token_id, target_tokens[token_id], draft_tokens[token_id]
    return None
