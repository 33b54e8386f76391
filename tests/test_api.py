"""The public Python API on tiny models: what `import specrun` exports, and that it does what its docs say."""

from __future__ import annotations

import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

import specrun

PROMPT = "the cat sat on the mat and the dog sat on the log , the cat sat on the"
SOURCES = {"draft", "target", "bonus"}


def test_importing_specrun_loads_neither_llama_cpp_nor_numpy():
    heavy = ("numpy", "llama_cpp", "specrun.backend", "specrun.session", "typer", "huggingface_hub", "fastapi")
    code = f"import sys, specrun; print([m for m in {heavy!r} if m in sys.modules])"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=Path(specrun.__file__).parent.parent
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_every_exported_name_resolves():
    for name in specrun.__all__:
        assert getattr(specrun, name) is not None, name
    assert set(specrun.__all__) <= set(dir(specrun))
    with pytest.raises(AttributeError):
        specrun.no_such_name  # noqa: B018


def test_generate_returns_text_tokens_and_stats(tiny):
    with specrun.load(tiny["target"], lookup=True, k=3, n_ctx=256) as session:
        result = session.generate(PROMPT, max_tokens=12)
        assert isinstance(result, specrun.Generation)
        assert len(result.tokens) == result.stats.tokens <= 12
        assert result.text == session.detokenize(result.tokens)
        assert result.stop_reason == result.stats.stop_reason in ("max_tokens", "eog")
        assert result.stats.accepted <= result.stats.drafted


def test_stream_tags_every_token_and_ends_with_done(tiny):
    def load():
        return specrun.load(tiny["target"], draft=tiny["draft"], k=3, n_ctx=256)

    with load() as session:
        events = list(session.stream(PROMPT, max_tokens=16))
        tokens = [e for e in events if isinstance(e, specrun.TokenEvent)]
        steps = [e for e in events if isinstance(e, specrun.StepEvent)]
        assert isinstance(events[-1], specrun.Done) and events[-1].stats.tokens == len(tokens)
        assert {e.source for e in tokens} <= SOURCES
        assert sum(e.accepted for e in steps) == sum(e.source == "draft" for e in tokens)
        assert len(steps) == events[-1].stats.steps
    with load() as session:  # the same run through generate, on the same fresh state: the same tokens
        assert session.generate(PROMPT, max_tokens=16).tokens == [e.token for e in tokens]


def test_plain_k_and_seed_apply_to_one_call(tiny):
    with specrun.load(tiny["target"], lookup=True, k=2, n_ctx=256) as session:
        plain = session.generate(PROMPT, max_tokens=10, plain=True)
        assert plain.stats.drafted == 0 and plain.stats.steps == plain.stats.tokens - 1  # the first came with the prefill
        events = session.stream(PROMPT, max_tokens=10, k=4)
        with closing(events):
            steps = [e for e in events if isinstance(e, specrun.StepEvent)]
        assert max(e.drafted for e in steps) <= 4
        warm = specrun.SamplerSettings(temperature=1.0)
        first = session.generate(PROMPT, max_tokens=10, seed=3, sampler=warm)
        assert session.generate(PROMPT, max_tokens=10, seed=3, sampler=warm).tokens == first.tokens
        assert session.config.sampler.greedy  # the session's own settings are untouched


def test_breaking_out_of_a_stream_leaves_the_session_usable(tiny):
    with specrun.load(tiny["target"], lookup=True, n_ctx=256) as session:
        whole = session.generate(PROMPT, max_tokens=8, k=3)
        with closing(session.stream(PROMPT, max_tokens=8, k=3)) as events:
            for event in events:
                if isinstance(event, specrun.TokenEvent):
                    break
        assert session.generate(PROMPT, max_tokens=8, k=3).tokens == whole.tokens


def test_a_session_config_takes_string_paths(tiny):
    config = specrun.SessionConfig(target=str(tiny["target"]), draft=str(tiny["draft"]), k=2, n_ctx=128)
    assert isinstance(config.target, Path) and isinstance(config.draft, Path)
    with specrun.Session(config) as session:
        assert 1 <= session.generate(PROMPT, max_tokens=4).stats.tokens <= 4


def test_resolve_finds_files_without_loading_them(tiny):
    config = specrun.resolve(str(tiny["target"]), tiny["draft"], lookup=True, k=5)
    assert config.target == Path(tiny["target"]) and config.draft == Path(tiny["draft"])
    assert config.lookup and config.k == 5


@pytest.mark.parametrize(
    "call, error, fragment",
    [
        (lambda t: specrun.load(t["target"], draft=t["alien"], n_ctx=128), specrun.IncompatibleError, "shares almost no tokens"),
        (lambda t: specrun.load(t["target"].parent / "missing.gguf"), specrun.SpecrunError, "no such model file"),
        (lambda t: specrun.load(t["target"], k=0), specrun.SpecrunError, "k has to be an integer >= 1"),
        (lambda t: specrun.load(t["target"], rpc="not an endpoint"), specrun.SpecrunError, "is not HOST:PORT"),
        (lambda t: specrun.load(t["target"], no_such_option=1), TypeError, "no_such_option"),
    ],
)
def test_bad_arguments_raise_one_clear_error(tiny, call, error, fragment):
    with pytest.raises(error, match=fragment):
        call(tiny)


def test_stream_refuses_a_bad_request(tiny):
    with specrun.load(tiny["target"], n_ctx=128) as session:
        with pytest.raises(specrun.SpecrunError, match="max_tokens has to be"):
            session.stream(PROMPT, max_tokens=0)
        with pytest.raises(specrun.SpecrunError, match="the prompt is empty"):
            session.generate("   ")


def test_chat_keeps_the_conversation_and_streams_tagged_text(tiny):
    with specrun.load(tiny["target"], lookup=True, k=3, n_ctx=512) as session:
        chat = specrun.Chat(session, system="Be brief.", max_tokens=12)
        pieces = []
        first = chat.send("the cat sat on the mat", on_text=lambda text, source: pieces.append((text, source)))
        assert isinstance(first, specrun.Reply)
        assert "".join(text for text, _ in pieces) == first.text
        assert {source for _, source in pieces} <= SOURCES
        second = chat.send("and the dog?")
        assert [m["role"] for m in chat.messages] == ["system", "user", "assistant", "user", "assistant"]
        assert chat.messages[-1]["content"] == second.text
        # The second turn did not prefill the whole conversation: the first exchange was still in the cache.
        assert second.stats.prefilled_tokens <= second.stats.prompt_tokens - first.stats.prompt_tokens
        assert chat.totals.tokens == first.stats.tokens + second.stats.tokens
        chat.reset()
        assert [m["role"] for m in chat.messages] == ["system"]


def test_chat_refuses_an_unknown_format(tiny):
    with specrun.load(tiny["target"], n_ctx=128) as session:
        with pytest.raises(specrun.SpecrunError, match="unknown --chat-format"):
            specrun.Chat(session, chat_format="no-such-format")
