"""OpenAI's Responses API on `specrun serve`, driven by the official openai SDK as Codex CLI and
the SDK's examples drive it: create, stream, function tools and their outputs, previous_response_id,
text formats, errors; and the same greedy text as through chat completions. A tiny generated
model behind a Hermes template (Qwen's tool syntax)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from serve_helpers import RunningServer
from test_serve_tools import HERMES_TEMPLATE, WORD
from tinymodels import write_tiny_llama

from specrun.config import SessionConfig
from specrun.core.events import Stats
from specrun.serve.responses import Outcome
from specrun.serve.responses_api import ResponsesShape
from specrun.serve.responses_request import ResponseStore, parse_responses
from specrun.serve.server import ServeOptions
from specrun.serve.tool_calls import ToolCall

KEY = "sekrit"
ASK = "what is the weather in the city"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"city": WORD}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = write_tiny_llama(tmp_path_factory.mktemp("responses") / "hermes.gguf", seed=0, chat_template=HERMES_TEMPLATE)
    config = SessionConfig(target=model, lookup=True, k=4, n_ctx=2048, threads=1)
    running = RunningServer(config, ServeOptions(port=0, api_key=KEY))
    yield running
    running.stop()


@pytest.fixture
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=60)


def chat_reply(client: openai.OpenAI, messages: list[dict], max_tokens: int) -> str | None:
    return client.chat.completions.create(model="any", messages=messages, max_tokens=max_tokens).choices[0].message.content


def test_a_response_is_the_chat_completions_greedy_reply(client):
    response = client.responses.create(model="any", instructions="Be brief.", input=ASK, max_output_tokens=24)
    chat = client.chat.completions.create(
        model="any", messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": ASK}], max_tokens=24
    )
    assert response.object == "response" and response.id.startswith("resp_")
    assert [item.type for item in response.output] == ["message"]
    assert response.output_text == chat.choices[0].message.content
    assert response.status == {"stop": "completed", "length": "incomplete"}[chat.choices[0].finish_reason]
    assert (response.usage.input_tokens, response.usage.output_tokens) == (chat.usage.prompt_tokens, chat.usage.completion_tokens)
    assert response.instructions == "Be brief." and response.max_output_tokens == 24


def test_a_stream_sends_the_protocols_events_in_order(client):
    """At the length limit the last event is response.incomplete, as OpenAI's (the SDK's
    get_final_response then raises, as it does against OpenAI)."""
    whole = client.responses.create(model="any", input=ASK, max_output_tokens=8)
    with client.responses.stream(model="any", input=ASK, max_output_tokens=8) as stream:
        events = list(stream)
    kinds = [event.type for event in events]
    deltas = kinds.count("response.output_text.delta")
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        f"response.{whole.status}",
    ]
    assert deltas >= 1 and events[-1].response.output_text == whole.output_text
    assert "".join(event.delta for event in events if event.type == "response.output_text.delta") == whole.output_text
    assert [event.sequence_number for event in events] == list(range(len(events)))


def test_the_length_limit_makes_an_incomplete_response(client):
    response = client.responses.create(model="any", input=ASK, max_output_tokens=2)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 2


def test_a_function_is_called_and_its_output_sent_back(client):
    """tool_choice "required": the reply is a function_call item whose arguments hold to the schema,
    streamed as argument deltas; its output goes back as a function_call_output item."""
    called = client.responses.create(
        model="any", input=ASK, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False, max_output_tokens=200
    )
    call = next(item for item in called.output if item.type == "function_call")
    assert call.name == "get_weather" and set(json.loads(call.arguments)) == {"city"}
    with client.responses.stream(
        model="any", input=ASK, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False, max_output_tokens=200
    ) as stream:
        kinds = [event.type for event in stream]
        streamed = stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    assert [item.arguments for item in streamed.output if item.type == "function_call"] == [call.arguments]
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    items = [{"role": "user", "content": ASK}, call.model_dump(exclude_none=True), output]
    answer = client.responses.create(model="any", input=items, tools=[WEATHER], max_output_tokens=16)
    assert answer.output and answer.status in ("completed", "incomplete")


def test_previous_response_id_continues_the_conversation_from_its_cache(client):
    """The next turn's prompt reuses what the first left in the cache (the prompt itself is checked
    without a model below)."""
    first = client.responses.create(model="any", input=ASK, max_output_tokens=12)
    second = client.responses.create(model="any", previous_response_id=first.id, input="and tomorrow", max_output_tokens=12)
    assert second.usage.input_tokens > first.usage.input_tokens + 4
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
    assert second.previous_response_id == first.id
    assert client.responses.retrieve(second.id).output_text == second.output_text


def test_a_response_sent_with_store_false_is_not_kept(client):
    unkept = client.responses.create(model="any", input=ASK, max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unkept.id)
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="any", previous_response_id=unkept.id, input="more", max_output_tokens=2)
    assert caught.value.body["param"] == "previous_response_id"
    assert "Send the whole conversation in 'input' instead" in caught.value.body["message"]


def test_a_json_schema_text_format_holds_the_reply(client):
    schema = {"type": "object", "properties": {"city": WORD}, "required": ["city"], "additionalProperties": False}
    response = client.responses.create(
        model="any",
        input=ASK,
        max_output_tokens=200,
        text={"format": {"type": "json_schema", "name": "place", "schema": schema, "strict": True}},
    )
    assert set(json.loads(response.output_text)) == {"city"}


@pytest.mark.parametrize(
    "extra, fragment",
    [
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input_image parts are not"),
        (
            {"input": [{"type": "function_call_output", "call_id": "call_1", "output": "x"}]},
            "no earlier function_call item has the call_id 'call_1'",
        ),
        ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "'web_search_call' items are not supported"),
        ({"input": ASK, "previous_response_id": "resp_nope"}, "Response with id 'resp_nope' not found"),
        ({"input": ASK, "background": True}, "Unsupported parameter: 'background'"),
        ({"input": ASK, "tools": [WEATHER], "tool_choice": {"type": "function", "name": "other"}}, "'tool_choice.name'"),
        ({"input": ASK, "temperature": -1}, "temperature"),
        ({"input": ASK, "max_output_tokens": 0}, "'max_output_tokens'"),
        ({"input": 7}, "Invalid type for 'input'"),
    ],
)
def test_bad_requests_are_400s_in_openais_error_object(client, extra, fragment):
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="any", max_output_tokens=extra.pop("max_output_tokens", 8), **extra)
    body = caught.value.body
    assert body["type"] == "invalid_request_error" and fragment in body["message"], body
    assert client.responses.create(model="any", input=ASK, max_output_tokens=2).output  # it keeps serving


def test_a_wrong_key_is_refused(server):
    wrong = openai.OpenAI(base_url=f"{server.url}/v1", api_key="nope", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError):
        wrong.responses.create(model="any", input=ASK)
    assert httpx.get(f"{server.url}/v1/responses/resp_x", headers={"Authorization": f"Bearer {KEY}"}).status_code == 404


def test_input_items_become_chat_turns_without_a_model():
    """Consecutive assistant items are one turn, as chat templates expect; other tools are left out."""
    body = {
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": "hi"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "let me look"}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
            {"type": "reasoning", "summary": []},
            {"type": "function_call_output", "call_id": "call_1", "output": [{"type": "input_text", "text": "sunny"}]},
        ],
        "tools": [WEATHER, {"type": "web_search"}],
        "max_output_tokens": 9,
    }
    parsed = parse_responses(json.dumps(body).encode(), ResponseStore())
    assert parsed.request.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "let me look",
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
    ]
    assert [tool["function"]["name"] for tool in parsed.request.tools.tools] == ["get_weather"]
    assert parsed.request.max_tokens == 9 and parsed.turns == parsed.request.messages[1:]


def test_previous_response_id_prompts_as_the_whole_conversation_without_a_model():
    """The earlier turns and the reply come back, and the earlier instructions do not (as OpenAI's)."""
    store = ResponseStore()
    first = parse_responses(json.dumps({"instructions": "Old.", "input": "hi"}).encode(), store)
    call = ToolCall("call_7", "get_weather", '{"city": "Oslo"}')
    outcome = Outcome("let me look", "tool_calls", 9, Stats(), (call,))
    body = ResponsesShape("m", first, store).response(outcome)
    follow_up = {"instructions": "New.", "previous_response_id": body["id"], "tools": [WEATHER]}
    follow_up["input"] = [{"type": "function_call_output", "call_id": "call_7", "output": "sunny"}]
    second = parse_responses(json.dumps(follow_up).encode(), store)
    assert second.request.messages == [
        {"role": "system", "content": "New."},
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "let me look",
            "tool_calls": [
                {"id": "call_7", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "call_7"},
    ]
    assert [item["type"] for item in body["output"]] == ["message", "function_call"]
    assert body["output"][1]["call_id"] == "call_7" and body["status"] == "completed"
