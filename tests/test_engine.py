"""The speculative loop on real llama.cpp contexts, checked against fresh contexts:
greedy exactness, rollback of both caches, long prompts, stops."""

import math
from dataclasses import replace

import numpy as np
import pytest
from reference import GEMMA_ATOL, TINY_ATOL, FreshContexts, assert_greedy_choice, assert_reads_match, record_reads
from tinymodels import write_tiny_llama

from specrun.backend import Context, ContextOptions, Model
from specrun.config import SessionConfig
from specrun.core.drafting import Draft, DraftRequest, drafted
from specrun.core.engine import Engine
from specrun.core.events import Done, StepEvent, TokenEvent
from specrun.core.policy import FixedK
from specrun.core.sampling import Sampler, SamplerSettings
from specrun.drafts.chain import Chain, model_part
from specrun.drafts.drafting_loop import MIN_WINDOW, FeedCost
from specrun.drafts.lookup import PromptLookup
from specrun.drafts.model import DraftModel
from specrun.errors import SpecrunError
from specrun.sequences import History, common_prefix
from specrun.session import Session
from specrun.settings import SettingError

PROMPT = "the cat sat on the mat and the dog sat on the log , the cat sat on the"


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


def draft_context(session):
    model = model_part(session.drafter)
    return model.context if model is not None else None


def assert_greedy_exact(session, prompt, max_tokens=40, atol=TINY_ATOL):
    """Greedy output, and every logits row either cache handed out, against fresh contexts
    fed the same history: a stale or half-rolled-back cache cannot pass."""
    target_reads = record_reads(session.target)
    draft = draft_context(session)
    draft_reads = record_reads(draft) if draft else []
    tokens, steps, sources, stats = run(session, prompt, max_tokens)
    prompt_tokens = session.tokenize(prompt)
    with FreshContexts(session.config.target, session.target.n_ctx, session.config.n_ubatch) as fresh:
        assert assert_reads_match(target_reads, fresh, atol) >= len(tokens)
        for i, token in enumerate(tokens):
            assert_greedy_choice(fresh.logits(prompt_tokens + tokens[:i]), token, atol)
    if draft is not None and draft_reads:
        with FreshContexts(session.config.draft, draft.n_ctx, session.config.n_ubatch) as fresh:
            assert_reads_match(draft_reads, fresh, atol)
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


@pytest.mark.parametrize(
    "settings",
    [
        SamplerSettings(frequency_penalty=2.0),
        SamplerSettings(repeat_penalty=1.3, presence_penalty=0.5, repeat_last_n=8),
        SamplerSettings(logit_bias={2: -np.inf, 183: -2.0}),  # 2 ends the text early; plain writes 183 four times
        SamplerSettings(logit_bias={183: -2.0}, presence_penalty=0.5),
    ],
    ids=["frequency", "repeat-presence-last-8", "bias", "bias-presence"],
)
def test_greedy_output_under_bias_and_penalties_is_plain_decodings(tiny, settings):
    """The target's own weights draft, biased and penalized as the target's rows are, so nearly
    every drafted token is kept; a row after drafted tokens gives the target's choice only if they
    count in its penalties."""
    outputs = {}
    for name, drafting in (("plain", {}), ("same", {"draft": tiny["same"]}), ("lookup", {"lookup": True})):
        config = SessionConfig(target=tiny["target"], k=8, n_ctx=256, sampler=settings, **drafting)
        with Session(config) as session:
            outputs[name], _, _, stats = run(session, PROMPT, 60, plain=name == "plain")
        if name == "same":  # (lookup finds little to copy in text the penalties vary)
            assert stats.accepted > 0.95 * stats.drafted, (stats.accepted, stats.drafted)
    assert outputs["same"] == outputs["plain"] and outputs["lookup"] == outputs["plain"]
    with Session(SessionConfig(target=tiny["target"], n_ctx=256)) as session:
        assert run(session, PROMPT, 60, plain=True)[0] != outputs["plain"]  # the settings changed the text


def test_draft_equal_to_target_is_almost_always_accepted(tiny):
    config = SessionConfig(target=tiny["target"], draft=tiny["same"], k=4, n_ctx=256)
    with Session(config) as session:
        tokens, sources, stats = assert_greedy_exact(session, PROMPT)
    # Batched and 1-token decodes differ slightly in floating point, so not always 100%.
    assert stats.acceptance_rate > 0.8
    assert "bonus" in sources


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_after_drafts_rejections_and_rollbacks_both_caches_read_like_fresh_ones(tiny, temperature):
    """What llama.cpp's caches hold, not the Python token lists, is checked: after the run,
    one more token on each cache must give a fresh context's logits for that history."""
    settings = SamplerSettings(temperature=temperature, seed=3)
    config = SessionConfig(target=tiny["target"], draft=tiny["draft"], k=5, n_ctx=256, sampler=settings)
    with Session(config) as session:
        tokens, steps, _, stats = run(session, PROMPT, 40)
        history = session.tokenize(PROMPT) + tokens
        assert stats.accepted < stats.drafted  # some drafts were rejected and rolled back
        probe = history[5]
        target_row = np.array(session.target.eval([history[-1], probe], logits_rows=1)[-1])
        draft = session.drafter.context
        draft.reuse_prefix(history)
        draft_row = np.array(draft.eval(history[len(draft.tokens) :] + [probe])[-1])
    with FreshContexts(tiny["target"], 256) as fresh:
        np.testing.assert_allclose(target_row, fresh.logits(history + [probe]), atol=TINY_ATOL)
    with FreshContexts(tiny["draft"], 256) as fresh:
        np.testing.assert_allclose(draft_row, fresh.logits(history + [probe]), atol=TINY_ATOL)


def test_prompts_longer_than_the_batch_are_prefilled_and_drafted_in_chunks(tiny):
    """n_batch 8 with a 26-token prompt: prefill and the draft's catch-up split into chunks."""
    target_model, draft_model = Model(tiny["target"]), Model(tiny["draft"], role="draft")
    try:
        options = ContextOptions(n_ctx=256, n_batch=8)
        target, draft = Context(target_model, options), Context(draft_model, options)
        generator = Engine(
            target, Chain(PromptLookup(), DraftModel(draft, sample=False)), Sampler.seeded(SamplerSettings()), FixedK(4)
        )
        prompt = target_model.tokenize(PROMPT)
        assert len(prompt) > 3 * options.n_batch
        target_reads, draft_reads = record_reads(target), record_reads(draft)
        events = list(generator.stream(prompt, 30))
        tokens = [e.token for e in events if isinstance(e, TokenEvent)]
        assert len(tokens) == 30 and events[-1].stats.drafted > 0
        with FreshContexts(tiny["target"], 256) as fresh:
            assert_reads_match(target_reads, fresh)
            for i, token in enumerate(tokens):
                assert_greedy_choice(fresh.logits(prompt + tokens[:i]), token)
        with FreshContexts(tiny["draft"], 256) as fresh:
            assert assert_reads_match(draft_reads, fresh) > 0
    finally:
        target_model.close()
        draft_model.close()


def test_a_draft_model_reports_catching_up_apart_from_drafting(tiny):
    """Feeding a new prompt is charged to catch_up_s (auto spaces probes by it); feeding what
    one step accepted is part of drafting."""
    model = Model(tiny["draft"], role="draft")
    try:
        drafter = DraftModel(Context(model, ContextOptions(n_ctx=256)), sample=False)
        history = model.tokenize(PROMPT)
        first = drafted(drafter, history, DraftRequest(4, FixedK(4), Sampler.seeded(SamplerSettings())))
        assert first.catch_up_s > 0 and len(first.tokens) == 4
        history += first.tokens[:2]
        assert drafted(drafter, history, DraftRequest(4, FixedK(4), Sampler.seeded(SamplerSettings()))).catch_up_s == 0
    finally:
        model.close()


def test_a_draft_far_behind_catches_up_on_its_first_token_and_a_window_where_the_policy_bounds_it(tiny):
    """Under auto a draft fed a long prompt reads its start token and last tokens (what that costs
    is bounded), and all of it once feeding is measured cheap; fixed k feeds all, as llama.cpp."""
    model = Model(tiny["draft"], role="draft")
    greedy = Sampler.seeded(SamplerSettings())
    try:
        drafter = DraftModel(Context(model, ContextOptions(n_ctx=1024)), sample=False)
        # Costs as on two CPU cores, set rather than timed: a busy machine can time a one-token
        # decode slow enough that the window spans the whole history.
        drafter.feed.one_s, drafter.feed.batched_s = 1.0, 0.5  # far above a tiny model's timings, which ema in
        history = model.tokenize(" ".join([PROMPT] * 8))
        assert len(history) > 2 * MIN_WINDOW
        assert len(drafted(drafter, history, DraftRequest(4, FixedK(4), greedy, "window")).tokens) == 4
        drafter.rollback(history)
        assert drafter.context.tokens == [history[0], *history[-MIN_WINDOW:]]
        drafted(drafter, history, DraftRequest(4, FixedK(4), greedy))
        drafter.rollback(history)
        assert drafter.context.tokens == history
        drafter.rollback([])
        drafted(drafter, history, DraftRequest(4, FixedK(4), greedy, "window"))
        drafter.feed.one_s, drafter.feed.batched_s = 1.0, 0.001  # as on a GPU: a batch far cheaper per token
        drafted(drafter, history, DraftRequest(4, FixedK(4), greedy, "window"))
        drafter.rollback(history)
        assert drafter.context.tokens == history
    finally:
        model.close()


def test_a_first_feed_times_a_batch_and_one_token_and_feeds_all_where_that_shows_it_cheap(tiny, monkeypatch):
    monkeypatch.setattr("specrun.drafts.drafting_loop.CATCH_UP_DRAFTS", 10**9)  # any batch is cheap enough for all of it
    model = Model(tiny["draft"], role="draft")
    try:
        drafter = DraftModel(Context(model, ContextOptions(n_ctx=1024)), sample=False)
        history = model.tokenize(" ".join([PROMPT] * 8))
        assert not drafter.feed.measured
        reads = record_reads(drafter.context)
        drafted(drafter, history, DraftRequest(4, FixedK(4), Sampler.seeded(SamplerSettings()), "window"))
        drafter.rollback(history)
        assert drafter.feed.measured and drafter.context.tokens == history
        # The window (start token and MIN_WINDOW tokens) went in as two decodes: all but its last token, then that one.
        assert [len(held) for held, _ in reads[:2]] == [MIN_WINDOW, MIN_WINDOW + 1]
    finally:
        model.close()


def test_greedy_output_is_the_targets_argmax_with_a_draft_reading_a_window(tiny, monkeypatch):
    """The target's own weights as the draft, reading the start token and the last tokens only."""
    monkeypatch.setattr(FeedCost, "window", MIN_WINDOW)  # whatever feeding measures on this machine
    target_model, draft_model = Model(tiny["target"]), Model(tiny["same"], role="draft")
    try:
        target, draft = (Context(model, ContextOptions(n_ctx=512)) for model in (target_model, draft_model))
        generator = Engine(
            target, DraftModel(draft, sample=False), Sampler.seeded(SamplerSettings()), FixedK(4), catch_up="window"
        )
        prompt = target_model.tokenize(" ".join([PROMPT] * 8))
        target_reads, draft_reads = record_reads(target), record_reads(draft)
        events = list(generator.stream(prompt, 40))
        tokens = [e.token for e in events if isinstance(e, TokenEvent)]
        assert events[-1].stats.accepted > 0 and draft.tokens[0] == prompt[0] and len(draft.tokens) < len(prompt)
        with FreshContexts(tiny["target"], 512) as fresh:
            assert_reads_match(target_reads, fresh)
            for i, token in enumerate(tokens):
                assert_greedy_choice(fresh.logits(prompt + tokens[:i]), token)
        with FreshContexts(tiny["same"], 512) as fresh:
            assert assert_reads_match(draft_reads, fresh) > 0  # each row is the window's own
    finally:
        target_model.close()
        draft_model.close()


def test_a_prompt_longer_than_the_session_batch(tiny):
    """Sessions decode 512 rows at most at once: a longer prompt takes two prefill decodes."""
    text = " ".join(["the cat sat on the mat and the dog sat on the log ,"] * 30)
    config = SessionConfig(target=tiny["target"], draft=tiny["draft"], lookup=True, k=4, n_ctx=1024)
    with Session(config) as session:
        assert len(session.tokenize(text)) > 512
        tokens, _, stats = assert_greedy_exact(session, text, max_tokens=8)
    assert len(tokens) == 8 and stats.prefilled_tokens > 512


def test_random_evals_and_rollbacks_leave_the_cache_as_a_fresh_one(tiny):
    """Backend level: any mix of evals (also longer than n_batch), truncations and prefix reuse."""
    rng = np.random.default_rng(0)
    model = Model(tiny["target"])
    context = Context(model, ContextOptions(n_ctx=256, n_batch=8))
    try:
        with FreshContexts(tiny["target"], 256) as fresh:
            for _ in range(40):
                kind = rng.integers(3)
                if kind == 0 or not context.tokens:
                    row = context.eval(rng.integers(3, model.n_vocab, int(rng.integers(1, 20))).tolist())[-1]
                    np.testing.assert_allclose(row, fresh.logits(context.tokens), atol=TINY_ATOL)
                elif kind == 1:
                    context.truncate(int(rng.integers(0, len(context.tokens))))
                else:
                    cut = int(rng.integers(0, len(context.tokens) + 1))
                    history = context.tokens[:cut] + rng.integers(3, model.n_vocab, 2).tolist()
                    shared = next(
                        (i for i, (a, b) in enumerate(zip(context.tokens, history)) if a != b),
                        min(len(context.tokens), len(history)),
                    )
                    assert context.reuse_prefix(history) == shared and context.tokens == history[:shared]
                assert context.free_slots == context.n_ctx - len(context.tokens)
                if len(context.tokens) > 200:
                    context.truncate(10)
    finally:
        model.close()


def test_a_cache_following_a_growing_history_holds_what_a_whole_comparison_finds(tiny):
    """`reuse_prefix` of the same History compares only what was added since, as a draft's cache
    does every step: after any mix of growth, drafts, rejections and truncations it keeps exactly
    the prefix a comparison of the whole text finds, and the cache reads like a fresh one."""
    rng = np.random.default_rng(1)
    model = Model(tiny["draft"])
    context = Context(model, ContextOptions(n_ctx=256, n_batch=8))
    history = History(rng.integers(3, model.n_vocab, 12).tolist())
    try:
        with FreshContexts(tiny["draft"], 256) as fresh:
            for _ in range(60):
                for kind in rng.integers(3, size=int(rng.integers(1, 4))):  # a few changes between comparisons
                    if kind == 0 and len(history) < 200:
                        history += rng.integers(3, model.n_vocab, int(rng.integers(1, 4))).tolist()  # tokens emitted
                    elif kind == 1 and len(context.tokens) < 200:
                        context.eval(rng.integers(3, model.n_vocab, int(rng.integers(1, 5))).tolist())  # a draft
                    elif kind == 2 and context.tokens:
                        context.truncate(int(rng.integers(0, len(context.tokens))))
                whole = common_prefix(list(context.tokens), list(history))
                assert context.reuse_prefix(history) == whole and context.tokens == history[:whole]
                if whole < len(history):  # caught up, as a draft's cache is before it drafts
                    row = context.eval(history[whole:])[-1]
                    np.testing.assert_allclose(row, fresh.logits(context.tokens), atol=TINY_ATOL)
    finally:
        model.close()


def test_a_history_only_grows():
    history = History([1, 2, 3])
    history += [4]
    history.append(5)
    assert history == [1, 2, 3, 4, 5] and history[1:3] == [2, 3]
    for change in (lambda: history.__setitem__(0, 9), lambda: history.pop(), lambda: history.__delitem__(slice(2, None))):
        with pytest.raises(TypeError, match="only grows"):
            change()


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
        generator = Engine(
            session.target, session.drafter, Sampler.seeded(SamplerSettings()), FixedK(6), eog=frozenset({stop_token})
        )
        events = list(generator.stream(session.tokenize(PROMPT), 30))
    tokens = [e.token for e in events if isinstance(e, TokenEvent)]
    assert tokens == reference[: reference.index(stop_token) + 1]
    assert events[-1].stats.stop_reason == "eog"


def test_auto_keeps_what_it_learned_across_generations(tiny):
    """A second prompt (chat turn, bench prompt) must not pay again to learn a draft is slow."""
    with Session(SessionConfig(target=tiny["target"], draft=tiny["draft"], k="auto", n_ctx=256)) as session:
        first = session.engine()
        list(first.stream(session.tokenize(PROMPT), 12))
        learned = first.policy.sources["draft"].steps
        second = session.engine()
        assert second.policy is first.policy and learned > 0
        assert session.engine(policy=4).policy is not first.policy


def test_plain_decoding_skips_the_verify_cost_measurement(tiny, monkeypatch):
    def measure(*args):
        raise AssertionError("plain decoding measured verify costs")

    monkeypatch.setattr("specrun.session.policies.measure_verify_costs", measure)
    with Session(SessionConfig(target=tiny["target"], k="auto", n_ctx=256)) as session:
        tokens, _, _, _ = run(session, PROMPT, 5)
        assert len(tokens) == 5


def test_a_drafter_is_asked_for_no_more_than_the_policy_allows(tiny, monkeypatch):
    """Lookup works on what it is offered: a long budget must not make each step scan it."""
    asked = []
    propose = PromptLookup.propose

    def recording_propose(self, history, request):
        asked.append(request.limit)
        return propose(self, history, request)

    monkeypatch.setattr(PromptLookup, "propose", recording_propose)
    with Session(SessionConfig(target=tiny["target"], lookup=True, k=3, n_ctx=256)) as session:
        run(session, PROMPT, 40)
    assert asked and max(asked) == 3


class ReturnsItsDraft:
    """A source written to the old contract: its propose returns the draft instead of yielding."""

    names, counters, parts, runs_model = ("line",), (), (), False

    def propose(self, history, request):
        return Draft.under(request.policy.offer(self.names[0], 1), [history[-1]])

    def rollback(self, history):
        pass


def test_a_source_that_returns_its_draft_instead_of_yielding_is_told_how_to_mend_it(tiny):
    with Session(SessionConfig(target=tiny["target"], n_ctx=256)) as session:
        generator = session.engine(drafter=ReturnsItsDraft(), policy=2)
        with pytest.raises(SpecrunError, match="@without_decodes"):
            generator.run(session.tokenize(PROMPT), 4)


def test_max_tokens_and_context_full(tiny):
    with Session(SessionConfig(target=tiny["target"], lookup=True, k=8, n_ctx=64)) as session:
        prompt_len = len(session.tokenize(PROMPT))
        tokens, _, _, stats = run(session, PROMPT, 7)
        assert len(tokens) == 7 and stats.stop_reason == "max_tokens"
        # No end-of-generation token: random weights may pick </s> before the context fills.
        generator = Engine(session.target, session.drafter, Sampler.seeded(SamplerSettings()), FixedK(8), eog=frozenset())
        events = list(generator.stream(session.tokenize(PROMPT), 500))
        assert events[-1].stats.stop_reason == "context_full"
        n_ctx = session.target.n_ctx  # llama.cpp rounds the size up
        assert events[-1].stats.tokens == n_ctx - prompt_len + 1  # every slot used; the last token needs none
        with pytest.raises(SpecrunError, match=f"context holds {n_ctx}"):
            run(session, PROMPT * (n_ctx // prompt_len + 1), 5)


@pytest.mark.parametrize("variant", ["different", "bigger"])
def test_a_draft_with_another_vocabulary_drafts_translated_and_output_stays_exact(tiny, variant):
    """llama.cpp's rule refuses these (other token texts, a size 256 apart); they draft through text."""
    with Session(SessionConfig(target=tiny["target"], draft=tiny[variant], k=3, n_ctx=256)) as session:
        assert session.drafter.names == ("translated",)
        assert_greedy_exact(session, PROMPT, max_tokens=12)


def test_padded_vocabulary_is_compatible(tiny):
    with Session(SessionConfig(target=tiny["target"], draft=tiny["padded"], k=3, n_ctx=128)) as session:
        assert_greedy_exact(session, PROMPT, max_tokens=12)


@pytest.mark.gemma
@pytest.mark.parametrize("drafting", ["lookup", "self"])
def test_gemma_greedy_tokens_are_the_targets_argmax(gemma, drafting):
    config = SessionConfig(
        target=gemma, draft=gemma if drafting == "self" else None, lookup=drafting == "lookup", k=6, n_ctx=512, n_ubatch=1
    )
    prompt = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n"
    with Session(config) as session:
        tokens, sources, stats = assert_greedy_exact(session, prompt, max_tokens=24, atol=GEMMA_ATOL)
    assert stats.accepted > 0


def rows_by_history(reads) -> dict[tuple[int, ...], np.ndarray]:
    return {tuple(tokens[: len(tokens) - len(rows) + 1 + i]): row for tokens, rows in reads for i, row in enumerate(rows)}


@pytest.mark.gemma
def test_gemma_micro_batches_of_6_verify_with_the_logits_of_one_token_decoding(gemma):
    # The trade `--ubatch-size 6` offers: verify batches of up to 25 rows, computed 6 rows
    # at a time, give bit for bit what plain decoding computes one token at a time.
    prompt = (
        "Copy the list.\nList: apples, pears, plums, cherries, grapes, lemons, limes, figs, dates, kiwis, mangoes.\n"
        "Copy: apples, pears, plums, cherries, grapes, lemons, limes, figs, dates, kiwis, mangoes.\n"
        "List: oak, ash, elm, beech, birch, maple, willow, poplar, cedar, pine, spruce, larch.\nCopy:"
    )
    with Session(SessionConfig(target=gemma, lookup=True, k=24, n_ctx=512, n_ubatch=6, threads=2)) as session:
        plain_reads = record_reads(session.target)
        plain_tokens, *_ = run(session, prompt, 40, plain=True)
        plain_rows = rows_by_history(plain_reads)
        spec_reads = record_reads(session.target)
        spec_tokens, steps, _, stats = run(session, prompt, 40)
    assert spec_tokens == plain_tokens
    assert max(event.drafted for event, _ in steps) > 6  # some verify spanned several micro-batches
    spec_rows = rows_by_history(spec_reads)
    shared = [history for history in spec_rows if history in plain_rows]
    assert len(shared) >= len(plain_tokens) // 2
    for history in shared:
        assert np.array_equal(spec_rows[history], plain_rows[history]), f"logits after {len(history)} tokens differ"


def test_float_views_follow_the_buffer_and_its_address():
    import ctypes

    from specrun.backend.views import FloatViews

    first, second = (ctypes.c_float * 8)(), (ctypes.c_float * 8)()
    views = FloatViews()
    pointer = ctypes.cast(first, ctypes.POINTER(ctypes.c_float))
    view = views.rows(pointer, 2, 4)
    assert views.rows(pointer, 2, 4) is view  # made once per address and shape
    first[5] = 3.0
    assert view[1, 1] == 3.0  # a view, not a copy: it sees the next decode's values
    other = views.rows(ctypes.cast(second, ctypes.POINTER(ctypes.c_float)), 2, 4)
    second[5] = 4.0
    assert other is not view and other[1, 1] == 4.0 and view[1, 1] == 3.0


ENDS_OFTEN = 395  # a word piece the tiny target writes often (greedy's second token after PROMPT)


def token_events(session, prompt, plain, settings, top):
    """A generation's token events, with `top` alternatives each, and its stats."""
    events = list(session.stream(prompt, 40, plain=plain, sampler=settings, logprobs=top))
    return [event for event in events if isinstance(event, TokenEvent)], events[-1].stats


@pytest.mark.parametrize("drafting", ["plain", "same", "lookup"])
def test_ignore_eos_never_gives_the_end_its_rows_made_likely(tmp_path, drafting):
    """--ignore-eos checked apart from how it is made (a bias of -inf on each end token), on the
    tiny target with a piece it writes often as its end of sequence, so the end is likely again and
    again. Sampled from the rows' own distributions, which the logprobs report (the model's, before
    any setting), an end that was not banned would have come; greedy, each token is the argmax of a
    fresh context's row with the end tokens taken out by hand."""
    target = write_tiny_llama(tmp_path / "target.gguf", seed=0, eos_id=ENDS_OFTEN)
    # "same": the target's weights drafting
    draft = write_tiny_llama(tmp_path / "same.gguf", seed=0, eos_id=ENDS_OFTEN) if drafting == "same" else None
    config = SessionConfig(target=target, draft=draft, lookup=drafting == "lookup", k=4, n_ctx=256, threads=1)
    plain = drafting == "plain"
    unfiltered = SamplerSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)  # draws from the rows' own distributions
    with Session(config) as session:
        ends, prompt = session.target_model.eog_ids, session.tokenize(PROMPT)
        assert ENDS_OFTEN in ends
        assert session.generate(prompt, 40, plain=plain).stop_reason == "eog"  # greedy, unbanned, it ends at once
        greedy, stats = token_events(session, prompt, plain, SamplerSettings(ignore_eos=True), top=3)
        assert len(greedy) == 40 and stats.stop_reason == "max_tokens"
        ended = drafted = accepted = 0
        likely = 0.0
        for seed in range(20):
            sampled = replace(unfiltered, seed=seed)
            ended += session.generate(prompt, 40, plain=plain, sampler=sampled).stop_reason == "eog"
            events, stats = token_events(session, prompt, plain, replace(sampled, ignore_eos=True), top=20)
            assert len(events) == 40 and stats.stop_reason == "max_tokens" and not ends & {e.token for e in events}
            # each row's probability of an end (of those among its 20 likeliest: the others add a little more)
            likely += sum(math.exp(logprob) for e in events for token, logprob in e.logprobs.top if token in ends)
            drafted, accepted = drafted + stats.drafted, accepted + stats.accepted
    assert ended >= 3  # unbanned, the end comes
    # Unbanned, the chance that none of these rows gave an end is prod(1 - p) <= exp(-sum p) < exp(-12) ~ 6e-6.
    assert likely > 12
    assert drafted > 0 or plain
    if drafting == "same":  # the target's weights draft, their rows banned too: unbanned, they would draft ends
        assert accepted > 0.995 * drafted  # the target rejects (8 of 622 were, when the drafts' rows were not banned)
    # Greedy: where the logprobs put an end first, the next likeliest is written instead; every
    # token is a fresh context's argmax once the ends are out.
    firsts = [e for e in greedy if e.logprobs.top[0][0] in ends]
    assert firsts and all(e.token == next(t for t, _ in e.logprobs.top if t not in ends) for e in firsts)
    with FreshContexts(target, 256) as fresh:
        fresh.prefetch([prompt + [e.token for e in greedy]])  # one decode gives every row
        for i, event in enumerate(greedy):
            row = fresh.logits(prompt + [e.token for e in greedy[:i]]).copy()
            row[list(ends)] = -np.inf
            assert_greedy_choice(row, event.token)


def test_a_logit_bias_past_the_targets_vocabulary_is_refused_naming_the_token(tiny):
    with Session(SessionConfig(target=tiny["target"], n_ctx=256)) as session:
        n_vocab = session.target.model.n_vocab
        with pytest.raises(SettingError, match=f"from 0 to {n_vocab - 1}, but is {n_vocab}$"):
            session.engine(sampler=SamplerSettings(logit_bias={5: 1.0, n_vocab: 1.0}))


@pytest.mark.parametrize("drafting", ["plain", "lookup", "draft"])
def test_each_tokens_logprobs_are_its_rows_under_speculation(tiny, drafting):
    """A kept draft token's log-probability comes from its verify row, which is the row plain
    decoding would have read: checked against a fresh context fed the same text."""
    config = SessionConfig(
        target=tiny["target"], draft=tiny["same"] if drafting == "draft" else None, lookup=drafting == "lookup", k=4, n_ctx=256
    )
    with Session(config) as session:
        history = session.tokenize(PROMPT)
        events = [e for e in session.stream(history, 60, plain=drafting == "plain", logprobs=3) if isinstance(e, TokenEvent)]
        assert all(e.logprobs is not None for e in events)
        assert {e.source for e in events} >= ({"target"} if drafting == "plain" else {"draft"})
        assert all(e.logprobs is None for e in session.stream(history, 4) if isinstance(e, TokenEvent))
    with FreshContexts(tiny["target"], 256) as fresh:
        for i, event in enumerate(events):
            row = fresh.logits(history + [e.token for e in events[:i]]).astype(np.float64)
            exact = row - np.log(np.exp(row - row.max()).sum()) - row.max()
            assert event.logprobs.logprob == pytest.approx(exact[event.token], abs=TINY_ATOL)
            assert [t for t, _ in event.logprobs.top] == np.argsort(-exact, kind="stable")[:3].tolist()
