"""Drafts with another vocabulary: the tiny SentencePiece target drafted for by a tiny GPT-2
byte-level BPE model, greedy output the target's argmax, the draft's cache the accepted text
in its own tokens, characters split across tokens, special tokens, and a cost per step that
does not grow with the history. Real models (Gemma 3 270M and SmolLM2-135M) at the end."""

from __future__ import annotations

import numpy as np
import pytest
from reference import TINY_ATOL, FreshContexts, assert_greedy_choice, assert_reads_match, record_reads
from test_engine import PROMPT, assert_greedy_exact

from specrun.backend import Context, ContextOptions, Model
from specrun.config import SessionConfig
from specrun.core.drafting import DraftRequest, drafted
from specrun.core.engine import Engine
from specrun.core.policy import FixedK
from specrun.core.sampling import Sampler, SamplerSettings
from specrun.drafts.drafting_loop import MIN_WINDOW, FeedCost
from specrun.drafts.translated import TranslatingDraft
from specrun.drafts.vocab_bridge import SPECIAL, VocabBridge
from specrun.errors import IncompatibleError, SpecrunError
from specrun.session import Session

GREEDY = Sampler(SamplerSettings(), np.random.default_rng(0))


class Quiet:
    def show(self, pieces) -> None:
        pass

    def step(self, event, stats) -> None:
        pass


@pytest.fixture(scope="module")
def models(tiny):
    target, draft = Model(tiny["target"]), Model(tiny["gpt2"], role="draft")
    yield target, draft
    draft.close()
    target.close()


@pytest.fixture
def translating(models):
    target, draft = models
    context = Context(draft, ContextOptions(n_ctx=1024, n_threads=1))
    yield target, TranslatingDraft(context, VocabBridge(target, draft))
    context.close()


def cached_text(drafter: TranslatingDraft) -> bytes:
    return b"".join(drafter.bridge.draft_pieces[t] for t in drafter.context.tokens)


def target_text(target: Model, tokens) -> bytes:
    return b"".join(target.piece(t) for t in tokens)


def test_the_bridge_maps_tokens_with_the_same_bytes_and_the_end_of_text(models):
    target, draft = models
    bridge = VocabBridge(target, draft)
    mapped = np.flatnonzero(bridge.to_target >= 0)
    assert len(mapped) > 256  # every byte, and the words both vocabularies have whole
    for token in mapped:
        if bridge.draft_pieces[token]:
            assert target.piece(int(bridge.to_target[token])) == bridge.draft_pieces[token]
    assert bridge.to_target[draft.eos] == target.eos  # <|endoftext|> ends the target's text too
    assert 0.5 < bridge.overlap.draft_share <= 1 and 0.5 < bridge.overlap.target_share <= 1


def test_the_cache_holds_the_accepted_text_in_the_drafts_own_tokens(tiny, models):
    target, draft = models
    config = SessionConfig(target=tiny["target"], draft=tiny["gpt2"], k=4, n_ctx=512, threads=1)
    with Session(config) as session:
        reads = record_reads(session.drafter.context)
        history = session.tokenize(PROMPT)
        run = session.engine().run(history, 40)
        # The generator's last rollback dropped the last guess; the next proposal catches up on the rest.
        assert target_text(target, history + run.tokens).startswith(cached_text(session.drafter))
        drafted(session.drafter, history + run.tokens, DraftRequest(1, FixedK(1), GREEDY))
        session.drafter.rollback(history + run.tokens)
        assert cached_text(session.drafter) == target_text(target, history + run.tokens)
        assert run.stats.counters["draft_tokens_reencoded"] > 0
        with FreshContexts(tiny["gpt2"], 1024) as fresh:
            assert assert_reads_match(reads, fresh) > 0  # no stale row survived a rollback


@pytest.mark.parametrize("translation", ["text", "tokens"])
def test_greedy_output_is_the_targets_argmax(tiny, translation):
    config = SessionConfig(target=tiny["target"], draft=tiny["gpt2"], k=4, n_ctx=512, threads=1, translation=translation)
    with Session(config) as session:
        tokens, sources, stats = assert_greedy_exact(session, PROMPT * 2, max_tokens=40, atol=TINY_ATOL)
    assert stats.drafted > 0 and len(tokens) == 40


def test_a_character_split_across_tokens_waits_for_its_last_byte(translating):
    target, drafter = translating
    text = "the café"
    history = target.tokenize(text)
    assert target.piece(history[-1]) == "é".encode()[1:]  # the tiny vocabulary spells é in two byte tokens
    drafted(drafter, history[:-1], DraftRequest(4, FixedK(4), GREEDY))  # history ends inside é
    drafter.rollback(history[:-1])
    assert cached_text(drafter) == target_text(target, history[:-2])  # the cache waits for the rest of é
    draft = drafted(drafter, history, DraftRequest(4, FixedK(4), GREEDY))
    drafter.rollback(history)
    assert cached_text(drafter) == target_text(target, history) and cached_text(drafter).endswith("é".encode())
    assert all(0 <= token < target.n_vocab for token in draft.tokens)


def test_a_text_draft_of_k_tokens_decodes_each_but_the_last(translating):
    target, drafter = translating
    history = target.tokenize(PROMPT)
    drafted(drafter, history, DraftRequest(4, FixedK(4), GREEDY))
    drafter.rollback(history)
    before = len(drafter.context.tokens)
    widths: list[int] = []
    evaluate = drafter.context.eval
    drafter.context.eval = lambda tokens, *rest: widths.append(len(tokens)) or evaluate(tokens, *rest)
    draft = drafted(drafter, history, DraftRequest(4, FixedK(4), GREEDY))
    assert widths == [1, 1, 1, 1]  # the cache's last token again, for its logits; then 3 of the 4 guesses
    assert len(drafter.context.tokens) == before + 3 and draft.tokens


def test_special_tokens_become_the_drafts_own(translating):
    target, drafter = translating
    history = target.tokenize("the cat") + [target.eos] + target.tokenize("the dog", add_special=False)
    drafter.rollback(history)
    drafted(drafter, history, DraftRequest(2, FixedK(2), GREEDY))
    cache = drafter.context.tokens
    assert drafter.bridge.draft.eos in cache  # the end of text, as the draft writes it
    assert SPECIAL + drafter.bridge.draft.eos in drafter.stream.values
    assert target.bos not in cache  # the draft has no start token: the target's adds nothing


def test_a_step_reencodes_a_short_window_however_long_the_history(translating, monkeypatch):
    target, drafter = translating
    encoded: list[int] = []
    tokenize = drafter.bridge.draft.tokenize

    def recording(text, *args, **kwargs):
        encoded.append(len(text))
        return tokenize(text, *args, **kwargs)

    monkeypatch.setattr(drafter.bridge.draft, "tokenize", recording)
    history = target.tokenize(PROMPT)
    drafted(drafter, history, DraftRequest(4, FixedK(4), GREEDY))
    words = target.tokenize(" and the dog sat on the log" * 12, add_special=False)
    for token in words:  # one accepted token a step, as when every draft is rejected
        history.append(token)
        encoded.clear()
        drafted(drafter, history, DraftRequest(4, FixedK(4), GREEDY))
        assert sum(encoded) < 48, (len(history), encoded)
    drafter.rollback(history)
    assert cached_text(drafter) == target_text(target, history)


@pytest.mark.parametrize("draft_name, target_name", [("gpt2", "target"), ("target", "gpt2")])
def test_a_draft_far_behind_reads_its_start_token_and_a_window_where_the_policy_bounds_it(tiny, draft_name, target_name):
    """Under auto a translated draft fed a long prompt reads its start token (when it has one)
    and the last target tokens' text, and all of it once feeding is measured cheap."""
    target, draft = Model(tiny[target_name]), Model(tiny[draft_name], role="draft")
    context = Context(draft, ContextOptions(n_ctx=2048, n_threads=1))
    try:
        drafter = TranslatingDraft(context, VocabBridge(target, draft))
        # Costs as on two CPU cores, set rather than timed: a busy machine can time a one-token
        # decode slow enough that the window spans the whole history.
        drafter.feed.one_s, drafter.feed.batched_s = 1.0, 0.5  # far above a tiny model's timings, which ema in
        history = target.tokenize(" ".join([PROMPT] * 8))
        assert len(history) > 2 * MIN_WINDOW
        drafted(drafter, history, DraftRequest(4, FixedK(4), GREEDY, "window"))
        drafter.rollback(history)
        assert cached_text(drafter) == target_text(target, history[-MIN_WINDOW:])
        assert (context.tokens[0] == draft.bos) == draft.add_bos
        drafted(drafter, history, DraftRequest(4, FixedK(4), GREEDY))  # fixed k feeds all of it, as llama.cpp does
        drafter.rollback(history)
        assert cached_text(drafter) == target_text(target, history)
        drafter.rollback([])
        drafted(drafter, history, DraftRequest(4, FixedK(4), GREEDY, "window"))
        drafter.feed.one_s, drafter.feed.batched_s = 1.0, 0.001  # as on a GPU: a batch far cheaper per token
        drafted(drafter, history, DraftRequest(4, FixedK(4), GREEDY, "window"))
        drafter.rollback(history)
        assert cached_text(drafter) == target_text(target, history)
    finally:
        context.close()
        draft.close()
        target.close()


def test_a_first_feed_that_shows_feeding_cheap_feeds_a_translated_draft_all_of_it(translating, monkeypatch):
    monkeypatch.setattr("specrun.drafts.drafting_loop.CATCH_UP_DRAFTS", 10**9)  # any batch is cheap enough for all of it
    target, drafter = translating
    history = target.tokenize(" ".join([PROMPT] * 8))
    drafted(drafter, history, DraftRequest(4, FixedK(4), GREEDY, "window"))
    drafter.rollback(history)
    assert drafter.feed.measured and cached_text(drafter) == target_text(target, history)


def test_greedy_output_is_the_targets_argmax_with_a_translated_draft_reading_a_window(tiny, monkeypatch):
    monkeypatch.setattr(FeedCost, "window", MIN_WINDOW)  # whatever feeding measures on this machine
    config = SessionConfig(target=tiny["target"], draft=tiny["gpt2"], k=4, n_ctx=1024, threads=1)
    with Session(config) as session:
        prompt = session.tokenize(" ".join([PROMPT] * 8))
        target_reads, draft_reads = record_reads(session.target), record_reads(session.drafter.context)
        run = Engine(session.target, session.drafter, Sampler.seeded(SamplerSettings()), FixedK(4), catch_up="window").run(
            prompt, 40
        )
        assert run.stats.drafted > 0 and len(session.drafter.context.tokens) < len(prompt)
        with FreshContexts(tiny["target"], 1024) as fresh:
            assert_reads_match(target_reads, fresh)
            for i, token in enumerate(run.tokens):
                assert_greedy_choice(fresh.logits(prompt + run.tokens[:i]), token)
        with FreshContexts(tiny["gpt2"], 2048) as fresh:
            assert assert_reads_match(draft_reads, fresh) > 0  # each row is the window's own


def test_a_draft_sharing_almost_nothing_is_refused_with_the_reason(tiny, models):
    target, draft = models
    alien = Model(tiny["alien"], role="draft")  # CJK characters only, no byte tokens
    try:
        with pytest.raises(IncompatibleError, match=r"shares almost no tokens with target t.gguf \(0 of its 400"):
            VocabBridge(target, alien).check("t.gguf", "d.gguf")
    finally:
        alien.close()
    VocabBridge(target, draft).check("t.gguf", "d.gguf")


def test_a_vocab_only_gguf_is_no_draft(tiny, tmp_path):
    from tinymodels import write_tiny_llama

    vocab_only = write_tiny_llama(tmp_path / "tokenizer.gguf", vocab="gpt2", vocab_only=True)
    with pytest.raises(SpecrunError, match="holds no weights"):
        Session(SessionConfig(target=tiny["target"], draft=vocab_only, n_ctx=128))


# --- the real pair: Gemma 3 270M (SentencePiece, 262k) and SmolLM2-135M (GPT-2 BPE, 49k) ------------
@pytest.mark.gemma
@pytest.mark.smollm2
@pytest.mark.parametrize("direction", ["smollm2 drafts for gemma", "gemma drafts for smollm2"])
@pytest.mark.parametrize("translation", ["text", "tokens"])
def test_real_pair_greedy_output_is_the_targets_argmax_at_micro_batches_of_6(gemma, smollm2, direction, translation):
    """At --ubatch-size 6 batched verification gives one-token decoding's logits on this CPU
    build, so greedy output is plain decoding's token for token, in both directions."""
    target, draft = (gemma, smollm2) if direction.startswith("smollm2") else (smollm2, gemma)
    config = SessionConfig(target=target, draft=draft, k=6, n_ctx=1024, n_ubatch=6, threads=2, translation=translation)
    prompt = "The history of the city begins with a small settlement on the river, where"
    with Session(config) as session:
        plain = session.generate(prompt, max_tokens=40, plain=True)
        drafted = session.generate(prompt, max_tokens=40)
    assert drafted.tokens == plain.tokens
    assert drafted.stats.accepted > 0 and drafted.stats.counters["draft_tokens_reencoded"] > 0


@pytest.mark.gemma
@pytest.mark.smollm2
def test_real_pair_chat_turns_keep_the_drafts_cache_in_its_own_tokens(gemma, smollm2):
    """Gemma's turn markers have no SmolLM2 token: the draft reads them as text; the cache still
    holds the whole conversation, each turn prefilled once."""
    from specrun.chat.formats import choose_format
    from specrun.chat.runner import ChatRunner

    with Session(SessionConfig(target=gemma, draft=smollm2, k=4, n_ctx=1024, threads=2)) as session:
        runner = ChatRunner(session, choose_format(session.target_model, "gemma"), max_tokens=24)
        for message in ("Name three rivers.", "And three mountains?"):
            runner.reply(runner.prepare(message), Quiet())
        history = runner.conversation.tokens
        drafted(session.drafter, history, DraftRequest(1, FixedK(1), GREEDY))
        session.drafter.rollback(history)
        text = bytes(value for token in history for value in session.drafter.bridge.units(token) if value < SPECIAL)
        assert cached_text(session.drafter) == text and b"<start_of_turn>user\nName three rivers." in text
