"""Each sampler setting reaches `SamplerSettings` with its own meaning, from the CLI's options,
the server's request fields and the library alike.

The settings' types and ranges are tested elsewhere; a mapping that swapped two of them (--typical
feeding top_n_sigma, a request's dynatemp_exponent feeding dynatemp_range) would pass those. Here
each setting gets a value no other field has, through the real command line (`run_app`, up to the
`resolve` every command calls) and the real server (HTTP, up to the `Session.engine` the worker
calls), so a swap between any two fields fails. Then, on the tiny model, a value that changes the
output changes it the same way through `specrun generate --json`, `/v1/completions` and
`Session.generate`, with the same seed.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pytest
from serve_helpers import RunningServer

import specrun
from specrun.cli import run_app
from specrun.config import SessionConfig
from specrun.core.events import TokenEvent
from specrun.core.sampling import SamplerSettings
from specrun.serve.server import ServeOptions
from specrun.session import Session

# Every SamplerSettings field: its CLI option, its request field, and a value no other field has
# (and none has by default), so that a swap between any two fields shows.
MAPPING: dict[str, tuple[str, str, Any]] = {
    "temperature": ("--temp", "temperature", 0.7),
    "top_k": ("--top-k", "top_k", 17),
    "top_p": ("--top-p", "top_p", 0.83),
    "min_p": ("--min-p", "min_p", 0.07),
    "seed": ("--seed", "seed", 1234),
    "repeat_penalty": ("--repeat-penalty", "repeat_penalty", 1.11),
    "frequency_penalty": ("--frequency-penalty", "frequency_penalty", 0.31),
    "presence_penalty": ("--presence-penalty", "presence_penalty", 0.42),
    "repeat_last_n": ("--repeat-last-n", "repeat_last_n", 23),
    "logit_bias": ("--logit-bias", "logit_bias", {301: 1.5, 302: -math.inf}),
    "ignore_eos": ("--ignore-eos", "ignore_eos", True),
    "xtc_probability": ("--xtc-probability", "xtc_probability", 0.27),
    "xtc_threshold": ("--xtc-threshold", "xtc_threshold", 0.19),
    "dynatemp_range": ("--dynatemp-range", "dynatemp_range", 0.55),
    "dynatemp_exponent": ("--dynatemp-exp", "dynatemp_exponent", 1.6),
    "top_n_sigma": ("--top-nsigma", "top_n_sigma", 2.3),
    "typical_p": ("--typical", "typical_p", 0.88),
}
DISTINCT = {name: value for name, (_, _, value) in MAPPING.items()}
PROMPT = "the cat sat on the mat and the dog sat on the log , the cat sat on the"
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


def cli_args(settings: dict[str, Any]) -> list[str]:
    """The command line that asks for `settings` (SamplerSettings' names), as a user writes it."""
    args = []
    for name, value in settings.items():
        option = MAPPING[name][0]
        if name == "logit_bias":  # llama.cpp's TOKEN_ID+BIAS / TOKEN_ID-inf, once per token
            args += [part for token, bias in value.items() for part in (option, f"{token}{bias:+g}")]
        elif name == "ignore_eos":
            args += [option] if value else []
        else:
            args += [option, str(value)]
    return args


def request_fields(settings: dict[str, Any]) -> dict[str, Any]:
    """The request body's fields that ask for `settings`, as a client sends them (JSON has no -inf:
    false bans a token, as llama-server's does)."""
    fields = {}
    for name, value in settings.items():
        if name == "logit_bias":
            value = {str(token): False if bias == -math.inf else bias for token, bias in value.items()}
        fields[MAPPING[name][1]] = value
    return fields


# --- the mapping, field by field ------------------------------------------------------------------
def test_the_table_names_every_field_with_a_value_of_its_own():
    """What makes a swap show: every field is here, and no two share a value (nor a default)."""
    assert set(MAPPING) == {f.name for f in dataclasses.fields(SamplerSettings)}
    defaults = SamplerSettings()
    for name, value in DISTINCT.items():
        assert value != getattr(defaults, name), name
        assert [other for other, theirs in DISTINCT.items() if theirs == value] == [name]
    SamplerSettings(**DISTINCT)  # each value is one the library takes


class Captured(Exception):
    """Raised where a command hands its settings to the library, so nothing loads."""


@pytest.fixture
def resolved(monkeypatch) -> list[SamplerSettings]:
    """The sampler settings each command passes to `resolve` (which then stops the command)."""
    seen: list[SamplerSettings] = []

    def capture(target, draft, **options):
        seen.append(options["sampler"])
        raise Captured

    monkeypatch.setattr("specrun.cli.options.resolve", capture)
    return seen


COMMANDS = {  # each command's arguments before the shared options, up to where it resolves the models
    "generate": ["generate", "x"],
    "chat": ["chat"],
    "serve": ["serve", "--port", "0"],
    "bench": ["bench", "--methods", "plain", "--max-tokens", "4"],
}


def cli_sampler(resolved: list[SamplerSettings], command: str, args: list[str]) -> SamplerSettings:
    with pytest.raises(Captured):
        run_app([*COMMANDS[command], "--target", "tiny.gguf", *args])
    return resolved.pop()


@pytest.mark.parametrize("command", COMMANDS)
def test_no_sampler_option_gives_the_librarys_defaults(resolved, command):
    assert cli_sampler(resolved, command, []) == SamplerSettings()


@pytest.mark.parametrize("name", MAPPING)
def test_each_cli_option_sets_its_own_field_and_no_other(resolved, name):
    settings = {name: DISTINCT[name]}
    assert cli_sampler(resolved, "generate", cli_args(settings)) == SamplerSettings(**settings)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_cli_option_at_once_lands_each_in_its_field(resolved, command):
    assert cli_sampler(resolved, command, cli_args(DISTINCT)) == SamplerSettings(**DISTINCT)


@pytest.fixture(scope="module")
def asked() -> list[SamplerSettings]:
    """The sampler settings the server's worker asks `Session.engine` for, a generation each."""
    return []


@pytest.fixture(scope="module")
def server(tiny, asked):
    """A plain-decoding server on the tiny target that records what each generation was asked to sample with."""
    config = SessionConfig(target=tiny["target"], n_ctx=256, threads=1)

    def open_session() -> Session:
        session = Session(config)
        make_engine = session.engine

        def recording(**kwargs):
            asked.append(kwargs["sampler"])
            return make_engine(**kwargs)

        session.engine = recording
        return session

    running = RunningServer(config, ServeOptions(port=0), open_session=open_session)
    yield running
    running.stop()


def served_sampler(server: RunningServer, asked: list[SamplerSettings], path: str, settings: dict[str, Any]) -> SamplerSettings:
    """The settings a request with `settings`' fields ran with (the server's own are the defaults)."""
    text = {"messages": [{"role": "user", "content": "hi"}]} if path == CHAT else {"prompt": "hi"}
    response = server.post(path, json={**text, "max_tokens": 1, **request_fields(settings)})
    assert response.status_code == 200, response.text
    return asked.pop()


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS], ids=["chat", "completions"])
@pytest.mark.parametrize("name", MAPPING)
def test_each_request_field_sets_its_own_field_and_no_other(server, asked, path, name):
    settings = {name: DISTINCT[name]}
    assert served_sampler(server, asked, path, settings) == SamplerSettings(**settings)


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS], ids=["chat", "completions"])
def test_every_request_field_at_once_lands_each_in_its_field(server, asked, path):
    assert served_sampler(server, asked, path, {}) == SamplerSettings()
    assert served_sampler(server, asked, path, DISTINCT) == SamplerSettings(**DISTINCT)


# --- the same output through the CLI, the API and the library -----------------------------------
SEED = 2  # one at which every case below changes the output, each in its own way
HOT, WARM = {"temperature": 1.5}, {"temperature": 0.7}
# (setting, the settings its value changes, its value): settings under which the value has an
# effect, as the dynamic temperature's exponent needs its range and XTC's threshold its probability.
CASES = [
    ("temperature", {}, {"temperature": 1.0}),
    ("top_k", HOT, {"top_k": 2}),
    ("top_p", HOT, {"top_p": 0.3}),
    ("min_p", HOT, {"min_p": 0.3}),
    ("typical_p", HOT, {"typical_p": 0.3}),
    ("top_n_sigma", HOT, {"top_n_sigma": 0.5}),
    ("seed", HOT, {"seed": 14}),
    ("xtc_probability", {"temperature": 1.0, "xtc_threshold": 0.05}, {"xtc_probability": 1.0}),
    ("xtc_threshold", {"temperature": 1.0, "xtc_probability": 1.0}, {"xtc_threshold": 0.02}),
    ("dynatemp_range", {"temperature": 1.0}, {"dynatemp_range": 0.9}),
    ("dynatemp_exponent", {"temperature": 1.0, "dynatemp_range": 0.9}, {"dynatemp_exponent": 4.0}),
    ("repeat_penalty", WARM, {"repeat_penalty": 1.3}),
    ("frequency_penalty", WARM, {"frequency_penalty": 0.6}),
    ("presence_penalty", WARM, {"presence_penalty": 1.8}),
    ("repeat_last_n", {**WARM, "frequency_penalty": 1.5}, {"repeat_last_n": 3}),
    ("logit_bias", {}, {"logit_bias": {572: -math.inf, 310: 3.0}}),  # 572: greedy's first token
    ("ignore_eos", {"logit_bias": {2: 8.0}}, {"ignore_eos": True}),  # the bias ends the text at once
]
N = 12


@pytest.fixture(scope="module")
def session(tiny):
    with specrun.load(tiny["target"], n_ctx=256, threads=1) as session:
        yield session


def library_text(session: Session, settings: dict[str, Any]) -> str:
    return session.generate(PROMPT, N, sampler=SamplerSettings(**{"seed": SEED, **settings})).text


def streamed_text(session: Session, settings: dict[str, Any]) -> str:
    """The text `Session.stream`'s events carry, as the server sends it: unlike `generate`'s, it
    leaves out a character the generation's end cut inside its bytes (the tiny model writes byte tokens)."""
    events = session.stream(PROMPT, N, sampler=SamplerSettings(**{"seed": SEED, **settings}))
    return "".join(event.text for event in events if isinstance(event, TokenEvent))


def test_no_two_cases_give_one_text(session):
    """What lets the next test tell one setting's effect from another's."""
    changed = {library_text(session, {**base, **value}) for _, base, value in CASES}
    assert len(changed) == len(CASES)


@pytest.mark.parametrize("name, base, value", CASES, ids=[case[0] for case in CASES])
def test_a_setting_changes_the_output_the_same_way_through_cli_api_and_library(tiny, session, server, capsys, name, base, value):
    settings = {"seed": SEED, **base, **value}
    expected = library_text(session, settings)
    capsys.readouterr()
    argv = ["generate", PROMPT, "--target", str(tiny["target"]), "--ctx-size", "256", "--threads", "1", "-n", str(N), "--json"]
    assert run_app([*argv, *cli_args(settings)]) == 0
    assert json.loads(capsys.readouterr().out)["text"] == expected
    response = server.post(COMPLETIONS, json={"prompt": PROMPT, "max_tokens": N, **request_fields(settings)})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"] == streamed_text(session, settings)
    assert expected != library_text(session, base)  # the value changed the text
