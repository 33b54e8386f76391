"""A chat over real tiny models: only each new turn is prefilled, settings change between replies."""

import json

import pytest

from specrun.chat.formats import choose_format
from specrun.chat.reply import Piece
from specrun.chat.runner import ChatRunner
from specrun.config import SessionConfig
from specrun.errors import SpecrunError
from specrun.session import Session


class Quiet:
    def show(self, pieces: list[Piece]) -> None:
        pass

    def step(self, event, stats) -> None:
        pass


@pytest.fixture
def draft_chat(tiny):
    config = SessionConfig(target=tiny["target"], draft=tiny["draft"], k=3, n_ctx=512, threads=1)
    with Session(config) as session:
        yield ChatRunner(session, choose_format(session.target_model, None), max_tokens=12)


def count_decoded(context):
    """Wrap a context's eval to record how many tokens each call decodes."""
    calls = []
    original = context.eval

    def counting(tokens, logits_rows=1):
        calls.append(len(tokens))
        return original(tokens, logits_rows)

    context.eval = counting
    return calls


def test_each_turn_prefills_only_its_new_tokens_in_target_and_draft(draft_chat):
    draft_calls = count_decoded(draft_chat.session.drafter.context)
    messages = ["the cat sat on the mat", "and the dog", "what was it", "the cat again", "and then"]
    for i, message in enumerate(messages):
        previous = draft_chat.conversation.tokens[:]
        turn = draft_chat.prepare(message)
        draft_calls.clear()
        s = draft_chat.reply(turn, Quiet()).stats
        assert s.prompt_tokens == len(turn.tokens)
        if i == 0:
            assert s.prefilled_tokens == len(turn.tokens)  # nothing cached yet
            continue
        assert turn.tokens[: len(previous)] == previous  # the conversation only grows
        assert turn.new_tokens == len(turn.tokens) - len(previous)
        # The cache holds the whole earlier conversation: the new turn (plus the last reply
        # token, which the reply never decoded) is prefilled.
        assert turn.new_tokens <= s.prefilled_tokens <= turn.new_tokens + 1
        assert s.prefilled_tokens < s.prompt_tokens / 2
        # The draft model catches up on the new turn and on the reply's last step (at most
        # k + 1 tokens it never drafted from), not on the whole history; then drafts one token per call.
        assert draft_calls[0] <= turn.new_tokens + draft_chat.policy.max_k + 1
        assert draft_calls[0] < s.prompt_tokens / 2
        assert all(n == 1 for n in draft_calls[1:])


def test_k_and_temperature_change_between_replies(draft_chat):
    draft_chat.set_k("2")
    assert draft_chat.k_label == "2"
    with pytest.raises(SpecrunError, match="k has to be an integer >= 1, 'auto' or 'llama.cpp', but is '0'"):
        draft_chat.set_k("0")
    with pytest.raises(SpecrunError, match="k has to be at most 511"):
        draft_chat.set_k("600")
    draft_chat.set_k("llama.cpp")
    assert draft_chat.k_label == "llama.cpp"
    draft_chat.set_k("2")
    draft_chat.set_temperature(0.7)
    assert draft_chat.sampler.temperature == 0.7
    draft_chat.set_temperature(0)
    with pytest.raises(SpecrunError, match=r"temperature has to be a number >= 0 \(0 is greedy\), but is -1"):
        draft_chat.set_temperature(-1)
    reply = draft_chat.reply(draft_chat.prepare("the cat"), Quiet())
    assert reply.stats.steps >= 1 and len(reply.stats.drafted_by_position) <= 2  # no step drafted more than k


def test_k_needs_a_drafter(tiny):
    with Session(SessionConfig(target=tiny["target"], n_ctx=256, threads=1)) as session:
        runner = ChatRunner(session, choose_format(session.target_model, None), max_tokens=8)
        with pytest.raises(SpecrunError, match="--draft PATH or --lookup"):
            runner.set_k("4")


def test_max_tokens_must_leave_room_for_the_conversation(tiny):
    with Session(SessionConfig(target=tiny["target"], n_ctx=256, threads=1)) as session:
        with pytest.raises(SpecrunError, match=r"max_tokens has to be at most half the context \(128 tokens"):
            ChatRunner(session, choose_format(session.target_model, None), max_tokens=200)


def test_save_writes_the_transcript_with_stats_atomically(draft_chat, tmp_path):
    for message in ("the cat", "the dog"):
        draft_chat.reply(draft_chat.prepare(message), Quiet())
    draft_chat.save(tmp_path / "chat.json")
    draft_chat.save(tmp_path / "chat.md")
    saved = json.loads((tmp_path / "chat.json").read_text())
    assert [t["user"] for t in saved["turns"]] == ["the cat", "the dog"]
    assert saved["turns"][1]["stats"]["prefilled_tokens"] < saved["turns"][1]["stats"]["prompt_tokens"]
    assert saved["session"]["replies"] == 2 and saved["drafter"] == "draft"
    markdown = (tmp_path / "chat.md").read_text()
    assert "**User:** the dog" in markdown and "tok/s" in markdown
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chat.json", "chat.md"]  # no temp files left
    with pytest.raises(SpecrunError, match="does not exist"):
        draft_chat.save(tmp_path / "missing" / "chat.json")


def test_reset_starts_a_new_conversation(draft_chat):
    draft_chat.reply(draft_chat.prepare("the cat"), Quiet())
    draft_chat.reset()
    assert draft_chat.conversation.tokens == [] and draft_chat.replies == []
    turn = draft_chat.prepare("the dog")
    assert turn.new_tokens == len(turn.tokens)  # rendered afresh
    assert len(draft_chat.totals.turns) == 1  # session statistics are kept


def test_sampler_settings_are_validated_before_anything_changes(draft_chat):
    before = draft_chat.sampler
    with pytest.raises(SpecrunError):
        draft_chat.set_temperature(float("nan"))
    assert draft_chat.sampler == before
