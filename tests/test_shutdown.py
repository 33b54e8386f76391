"""Shutdown order: generators are closed (and roll back) before their caches are freed, and
a freed model or context refuses calls instead of touching freed memory."""

import pytest
from test_engine import PROMPT

from specrun.backend import Closed, Context, ContextOptions, Model
from specrun.cli import run_app
from specrun.config import SessionConfig
from specrun.core.events import TokenEvent
from specrun.session import Session


def test_a_closed_context_refuses_every_call(tiny):
    model = Model(tiny["target"])
    context = Context(model, ContextOptions(n_ctx=64))
    context.eval(model.tokenize("the cat"))
    context.close()
    context.close()  # twice is fine
    for call in (
        lambda: context.eval([5]),
        lambda: context.truncate(0),
        lambda: context.logits(1),
        lambda: context.reuse_prefix([9]),
    ):
        with pytest.raises(Closed, match="target model's context was closed"):
            call()
    model.close()


def test_closing_a_model_closes_its_contexts_first_and_then_refuses_calls(tiny):
    model = Model(tiny["target"])
    contexts = [Context(model, ContextOptions(n_ctx=64)) for _ in range(2)]
    model.close()
    assert model.closed and all(context.closed for context in contexts)
    for call in (
        lambda: model.tokenize("the"),
        lambda: model.bos,
        lambda: model.vocab_facts(),
        lambda: Context(model, ContextOptions(n_ctx=64)),
        lambda: contexts[0].eval([5]),
    ):
        with pytest.raises(Closed):
            call()


def test_a_generator_outliving_its_session_neither_crashes_nor_generates(tiny):
    session = Session(SessionConfig(target=tiny["target"], draft=tiny["draft"], k=3, n_ctx=128))
    events = session.stream(PROMPT, 20)
    assert any(isinstance(next(events), TokenEvent) for _ in range(4))
    session.close()
    with pytest.raises(Closed):
        next(events)  # the next step's decode would use the freed cache
    events.close()  # and its rollback is skipped: nothing left to roll back


@pytest.fixture
def rollbacks(monkeypatch):
    """Ctrl-C in the 4th decode of the target's cache (the 3rd step); record, for every truncation
    of a cache (which is how the engine rolls back), whether that cache was still open."""
    seen, decodes = [], []
    evaluate, truncate = Context.eval, Context.truncate

    def interrupted_eval(self, tokens, logits_rows=1):
        if self.model.role == "target":
            decodes.append(len(tokens))
            if len(decodes) == 4:
                raise KeyboardInterrupt
        return evaluate(self, tokens, logits_rows)

    def recording_truncate(self, n_keep):
        seen.append(self.closed)
        return truncate(self, n_keep)

    monkeypatch.setattr(Context, "eval", interrupted_eval)
    monkeypatch.setattr(Context, "truncate", recording_truncate)
    return seen


@pytest.mark.parametrize(
    "command",
    [
        ["generate", "the cat sat on the", "--draft", "{draft}", "--k", "2", "-n", "20", "--ctx-size", "128"],
        ["bench", "{prompts}", "--methods", "plain,lookup", "--k", "2", "-n", "20", "--warmup", "0", "--ctx-size", "128"],
    ],
)
def test_ctrl_c_rolls_back_before_the_caches_are_freed(tiny, tmp_path, rollbacks, capsys, command):
    prompts = tmp_path / "p.txt"
    prompts.write_text(PROMPT + "\n")
    argv = [arg.format(draft=tiny["draft"], prompts=prompts) for arg in command]
    assert run_app([*argv, "--target", str(tiny["target"])]) == 130
    assert "interrupted" in capsys.readouterr().err
    assert rollbacks and not any(rollbacks)  # every rollback ran on open caches, the interrupted one too
