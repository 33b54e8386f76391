"""A reasoning model's thinking apart from its answer, on every chat route: OpenAI's
`reasoning_content`, Anthropic's thinking blocks, the Responses API's reasoning items; and the
reader that tells them apart as the text streams."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest
from serve_helpers import RunningServer
from tinymodels import write_tiny_llama

from specrun.config import SessionConfig
from specrun.serve.reasoning import ReasoningReader, Thought, opens_thinking, thinks
from specrun.serve.server import ServeOptions

# ChatML whose cue opens a reasoning block, as DeepSeek-R1's and Qwen3's thinking templates do
# ({# earlier turns keep no <think>...</think> #}).
THINKING_TEMPLATE = (
    "{# earlier turns keep no <think>...</think> #}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)
ASK = [{"role": "user", "content": "the cat sat on the"}]


def read(chunks: list[str], thinking: bool = False) -> tuple[str, str, list]:
    reader = ReasoningReader(thinking)
    pieces = [piece for chunk in chunks for piece in reader.feed(chunk)] + reader.finish()
    return reader.reasoning, reader.answer, pieces


@pytest.mark.parametrize(
    "chunks, thinking, reasoning, answer",
    [
        (["<th", "ink>hm", "m, ok</th", "ink>\n\nThe", " answer"], False, "hmm, ok", "The answer"),
        (["hello <think>x"], False, "", "hello <think>x"),  # a block opens only at the start
        (["  ", "<think>a</think>", "\n", "b"], False, "a", "b"),  # the whitespace between them goes
        (["a</think>b"], True, "a", "b"),  # the prompt opened the block
        (["still thinking </th"], True, "still thinking </th", ""),  # cut short: all of it is reasoning
        (["<thi"], False, "", "<thi"),
    ],
)
def test_the_reader_tells_reasoning_from_the_answer_as_it_streams(chunks, thinking, reasoning, answer):
    got_reasoning, got_answer, pieces = read(chunks, thinking)
    assert (got_reasoning, got_answer) == (reasoning, answer)
    assert "".join(p.text for p in pieces if isinstance(p, Thought)) == reasoning
    assert "".join(p for p in pieces if isinstance(p, str)) == answer


def test_which_templates_think_and_which_cues_open_a_block():
    assert thinks(THINKING_TEMPLATE) and not thinks("{{ messages }}") and not thinks(None)
    assert opens_thinking("<|im_start|>assistant\n<think>\n") and not opens_thinking("<think>a</think>\n")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = write_tiny_llama(
        tmp_path_factory.mktemp("think") / "think.gguf", seed=0, chat_template=THINKING_TEMPLATE, endless=True
    )
    running = RunningServer(SessionConfig(target=model, lookup=True, k=4, n_ctx=2048, threads=1), ServeOptions(port=0))
    yield running
    running.stop()


def test_every_route_hands_out_the_reasoning_apart(server):
    """The cue opened the block and this model never closes it: all of the reply is reasoning,
    the same text a completion of the rendered prompt writes."""
    prompt = httpx.post(f"{server.url}/apply-template", json={"messages": ASK}).json()["prompt"]
    raw = httpx.post(f"{server.url}/v1/completions", json={"prompt": prompt, "max_tokens": 12}).json()["choices"][0]["text"]
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    chat = client.chat.completions.create(model="any", messages=ASK, max_tokens=12).choices[0].message
    assert chat.model_extra["reasoning_content"] == raw and not chat.content
    stream = client.chat.completions.create(model="any", messages=ASK, max_tokens=12, stream=True)
    deltas = [chunk.choices[0].delta for chunk in stream if chunk.choices]
    assert "".join(d.model_extra.get("reasoning_content") or "" for d in deltas) == raw
    assert not "".join(d.content or "" for d in deltas)
    message = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0).messages.create(
        model="any", max_tokens=12, messages=ASK
    )
    assert [block.type for block in message.content] == ["thinking"] and message.content[0].thinking == raw
    response = client.responses.create(model="any", input=ASK[0]["content"], max_output_tokens=12)
    assert [item.type for item in response.output] == ["reasoning"] and response.output[0].content[0].text == raw


def test_streamed_thinking_blocks_and_reasoning_items(server):
    with anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0).messages.stream(
        model="any", max_tokens=12, messages=ASK
    ) as stream:
        kinds = [event.delta.type for event in stream if event.type == "content_block_delta"]
        final = stream.get_final_message()
    assert kinds and set(kinds) == {"thinking_delta"} and final.content[0].type == "thinking"
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    with client.responses.stream(model="any", input=ASK[0]["content"], max_output_tokens=12) as events:
        names = [event.type for event in events]
    assert names[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert "response.reasoning_text.delta" in names and "response.reasoning_text.done" in names
    assert names[-1] == "response.incomplete"  # the length limit, as OpenAI ends such a stream


def test_a_raw_completion_and_asked_for_logprobs_keep_the_text_as_it_came(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    scored = client.chat.completions.create(model="any", messages=ASK, max_tokens=4, logprobs=True).choices[0].message
    assert scored.content and "reasoning_content" not in (scored.model_extra or {})
