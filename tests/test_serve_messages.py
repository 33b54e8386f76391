"""Anthropic's Messages API on `specrun serve`, driven by the official anthropic SDK as Claude
Code's clients drive it: create, stream, tools, count_tokens, errors; and the same greedy text
as through chat completions. A tiny generated model behind a Hermes template (Qwen's tool syntax).
The SDK sends no temperature (its 2026 releases take none): the server's own, greedy, serves."""

from __future__ import annotations

import asyncio
import json

import anthropic
import httpx
import pytest
from serve_helpers import RunningServer
from test_serve_tools import HERMES_TEMPLATE, WORD
from tinymodels import write_tiny_llama

from specrun.config import SessionConfig
from specrun.core.events import Stats
from specrun.serve import messages
from specrun.serve.api import GenerationRequest
from specrun.serve.jobs import Finished, Job, Started, Text
from specrun.serve.messages import MessagesShape, parse_messages
from specrun.serve.responses import Outcome
from specrun.serve.server import ServeOptions

KEY = "sekrit"
ASK = [{"role": "user", "content": "what is the weather in the city"}]
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city now.",
    "input_schema": {"type": "object", "properties": {"city": WORD}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = write_tiny_llama(tmp_path_factory.mktemp("messages") / "hermes.gguf", seed=0, chat_template=HERMES_TEMPLATE)
    config = SessionConfig(target=model, lookup=True, k=4, n_ctx=2048, threads=1)
    running = RunningServer(config, ServeOptions(port=0, api_key=KEY))
    yield running
    running.stop()


@pytest.fixture
def client(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=60)


def test_a_message_is_the_chat_completions_greedy_reply(server, client):
    message = client.messages.create(model="any", max_tokens=24, system="Be brief.", messages=ASK)
    openai = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"messages": [{"role": "system", "content": "Be brief."}, *ASK], "max_tokens": 24},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=60,
    ).json()
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == openai["choices"][0]["message"]["content"]
    assert message.stop_reason == {"stop": "end_turn", "length": "max_tokens"}[openai["choices"][0]["finish_reason"]]
    usage = openai["usage"]
    assert (message.usage.input_tokens, message.usage.output_tokens) == (usage["prompt_tokens"], usage["completion_tokens"])


def test_a_stream_sends_the_protocols_events_in_order(client):
    with client.messages.stream(model="any", max_tokens=24, messages=ASK) as stream:
        kinds = [event.type for event in stream if event.type not in ("text", "ping")]  # "text": the SDK's own
        final = stream.get_final_message()
    whole = client.messages.create(model="any", max_tokens=24, messages=ASK)
    deltas = kinds.count("content_block_delta")
    assert kinds == ["message_start", "content_block_start", *["content_block_delta"] * deltas, "content_block_stop"] + [
        "message_delta",
        "message_stop",
    ]
    assert deltas >= 1 and final.content[0].text == whole.content[0].text and final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_a_stop_sequence_is_named_when_it_ends_the_reply(client):
    whole = client.messages.create(model="any", max_tokens=24, messages=ASK).content[0].text
    word = whole.split()[1]
    stopped = client.messages.create(model="any", max_tokens=24, messages=ASK, stop_sequences=[word])
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == word
    assert stopped.content[0].text == whole[: whole.index(word)]


def test_a_tool_is_called_and_its_result_sent_back(client):
    """tool_choice "any": the reply is a tool_use block whose input holds to the schema, streamed
    as input_json deltas; its result goes back as a tool_result block and the model answers."""
    called = client.messages.create(
        model="any", max_tokens=200, messages=ASK, tools=[WEATHER], tool_choice={"type": "any", "disable_parallel_tool_use": True}
    )
    assert called.stop_reason == "tool_use"
    use = next(block for block in called.content if block.type == "tool_use")
    assert use.name == "get_weather" and set(use.input) == {"city"}
    with client.messages.stream(
        model="any", max_tokens=200, messages=ASK, tools=[WEATHER], tool_choice={"type": "any", "disable_parallel_tool_use": True}
    ) as stream:
        deltas = [event.delta.type for event in stream if event.type == "content_block_delta"]
        streamed = stream.get_final_message()
    assert "input_json_delta" in deltas and [b.input for b in streamed.content if b.type == "tool_use"] == [use.input]
    result = [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]
    turns = [*ASK, {"role": "assistant", "content": called.content}, {"role": "user", "content": result}]
    answer = client.messages.create(model="any", max_tokens=16, messages=turns, tools=[WEATHER])
    assert answer.content and answer.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_count_tokens_counts_the_prompt_a_message_runs_on(client):
    counted = client.messages.count_tokens(model="any", system="Be brief.", messages=ASK)
    ran = client.messages.create(model="any", max_tokens=1, system="Be brief.", messages=ASK)
    assert counted.input_tokens == ran.usage.input_tokens > 0
    with_tools = client.messages.count_tokens(model="any", messages=ASK, tools=[WEATHER])
    assert with_tools.input_tokens > client.messages.count_tokens(model="any", messages=ASK).input_tokens


@pytest.mark.parametrize(
    "messages, extra, fragment",
    [
        ([{"role": "user", "content": [{"type": "image", "source": {}}]}], {}, "image blocks are not supported"),
        (
            [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "x"}]}],
            {},
            "no earlier tool_use block has the id 'toolu_1'",
        ),
        (ASK, {"tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
        (
            ASK,
            {"tools": [{**WEATHER, "input_schema": {"type": "object", "properties": {"city": {"not": {}}}}}]},
            "Invalid value for 'tools[0].input_schema'",  # named as sent, not as the chat body it runs as
        ),
        (ASK, {"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "other"}}, "Invalid value for 'tool_choice.name'"),
        (ASK, {"extra_body": {"temperature": -1}}, "temperature"),
        ([{"role": "user", "content": 7}], {}, "messages[0].content"),
    ],
)
def test_bad_requests_are_400s_in_anthropics_envelope(client, messages, extra, fragment):
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="any", max_tokens=8, messages=messages, **extra)
    body = caught.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    assert fragment in body["error"]["message"], body
    assert client.messages.create(model="any", max_tokens=2, messages=ASK).content  # it keeps serving


def test_the_key_goes_in_x_api_key_and_a_wrong_one_is_an_authentication_error(server):
    wrong = anthropic.Anthropic(base_url=server.url, api_key="nope", max_retries=0, timeout=60)
    with pytest.raises(anthropic.AuthenticationError) as caught:
        wrong.messages.create(model="any", max_tokens=2, messages=ASK)
    assert caught.value.body["error"]["type"] == "authentication_error"
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    reply = httpx.post(f"{server.url}/v1/messages", json={"model": "m", "max_tokens": 2, "messages": ASK}, headers=headers)
    assert reply.status_code == 200 and reply.json()["type"] == "message"


def test_claude_codes_requests_translate_without_a_model():
    """What Claude Code sends: a billing header as the first system block (no instruction, and it
    changes between requests), a system message mid-conversation, consecutive user messages (which
    Anthropic combines into one turn, as templates that want turns to alternate need)."""
    body = {
        "model": "claude-opus-4-8",
        "max_tokens": 64000,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197; cch=a5145;"},
            {"type": "text", "text": "Be brief."},
        ],
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "<system-reminder>ctx</system-reminder>"}, {"type": "text", "text": "hi"}],
            },
            {"role": "system", "content": "Agents: none."},
            {"role": "user", "content": "go on"},
        ],
        "thinking": {"type": "adaptive"},
        "context_management": {"edits": []},
        "output_config": {"effort": "high"},
    }
    parsed = parse_messages(json.dumps(body).encode())
    assert parsed.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "<system-reminder>ctx</system-reminder>\nhi\nAgents: none.\ngo on"},
    ]
    assert parsed.max_tokens == 64000 and parsed.up_to_context  # a reply ends when the context fills


def test_a_max_tokens_beyond_the_context_ends_the_reply_when_it_fills(client, server):
    message = client.messages.create(model="any", max_tokens=64000, messages=ASK)
    assert message.stop_reason in ("end_turn", "max_tokens") and message.usage.output_tokens < 2048
    assert httpx.head(f"{server.url}/").status_code == 200  # Claude Code's first request


def test_a_quiet_stream_gets_pings_between_its_events(monkeypatch):
    """A job whose reports come slowly (a long prefill): pings fill the quiet, the events keep their order."""
    monkeypatch.setattr(messages, "PING_S", 0.01)

    async def stream() -> list[str]:
        job = Job(GenerationRequest(messages=ASK), asyncio.get_running_loop())

        async def model() -> None:
            await asyncio.sleep(0.1)
            job.report(Text("hi"))
            await asyncio.sleep(0.1)
            job.report(Finished(Outcome("hi", "stop", 3, Stats(tokens=1))))

        reports = asyncio.ensure_future(model())
        events = [event async for event in MessagesShape("m", job.request).events(job, Started(3))]
        await reports
        return [event.split("\n")[0].removeprefix("event: ") for event in events]

    kinds = asyncio.run(stream())
    assert kinds.count("ping") >= 4, kinds
    assert [kind for kind in kinds if kind != "ping"] == ["message_start"] + [
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
