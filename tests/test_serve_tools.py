"""Structured output and tool calls through `specrun serve`'s HTTP API: on tiny generated models
behind two chat templates (one with no tool syntax, which gets the generic JSON form, and a
Hermes one, as Qwen's), and on SmolLM2-135M-Instruct through the official openai client.
"""

import json

import httpx
import jsonschema
import pytest
from serve_helpers import RunningServer
from tinymodels import write_tiny_llama

from specrun.config import SessionConfig
from specrun.grammar import schemas as grammar_schemas
from specrun.serve.server import ServeOptions

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
# No tool syntax, and like Gemma's it refuses roles it does not know: tool turns must reach it rewritten.
GENERIC_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}<|{{ m['role'] }}|>{{ m['content'] | trim }}"
    "{{ eos_token }}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
# A Hermes template in the way of Qwen 2.5's: it lists the tools and writes calls and results itself.
HERMES_TEMPLATE = """{% if tools %}<|im_start|>system
{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}

{% endif %}# Tools
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
Call a function as <tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0]['role'] == 'system' %}<|im_start|>system
{{ messages[0]['content'] }}<|im_end|>
{% endif %}{% for m in messages %}{% if m['role'] == 'system' %}{% elif m['role'] == 'tool' %}<|im_start|>user
<tool_response>
{{ m['content'] }}
</tool_response><|im_end|>
{% elif m['tool_calls'] %}<|im_start|>assistant
{% for call in m['tool_calls'] %}<tool_call>
{"name": "{{ call['function']['name'] }}", "arguments": {{ call['function']['arguments'] | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% else %}<|im_start|>{{ m['role'] }}
{{ m['content'] }}<|im_end|>
{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
TEMPLATES = {"generic": GENERIC_TEMPLATE, "hermes": HERMES_TEMPLATE}

WORD = {"type": "string", "pattern": "^[a-z]{1,8}$"}  # short and ASCII: a tiny model's calls end, and read back the same
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city now.",
        "parameters": {
            "type": "object",
            "properties": {"city": WORD, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": WORD}, "required": ["zone"]}},
}
TOOLS = [WEATHER, CLOCK]
ASK = [{"role": "user", "content": "what is the weather in the city"}]
ANSWER = {
    "type": "object",
    "properties": {"word": WORD, "count": {"type": "integer"}, "ok": {"type": "boolean"}},
    "required": ["word", "count", "ok"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """One server per template, over the same tiny weights."""
    root = tmp_path_factory.mktemp("tools")
    running = {}
    for name, template in TEMPLATES.items():
        model = write_tiny_llama(root / f"{name}.gguf", seed=0, chat_template=template)
        config = SessionConfig(target=model, lookup=True, store_tokens=400, k=4, n_ctx=2048, threads=1)
        running[name] = RunningServer(config, ServeOptions(port=0))
    yield running
    for server in running.values():
        server.stop()


@pytest.fixture
def generic(servers):
    return servers["generic"]


def ok(server: RunningServer, path: str, body: dict) -> dict:
    response = server.post(path, json={"max_tokens": 200, "temperature": 0, **body})
    assert response.status_code == 200, response.text
    return response.json()


def events(server: RunningServer, path: str, body: dict) -> list[dict]:
    """The chunks of a streamed request, in order."""
    with httpx.stream(
        "POST", f"{server.url}{path}", json={"max_tokens": 200, "temperature": 0, **body, "stream": True}, timeout=60
    ) as response:
        assert response.status_code == 200
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def assert_valid_call(call: dict, tools: list[dict]) -> dict:
    """An OpenAI tool call of one of `tools`, its arguments JSON text that validates; returns them."""
    assert call["id"].startswith("call_") and call["type"] == "function"
    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in tools}
    assert call["function"]["name"] in schemas
    arguments = json.loads(call["function"]["arguments"])
    jsonschema.validate(arguments, schemas[call["function"]["name"]])
    return arguments


# --- response_format, json_schema, grammar -------------------------------------------------
@pytest.mark.parametrize(
    "path, body",
    [
        (
            CHAT,
            {"messages": ASK, "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}},
        ),
        (
            COMPLETIONS,
            {
                "prompt": "the answer:",
                "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER, "strict": True}},
            },
        ),
        (CHAT, {"messages": ASK, "json_schema": ANSWER}),  # llama-server's
        (COMPLETIONS, {"prompt": "hello world", "json_schema": ANSWER}),
        (CHAT, {"messages": ASK, "response_format": {"type": "json_object", "schema": ANSWER}}),  # llama-server's too
        (COMPLETIONS, {"prompt": "the answer:", "response_format": {"type": "json_object", "schema": ANSWER}}),
    ],
)
def test_a_json_schema_output_parses_and_validates_streamed_or_not(generic, path, body):
    whole = ok(generic, path, body)["choices"][0]
    text = whole["message"]["content"] if path == CHAT else whole["text"]
    assert whole["finish_reason"] == "stop"
    jsonschema.validate(json.loads(text), ANSWER)
    chunks = events(generic, path, body)
    streamed = "".join(
        (c["choices"][0]["delta"].get("content") or "") if path == CHAT else c["choices"][0]["text"]
        for c in chunks
        if c["choices"]
    )
    assert streamed == text


@pytest.mark.parametrize("path, body", [(CHAT, {"messages": ASK}), (COMPLETIONS, {"prompt": "the cat sat"})])
def test_json_mode_gives_a_json_object_and_a_gbnf_grammar_holds_the_output(generic, path, body):
    whole = ok(generic, path, {**body, "response_format": {"type": "json_object"}})["choices"][0]
    if whole["finish_reason"] == "stop":
        assert isinstance(json.loads(whole["message"]["content"] if path == CHAT else whole["text"]), dict)
    held = ok(generic, path, {**body, "grammar": 'root ::= ("yes" | "no") " " [0-9]'})["choices"][0]
    text = held["message"]["content"] if path == CHAT else held["text"]
    assert held["finish_reason"] == "stop" and text[:3] in ("yes", "no ") and text[-1].isdigit()
    text_format = ok(generic, path, {**body, "max_tokens": 8, "response_format": {"type": "text"}, "logprobs": None})
    assert text_format["usage"]["completion_tokens"] >= 1


MINIMUM = {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0}}}
# A keyword no grammar holds, in a tool's arguments too (which are not held to number ranges as MINIMUM's).
NEGATED = {"type": "object", "properties": {"age": {"not": {"type": "null"}}}}
REFUSED = [
    ({"response_format": {"type": "json_object", "schema": MINIMUM}}, "response_format.schema", "'minimum' at $.properties.age"),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": MINIMUM}}},
        "response_format.json_schema.schema",
        "'minimum' at $.properties.age",
    ),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"not": {"type": "null"}}}}},
        "response_format.json_schema.schema",
        "'not'",
    ),
    ({"json_schema": {"type": "string", "format": "email"}}, "json_schema", "'email'"),
    ({"response_format": {"type": "xml"}}, "response_format.type", "'text', 'json_object' or 'json_schema'"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "Missing required parameter"),
    ({"response_format": {"type": "json_object"}, "grammar": 'root ::= "a"'}, "grammar", "only one of"),
    ({"grammar": 'yes ::= "yes"'}, "grammar", "root"),
    ({"grammar": 'root ::= "yes" | ('}, "grammar", "cannot parse"),  # llama.cpp's parser refuses it on the model thread
    ({"logit_bias": {"hello": 10}}, "logit_bias", "names tokens by their ids"),
    ({"logit_bias": [[50, 1, 2]]}, "logit_bias", "[token id, bias]"),
    ({"logit_bias": [[50.5, 1]]}, "logit_bias", "names tokens by their ids"),
    ({"logit_bias": {"50": 150}}, "logit_bias", "from -100 to 100"),
    ({"logit_bias": [[50, True]]}, "logit_bias", "or false to ban"),
    ({"logit_bias": {"50": 1, "99999999": 1}}, "logit_bias", "token ids, from 0 to"),  # found when it runs
    ({"logit_bias": "50"}, "logit_bias", "an object of token ids to biases"),
    ({"n": 2}, "n", "one choice"),
    ({"typical_p": 1.5}, "typical_p", "[0, 1]"),
    ({"xtc_probability": 1.5}, "xtc_probability", "[0, 1]"),
    ({"dry_multiplier": 0.8}, "dry_multiplier", "DRY sampler (0 turns it off)"),
    ({"mirostat": 2}, "mirostat", "Mirostat"),
    ({"dynatemp_range": -0.5}, "dynatemp_range", ">= 0"),
]


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
@pytest.mark.parametrize("extra, param, fragment", REFUSED)
def test_what_the_output_cannot_be_held_to_is_a_400_naming_the_field(generic, path, extra, param, fragment):
    body = {"messages": ASK} if path == CHAT else {"prompt": "hello"}
    response = generic.post(path, json={**body, **extra, "max_tokens": 4})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["param"] == param and fragment in error["message"], error
    assert ok(generic, path, {**body, "max_tokens": 2})["usage"]["completion_tokens"] == 2


CHAT_REFUSED = [
    ({"logprobs": True, "tools": TOOLS}, "logprobs", "unsupported_parameter"),
    ({"top_logprobs": 2}, "top_logprobs", "invalid_value"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "invalid_value"),
    ({"functions": [{"name": "f", "parameters": {}}]}, "functions", "unsupported_parameter"),
    ({"function_call": "auto"}, "function_call", "unsupported_parameter"),
    ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "response_format", "unsupported_parameter"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/a.png"}}]}]},
        "messages[0].content[0]",
        "invalid_value",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]},
        "messages[0].content[0]",
        "invalid_value",
    ),
    ({"messages": [*ASK, {"role": "tool", "content": "sunny"}]}, "messages[1].tool_call_id", "missing_required_parameter"),
    ({"tool_choice": "required"}, "tool_choice", "invalid_value"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice.type", "invalid_value"),
    (
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        "tool_choice.function.name",
        "invalid_value",
    ),
    ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "tool_choice.function", "missing_required_parameter"),
    ({"tools": [{"type": "function", "function": {"name": "get weather"}}]}, "tools[0].function.name", "invalid_value"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name", "invalid_value"),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": NEGATED}}]},
        "tools[0].function.parameters",
        "invalid_value",
    ),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
        "tools[0].function.parameters",
        "invalid_value",
    ),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type", "invalid_value"),
]


@pytest.mark.parametrize("extra, param, code", CHAT_REFUSED)
def test_what_chat_cannot_honour_is_a_400_naming_the_field(generic, extra, param, code):
    response = generic.post(CHAT, json={"messages": ASK, **extra, "max_tokens": 4})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["code"] == code, error
    if param.startswith("messages") and "content" in param:
        assert extra["messages"][0]["content"][0]["type"] in error["message"]  # it names the kind of part


def test_each_tool_schema_is_converted_once_and_one_not_chosen_is_still_checked(generic, monkeypatch):
    converted = []
    convert = grammar_schemas.json_schema_to_gbnf
    monkeypatch.setattr(grammar_schemas, "json_schema_to_gbnf", lambda schema: converted.append(schema) or convert(schema))
    choose = {"type": "function", "function": {"name": "get_time"}}
    ok(generic, CHAT, {"messages": ASK, "tools": TOOLS, "tool_choice": choose, "max_tokens": 4})
    assert len(converted) == 2  # the chosen tool's call, and the other tool alone
    unchosen = {"type": "function", "function": {"name": "f", "parameters": NEGATED}}
    refused = generic.post(CHAT, json={"messages": ASK, "tools": [CLOCK, unchosen], "tool_choice": choose, "max_tokens": 4})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "tools[1].function.parameters"


def test_tokenize_and_detokenize_answer_as_llama_servers(generic):
    """The ids a client needs for logit_bias, and back; bad ids are a 400 and the server goes on."""
    tokens = generic.post("/tokenize", json={"content": "the cat sat"}).json()["tokens"]
    assert tokens and all(isinstance(token, int) for token in tokens)
    text = generic.post("/detokenize", json={"tokens": tokens}).json()["content"]
    assert text == " the cat sat"  # a SentencePiece vocabulary starts a text with a space
    with_start = generic.post("/tokenize", json={"content": "the cat sat", "add_special": True}).json()["tokens"]
    assert len(with_start) == len(tokens) + 1 and with_start[1:] == tokens
    pieces = generic.post("/tokenize", json={"content": "the cat sat", "with_pieces": True}).json()["tokens"]
    assert [piece["id"] for piece in pieces] == tokens and "".join(piece["piece"] for piece in pieces) == text
    split = generic.post("/tokenize", json={"content": "é<s>", "with_pieces": True}).json()["tokens"]
    assert [piece["piece"] for piece in split[1:]] == [[0xC3], [0xA9], "<s>"]  # bytes of a split character as numbers
    as_text = generic.post("/tokenize", json={"content": "é<s>", "parse_special": False}).json()["tokens"]
    assert len(as_text) > len(split) and 1 not in as_text  # "<s>" spelled, not the start token
    lifted = ok(generic, COMPLETIONS, {"prompt": "the cat sat", "max_tokens": 3, "logit_bias": {str(tokens[-1]): 100}})
    assert lifted["choices"][0]["text"] == "".join(piece["piece"] for piece in pieces[-1:]) * 3
    refused = generic.post("/detokenize", json={"tokens": [1, 10**6]})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "tokens[1]"
    assert generic.post("/tokenize", json={"text": "x"}).json()["error"]["param"] == "content"
    assert generic.post("/detokenize", json={"tokens": []}).json() == {"content": ""}


def test_a_logit_bias_lifts_bans_and_is_kept_by_speculation(generic):
    """A bias of 100 makes greedy decoding write one token over and over (which prompt lookup then
    drafts and the target keeps); false bans it, as llama-server's does, in either of its shapes."""
    body = {"prompt": "the cat sat", "max_tokens": 12}
    lifted = ok(generic, COMPLETIONS, {**body, "logit_bias": {"50": 100}})
    text = lifted["choices"][0]["text"]
    assert text and text == text[: len(text) // 12] * 12
    assert lifted["timings"]["draft_n_accepted"] > 0
    banned = ok(generic, COMPLETIONS, {**body, "logit_bias": [[50, False], [51, 100]]})["choices"][0]["text"]
    assert banned and banned == banned[: len(banned) // 12] * 12 and banned != text


def completion_logprobs(server: RunningServer, body: dict) -> tuple[str, dict, list[dict]]:
    """A greedy completion's text and logprobs, whole, and the logprobs of each chunk of it streamed."""
    body = {"prompt": "the cat sat", "max_tokens": 8, "logprobs": 3, **body}
    whole = ok(server, COMPLETIONS, body)["choices"][0]
    chunks = [c["choices"][0]["logprobs"] for c in events(server, COMPLETIONS, {**body, "stream": True}) if c["choices"]]
    return whole["text"], whole["logprobs"], [c for c in chunks if c is not None]


def test_completion_logprobs_give_each_token_its_rows_likeliest_and_stream_as_they_come(generic):
    text, logprobs, chunks = completion_logprobs(generic, {})
    tokens, offsets = logprobs["tokens"], logprobs["text_offset"]
    assert len(tokens) == len(logprobs["token_logprobs"]) == len(logprobs["top_logprobs"]) == 8  # no end of text
    assert offsets[0] == 0 and offsets == sorted(offsets) and offsets[-1] < len(text)
    for chosen, top in zip(logprobs["token_logprobs"], logprobs["top_logprobs"]):
        assert chosen <= 0 and 1 <= len(top) <= 3 and chosen == max(top.values())  # greedy: the argmax
    assert [token for chunk in chunks for token in chunk["tokens"]] == tokens
    assert [offset for chunk in chunks for offset in chunk["text_offset"]] == offsets
    streamed = [lp for chunk in chunks for lp in chunk["token_logprobs"]]
    assert streamed == pytest.approx(logprobs["token_logprobs"], abs=1e-3)  # (the prompt's cache may be reused)


def test_a_stop_string_keeps_the_logprobs_of_the_tokens_before_it(generic):
    text, logprobs, _ = completion_logprobs(generic, {})
    tokens, offsets = logprobs["tokens"], logprobs["text_offset"]
    cut = next(
        i for i, token in enumerate(tokens) if i and len(token) > 1 and token.isprintable() and token not in text[: offsets[i]]
    )
    stopped, kept, chunks = completion_logprobs(generic, {"stop": [tokens[cut]]})
    assert stopped == text[: offsets[cut]]
    assert kept["tokens"] == tokens[:cut] and kept["text_offset"] == offsets[:cut]
    assert [token for chunk in chunks for token in chunk["tokens"]] == tokens[:cut]


def test_chat_logprobs_carry_each_tokens_bytes_and_alternatives(generic):
    choice = ok(generic, CHAT, {"messages": ASK, "max_tokens": 8, "logprobs": True, "top_logprobs": 2})["choices"][0]
    content = choice["logprobs"]["content"]
    assert set(content[0]) == {"token", "logprob", "bytes", "top_logprobs"} and choice["logprobs"]["refusal"] is None
    assert all(len(entry["top_logprobs"]) == 2 and entry["top_logprobs"][0]["logprob"] == entry["logprob"] for entry in content)
    assert (
        bytes(b for entry in content for b in entry["bytes"]).decode("utf-8", "replace").startswith(choice["message"]["content"])
    )
    assert ok(generic, CHAT, {"messages": ASK, "max_tokens": 2})["choices"][0]["logprobs"] is None


def test_ignore_eos_writes_to_max_tokens_under_speculation(generic):
    """The end of text is banned, as llama-server's ignore_eos does; the samplers specrun does not
    run are served where they are off."""
    body = {"prompt": "the cat sat", "max_tokens": 300, "typical_p": 1.0, "dry_multiplier": 0, "top_n_sigma": -1}
    ended = ok(generic, COMPLETIONS, body)
    assert ended["choices"][0]["finish_reason"] == "stop" and ended["usage"]["completion_tokens"] < 300
    running = ok(generic, COMPLETIONS, {**body, "ignore_eos": True})
    assert running["choices"][0]["finish_reason"] == "length" and running["usage"]["completion_tokens"] == 300
    assert running["choices"][0]["text"].startswith(ended["choices"][0]["text"])
    assert running["timings"]["draft_n_accepted"] > 0  # drafted by lookup, the ban in every verified row


def test_xtc_that_always_fires_moves_greedy_off_the_argmax(generic):
    body = {"prompt": "the cat sat", "max_tokens": 12, "ignore_eos": True}
    greedy = ok(generic, COMPLETIONS, body)["choices"][0]["text"]
    thinned = ok(generic, COMPLETIONS, {**body, "xtc_probability": 1.0, "xtc_threshold": 0.01})["choices"][0]["text"]
    again = ok(generic, COMPLETIONS, {**body, "xtc_probability": 1.0, "xtc_threshold": 0.01})["choices"][0]["text"]
    assert thinned != greedy and thinned == again  # always firing, greedy stays deterministic


def test_fields_that_ask_for_nothing_are_served(generic):
    refused = generic.post(COMPLETIONS, json={"prompt": "hello", "logprobs": 21}).json()["error"]
    assert refused["param"] == "logprobs" and refused["code"] == "invalid_value"
    nothing = {
        "logprobs": False,
        "logit_bias": {},
        "tools": [],
        "tool_choice": "none",
        "functions": [],
        "response_format": {"type": "text"},
        "parallel_tool_calls": True,
    }
    reply = ok(generic, CHAT, {"messages": ASK, "max_tokens": 3, **nothing})["choices"][0]
    assert "tool_calls" not in reply["message"] and isinstance(reply["message"]["content"], str)


# --- tool calls ------------------------------------------------------------------------------
@pytest.mark.parametrize("form", TEMPLATES)
def test_a_required_call_parses_and_validates_and_streams_in_openais_order(servers, form):
    body = {"messages": ASK, "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False}
    choice = ok(servers[form], CHAT, body)["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert_valid_call(call, TOOLS)
    chunks = events(servers[form], CHAT, body)
    pieces = [p for c in chunks if c["choices"] for p in c["choices"][0]["delta"].get("tool_calls", ())]
    first, *rest = pieces
    assert first["index"] == 0 and first["id"].startswith("call_") and first["type"] == "function"
    assert first["function"] == {"name": call["function"]["name"], "arguments": ""}
    assert rest and all(set(p) == {"index", "function"} and set(p["function"]) == {"arguments"} for p in rest)
    assert "".join(p["function"]["arguments"] for p in rest) == call["function"]["arguments"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert not any(c["choices"][0]["delta"].get("content") for c in chunks if c["choices"])


@pytest.mark.parametrize("form", TEMPLATES)
def test_a_named_tool_is_the_one_called_and_parallel_calls_each_validate(servers, form):
    named = {"type": "function", "function": {"name": "get_time"}}
    choice = ok(servers[form], CHAT, {"messages": ASK, "tools": TOOLS, "tool_choice": named})["choices"][0]
    calls = choice["message"]["tool_calls"]
    assert calls and all(call["function"]["name"] == "get_time" for call in calls)
    complete = calls if choice["finish_reason"] == "tool_calls" else calls[:-1]  # a reply cut by max_tokens ends mid-call
    for call in complete:
        assert_valid_call(call, TOOLS)
    assert len({call["id"] for call in calls}) == len(calls)
    streamed: dict[int, list[str]] = {}  # index -> [name, arguments]
    for chunk in events(servers[form], CHAT, {"messages": ASK, "tools": TOOLS, "tool_choice": named}):
        for piece in chunk["choices"][0]["delta"].get("tool_calls", ()) if chunk["choices"] else ():
            streamed.setdefault(piece["index"], [piece["function"].get("name"), ""])
            streamed[piece["index"]][1] += piece["function"]["arguments"]
    assert [streamed[i] for i in sorted(streamed)] == [[c["function"]["name"], c["function"]["arguments"]] for c in calls]


@pytest.mark.parametrize("form", TEMPLATES)
def test_tool_choice_none_answers_in_text_and_auto_in_text_or_valid_calls(servers, form):
    none = ok(servers[form], CHAT, {"messages": ASK, "tools": TOOLS, "tool_choice": "none", "max_tokens": 12})["choices"][0]
    assert "tool_calls" not in none["message"] and none["finish_reason"] in ("stop", "length")
    auto = ok(servers[form], CHAT, {"messages": ASK, "tools": TOOLS, "parallel_tool_calls": False})["choices"][0]
    message = auto["message"]
    if auto["finish_reason"] == "tool_calls":
        (call,) = message["tool_calls"]
        assert_valid_call(call, TOOLS)
    else:
        assert "tool_calls" not in message and message["content"] is not None
        assert "<tool_call>" not in message["content"] and '{"tool_calls"' not in message["content"]


@pytest.mark.parametrize("form", TEMPLATES)
def test_a_history_with_calls_and_results_is_rendered_as_the_model_wrote_it(servers, form):
    server = servers[form]
    body = {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False}
    first = ok(server, CHAT, {"messages": ASK, **body})
    (call,) = first["choices"][0]["message"]["tool_calls"]
    messages = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": '{"sky": "sunny"}'},
        {"role": "tool", "tool_call_id": call["id"], "content": "and warm"},
    ]
    second = ok(server, CHAT, {"messages": messages, **body})
    assert_valid_call(second["choices"][0]["message"]["tool_calls"][0], TOOLS)
    # The call went back in as the model wrote it: all of the first request is cached, only the results are new.
    cached = first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"] - 2
    assert second["timings"]["cache_n"] >= cached, (second["timings"], first["usage"])
    after = ok(server, CHAT, {"messages": [*messages, {"role": "user", "content": "and so"}], "max_tokens": 8})
    assert "tool_calls" not in after["choices"][0]["message"]


# --- the official client on a real model ------------------------------------------------------
CITY_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city's name"}},
            "required": ["city"],
        },
    },
}


@pytest.mark.smollm2
def test_the_openai_client_calls_a_tool_and_answers_from_its_result_on_smollm2(smollm2):
    running = RunningServer(SessionConfig(target=smollm2, lookup=True, k=4, n_ctx=2048, threads=2))
    try:
        client = running.client()
        messages = [{"role": "user", "content": "What is the weather like in Paris today?"}]
        # One call: given the choice, a 135M model calls again and again.
        asked = client.chat.completions.create(
            model="any",
            messages=messages,
            tools=[CITY_WEATHER],
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=64,
            temperature=0,
        )
        choice = asked.choices[0]
        assert choice.finish_reason == "tool_calls"
        (call,) = choice.message.tool_calls
        assert call.id.startswith("call_") and call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), CITY_WEATHER["function"]["parameters"])
        messages += [
            choice.message,
            {
                "role": "tool",
                "tool_call_id": call.id,
                "content": json.dumps({"city": "Paris", "sky": "sunny", "temperature_c": 21}),
            },
        ]
        answered = client.chat.completions.create(
            model="any", messages=messages, tools=[CITY_WEATHER], max_tokens=96, temperature=0
        )
        final = answered.choices[0]
        assert final.finish_reason == "stop" and not final.message.tool_calls and final.message.content.strip()
    finally:
        running.stop()
