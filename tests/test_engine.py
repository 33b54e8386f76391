"""The speculative loop on real llama.cpp contexts: greedy exactness, rollback, stops."""

import numpy as np
import pytest

from specrun.drafters import PromptLookup
from specrun.engine import Done, StepEvent, TokenEvent
from specrun.errors import IncompatibleError, SpecrunError
from specrun.sampling import SamplerSettings
from specrun.session import Session, SessionConfig

PROMPT = "the cat sat on the mat and the dog sat on the log , the cat sat on the"


def record_verify_logits(session):
    """Wrap the target's eval so every verification's logits rows are kept (copied)."""
    rows_by_step = []
    original = session.target.eval

    def eval_and_record(tokens, logits_rows=1):
        logits = original(tokens, logits_rows)
        if logits is not None:
            rows_by_step.append(np.array(logits))
        return logits

    session.target.eval = eval_and_record
    return rows_by_step


def run(session, prompt, max_tokens, plain=False, on_step=None):
    tokens, steps, sources, history = [], [], [], session.tokenize(prompt)
    for event in session.stream(history, max_tokens, plain=plain):
        if isinstance(event, StepEvent):
            if on_step:
                on_step(event, history + tokens)
            steps.append((event, len(tokens)))
        elif isinstance(event, TokenEvent):
            tokens.append(event.token)
            sources.append(event.source)
        elif isinstance(event, Done):
            return tokens, steps, sources, event.stats


def assert_greedy_exact(session, prompt, max_tokens=40):
    rows = record_verify_logits(session)
    tokens, steps, sources, stats = run(session, prompt, max_tokens)
    assert len(rows) == len(steps) == stats.steps
    for (step, start), logits in zip(steps, rows):
        emitted = tokens[start : start + step.accepted + 1]
        assert emitted == [int(np.argmax(logits[j])) for j in range(len(emitted))]
    return tokens, sources, stats


@pytest.mark.parametrize("drafting", ["draft", "lookup", "plain"])
def test_greedy_tokens_are_the_targets_argmax(tiny, drafting):
    config = SessionConfig(
        target=tiny["target"],
        draft=tiny["draft"] if drafting == "draft" else None,
        lookup=drafting == "lookup",
        k=4,
        n_ctx=256,
    )
    with Session(config) as session:
        tokens, sources, stats = assert_greedy_exact(session, PROMPT)
    assert stats.tokens == len(tokens) == 40
    if drafting == "plain":
        assert stats.drafted == 0 and set(sources) == {"target"}
    else:
        assert stats.drafted > 0 and 0 <= stats.accepted <= stats.drafted


def test_draft_equal_to_target_is_almost_always_accepted(tiny):
    config = SessionConfig(target=tiny["target"], draft=tiny["same"], k=4, n_ctx=256)
    with Session(config) as session:
        tokens, sources, stats = assert_greedy_exact(session, PROMPT)
    # Batched and 1-token decodes differ slightly in floating point, so not always 100%.
    assert stats.acceptance_rate > 0.8
    assert "bonus" in sources


def test_rollback_leaves_caches_holding_exactly_the_accepted_tokens(tiny):
    checked = []

    def check(step, history):
        # At a StepEvent the step's tokens are not yet in `history`: snapshot both caches.
        checked.append((list(session.target.tokens), list(session.drafter.context.tokens), step, len(history)))

    config = SessionConfig(target=tiny["target"], draft=tiny["draft"], k=5, n_ctx=256)
    with Session(config) as session:
        tokens, steps, _, stats = run(session, PROMPT, 40, on_step=check)
        full = session.tokenize(PROMPT) + tokens
        assert session.target.tokens == full[:-1]
        assert full[: len(session.drafter.context.tokens)] == session.drafter.context.tokens
    rejections = 0
    for target_tokens, draft_tokens, step, before in checked:
        # The last token and the accepted drafts; the target's own new token is not decoded yet.
        assert target_tokens == full[: before + step.accepted]
        assert full[: len(draft_tokens)] == draft_tokens  # no rejected draft left behind
        rejections += step.accepted < step.drafted
    assert rejections > 0


def test_sampling_is_reproducible_with_a_seed(tiny):
    def sample(seed):
        settings = SamplerSettings(temperature=0.8, seed=seed)
        config = SessionConfig(target=tiny["target"], draft=tiny["draft"], k=3, n_ctx=256, sampler=settings)
        with Session(config) as session:
            return run(session, PROMPT, 30)

    first, _, sources, stats = sample(42)
    assert first == sample(42)[0] and len(first) == 30
    assert first != sample(43)[0]
    assert stats.drafted > 0 and "target" in sources


def test_stops_at_end_of_generation_and_never_past_it(tiny):
    config = SessionConfig(target=tiny["target"], lookup=True, k=6, n_ctx=256)
    with Session(config) as session:
        reference = run(session, PROMPT, 30, plain=True)[0]
        stop_token = reference[5]
        generator = session.generator()
        generator.eog = frozenset({stop_token})
        events = list(generator.generate(session.tokenize(PROMPT), 30))
    tokens = [e.token for e in events if isinstance(e, TokenEvent)]
    assert tokens == reference[: reference.index(stop_token) + 1]
    assert events[-1].stats.stop_reason == "eog"


def test_auto_keeps_what_it_learned_across_generations(tiny):
    """A second prompt (chat turn, bench prompt) must not pay again to learn a draft is slow."""
    with Session(SessionConfig(target=tiny["target"], draft=tiny["draft"], k="auto", n_ctx=256)) as session:
        first = session.generator()
        list(first.generate(session.tokenize(PROMPT), 12))
        learned = first.policy.sources["draft"].steps
        second = session.generator()
        assert second.policy is first.policy and learned > 0
        assert session.generator(k=4).policy is not first.policy


def test_plain_decoding_skips_the_verify_cost_measurement(tiny, monkeypatch):
    def measure(*args):
        raise AssertionError("plain decoding measured verify costs")

    monkeypatch.setattr("specrun.session.measure_verify_costs", measure)
    with Session(SessionConfig(target=tiny["target"], k="auto", n_ctx=256)) as session:
        tokens, _, _, _ = run(session, PROMPT, 5)
        assert len(tokens) == 5


def test_a_drafter_is_asked_for_no_more_than_the_policy_allows(tiny, monkeypatch):
    """Lookup works on what it is offered: a long budget must not make each step scan it."""
    asked = []
    propose = PromptLookup.propose

    def recording_propose(self, history, limit, rng, policy):
        asked.append(limit)
        return propose(self, history, limit, rng, policy)

    monkeypatch.setattr(PromptLookup, "propose", recording_propose)
    with Session(SessionConfig(target=tiny["target"], lookup=True, k=3, n_ctx=256)) as session:
        run(session, PROMPT, 40)
    assert asked and max(asked) == 3


def test_max_tokens_and_context_full(tiny):
    with Session(SessionConfig(target=tiny["target"], lookup=True, k=8, n_ctx=64)) as session:
        prompt_len = len(session.tokenize(PROMPT))
        tokens, _, _, stats = run(session, PROMPT, 7)
        assert len(tokens) == 7 and stats.stop_reason == "max_tokens"
        generator = session.generator()
        generator.eog = frozenset()  # random weights may pick </s> before the context fills
        events = list(generator.generate(session.tokenize(PROMPT), 500))
        assert events[-1].stats.stop_reason == "context_full"
        n_ctx = session.target.n_ctx  # llama.cpp rounds the size up
        assert events[-1].stats.tokens == n_ctx - prompt_len + 1  # every slot used; the last token needs none
        with pytest.raises(SpecrunError, match=f"context holds {n_ctx}"):
            run(session, PROMPT * (n_ctx // prompt_len + 1), 5)


@pytest.mark.parametrize("variant, problem", [("different", "token"), ("bigger", "vocab sizes differ")])
def test_incompatible_draft_is_refused_with_the_reason(tiny, variant, problem):
    with pytest.raises(IncompatibleError, match=problem):
        Session(SessionConfig(target=tiny["target"], draft=tiny[variant]))


def test_padded_vocabulary_is_compatible(tiny):
    with Session(SessionConfig(target=tiny["target"], draft=tiny["padded"], k=3, n_ctx=128)) as session:
        assert_greedy_exact(session, PROMPT, max_tokens=12)


@pytest.mark.gemma
@pytest.mark.parametrize("drafting", ["lookup", "self"])
def test_gemma_greedy_tokens_are_the_targets_argmax(gemma, drafting):
    config = SessionConfig(
        target=gemma, draft=gemma if drafting == "self" else None, lookup=drafting == "lookup", k=6, n_ctx=512
    )
    prompt = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n"
    with Session(config) as session:
        tokens, sources, stats = assert_greedy_exact(session, prompt, max_tokens=24)
    assert stats.accepted > 0
