"""`specrun serve` through the official openai client and raw HTTP, on tiny generated models.

Most tests share one in-process server (a free loopback port, stopped by its handle);
`Pace` slows its decodes when a test needs a generation to stay on the model.
"""

import copy
import json
import re
import socket
import threading
import time
from dataclasses import replace

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serve_helpers import TEMPLATE, Pace, RunningServer
from tinymodels import write_tiny_llama

from specrun.config import SessionConfig
from specrun.serve.app import is_local_host
from specrun.serve.jobs import Job
from specrun.serve.server import ServeOptions, bind

STORE_LIMIT = 400
N_CTX = 512


@pytest.fixture(scope="module")
def templated(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("serve") / "chat.gguf", seed=0, chat_template=TEMPLATE)


@pytest.fixture(scope="module")
def config(templated):
    return SessionConfig(target=templated, lookup=True, store_tokens=STORE_LIMIT, k=4, n_ctx=N_CTX, threads=1)


@pytest.fixture(scope="module")
def pace():
    return Pace()


@pytest.fixture(scope="module")
def served(config, pace):
    running = RunningServer(config, ServeOptions(port=0, queue=8), open_session=lambda: pace.open(config))
    yield running
    running.stop()


@pytest.fixture
def idle(served, pace):
    """The shared server, idle and at full speed before and after the test."""
    served.wait_idle()
    yield served
    pace.delay = 0.0
    served.server.worker.queue_size = 8
    served.wait_idle()


def metric(served, name: str, **labels: str) -> float:
    """A value /metrics reports. A metric it does not list fails the test, so a renamed one
    cannot read as 0; a series of a labelled metric not counted yet reads 0, as in Prometheus."""
    families = {family.name: family for family in text_string_to_metric_families(httpx.get(f"{served.url}/metrics").text)}
    family = families.get(f"specrun:{name.removesuffix('_total')}")
    assert family is not None, f"/metrics has no specrun:{name}"
    values = [sample.value for sample in family.samples if sample.name == f"specrun:{name}" and sample.labels == labels]
    assert values or labels, f"/metrics has no value of specrun:{name}"
    return values[0] if values else 0.0


def assert_consistent(usage, timings):
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert timings["predicted_n"] == usage.completion_tokens
    assert timings["prompt_n"] + timings["cache_n"] == usage.prompt_tokens
    assert usage.prompt_tokens_details.cached_tokens == timings["cache_n"]
    assert 0 <= timings["draft_n_accepted"] <= timings["draft_n"]
    for key in ("prompt_ms", "predicted_ms", "predicted_per_second"):
        assert timings[key] >= 0


def test_completions_streamed_and_not_agree_and_carry_usage_and_timings(idle):
    client = idle.client()
    whole = client.completions.create(model="any", prompt="the cat sat on the mat", max_tokens=20, temperature=0)
    assert whole.object == "text_completion" and whole.choices[0].finish_reason in ("length", "stop")
    assert_consistent(whole.usage, whole.model_extra["timings"])
    chunks = list(
        client.completions.create(
            model="any",
            prompt="the cat sat on the mat",
            max_tokens=20,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    finishing = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishing) == 1 and finishing[0].choices[0].finish_reason == whole.choices[0].finish_reason
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == whole.usage.completion_tokens
    assert last.usage.prompt_tokens == whole.usage.prompt_tokens
    assert_consistent(last.usage, last.model_extra["timings"])
    assert finishing[0].model_extra["timings"] == last.model_extra["timings"]


def test_chat_streamed_and_not_through_the_chat_template(idle):
    client = idle.client()
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"}]
    whole = client.chat.completions.create(model="any", messages=messages, max_tokens=16, temperature=0)
    assert whole.object == "chat.completion" and whole.choices[0].message.role == "assistant"
    assert_consistent(whole.usage, whole.model_extra["timings"])
    chunks = list(client.chat.completions.create(model="any", messages=messages, max_tokens=16, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert chunks[-1].usage is None  # not asked for
    timings = chunks[-1].model_extra["timings"]
    assert timings["predicted_n"] == whole.usage.completion_tokens
    # The prompt went through the template: the system and user turns, then the assistant's cue.
    assert whole.usage.prompt_tokens > len("be brief hello world".split()) + 3


def test_stop_strings_end_the_reply_before_them(idle):
    client = idle.client()
    text = client.completions.create(model="any", prompt="I see the water", max_tokens=24, temperature=0).choices[0].text
    stop = text[8:11]
    assert stop and stop not in text[:8]
    cut = client.completions.create(model="any", prompt="I see the water", max_tokens=24, temperature=0, stop=[stop, "zzzz"])
    assert cut.choices[0].text == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_a_request_extending_the_last_conversation_prefills_only_its_new_tokens(idle):
    client = idle.client()
    messages = [{"role": "user", "content": "the cat sat on the mat and the dog was there"}]
    first = client.chat.completions.create(model="any", messages=messages, max_tokens=12, temperature=0)
    messages += [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "and then"}]
    second = client.chat.completions.create(model="any", messages=messages, max_tokens=12, temperature=0)
    timings = second.model_extra["timings"]
    # Everything the first request read and wrote is cached; only the new turn is processed.
    assert timings["cache_n"] >= first.usage.prompt_tokens + first.usage.completion_tokens - 2
    assert timings["prompt_n"] < second.usage.prompt_tokens - first.usage.prompt_tokens


def test_conversations_interleaved_on_two_slots_each_reuse_their_own_cache(config):
    """An agent's turn finds its earlier turns cached even when another conversation ran in between:
    each goes to the slot that holds most of its prompt. The client sends back its own text for the
    assistant's turns (an agent's recorded calls), not what the model wrote."""
    running = RunningServer(replace(config, parallel=2, n_ctx=2 * N_CTX), ServeOptions(port=0))
    try:
        client = running.client()
        talks = {
            name: [{"role": "user", "content": f"{name} the cat sat on the mat and the dog was there and the cat"}]
            for name in ("one", "two")
        }
        firsts = {name: client.chat.completions.create(model="any", messages=m, max_tokens=4) for name, m in talks.items()}
        for name, messages in talks.items():
            messages += [{"role": "assistant", "content": "let me look"}, {"role": "user", "content": "it was on the mat"}]
            second = client.chat.completions.create(model="any", messages=messages, max_tokens=4)
            assert second.model_extra["timings"]["cache_n"] >= firsts[name].usage.prompt_tokens, name
    finally:
        running.stop()


def test_requests_pick_their_sampling_and_drafting(idle):
    client = idle.client()
    prompt = "hello world , the dog was there and the dog was"
    greedy = client.completions.create(model="any", prompt=prompt, max_tokens=24, temperature=0).choices[0].text
    for extra in ({"k": 2}, {"k": "auto"}, {"speculative": {"n_max": 3, "n_min": 1, "p_min": 0.5}}, {"top_k": 1, "min_p": 0.1}):
        again = client.completions.create(model="any", prompt=prompt, max_tokens=24, temperature=0, extra_body=extra)
        assert again.choices[0].text == greedy, extra  # drafting never changes the output
    one = client.completions.create(model="any", prompt=prompt, max_tokens=24, temperature=0.9, seed=7)
    two = client.completions.create(model="any", prompt=prompt, max_tokens=24, temperature=0.9, seed=7)
    assert one.choices[0].text == two.choices[0].text  # the same seed, the same sample
    hot = client.completions.create(model="any", prompt=prompt, max_tokens=4, temperature=3.5)  # the library's range
    assert hot.usage.completion_tokens >= 1
    penalties = {"frequency_penalty": 1.5, "presence_penalty": 0.5}
    penalized = [
        client.completions.create(model="any", prompt=prompt, max_tokens=24, temperature=0, extra_body={**penalties, **extra})
        for extra in ({"k": 2}, {"k": "auto", "repeat_penalty": 1.0, "repeat_last_n": 64})  # llama-server's, at their defaults
    ]
    assert penalized[0].choices[0].text == penalized[1].choices[0].text != greedy


@pytest.mark.parametrize(
    "body, param, fragment",
    [
        (
            {"prompt": "hi", "temperature": "hot"},
            "temperature",
            "Invalid type for 'temperature': expected a number, but got a string instead.",
        ),
        (
            {"prompt": "hi", "temperature": -1},
            "temperature",
            "Invalid value for 'temperature': it has to be a number >= 0 (0 is greedy), but is -1.",
        ),
        ({"prompt": "hi", "n": 3}, "n", "3 were asked for"),
        ({"prompt": "hi", "max_tokens": -5}, "max_tokens", "it has to be an integer >= 1, but is -5."),
        ({"prompt": "hi", "max_completion_tokens": 0}, "max_completion_tokens", "it has to be an integer >= 1, but is 0."),
        ({"prompt": "hi", "max_tokens": True}, "max_tokens", "expected an integer, but got a boolean"),
        ({"prompt": "hi", "top_p": 1.5}, "top_p", "it has to be a number in (0, 1] (1 disables it), but is 1.5."),
        ({"prompt": "hi", "top_k": -1}, "top_k", "it has to be an integer >= 0 (0 disables it), but is -1."),
        ({"prompt": "hi", "min_p": 2}, "min_p", "it has to be a number in [0, 1] (0 disables it), but is 2."),
        (
            {"prompt": "hi", "frequency_penalty": 3},
            "frequency_penalty",
            "it has to be a number from -2 to 2 (0 disables it), but is 3.",
        ),
        (
            {"prompt": "hi", "repeat_penalty": 0},
            "repeat_penalty",
            "it has to be a number from 0.01 to 100 (1 disables it), but is 0.",
        ),
        ({"prompt": "hi", "stop": [1, 2]}, "stop", "expected a string or an array of strings"),
        ({"prompt": "hi", "k": 0}, "k", "it has to be an integer >= 1, 'auto' or 'llama.cpp', but is 0."),
        ({"prompt": "hi", "k": "fast"}, "k", "but is 'fast'."),
        ({"prompt": "hi", "k": 1.5}, "k", 'expected an integer, "auto" or "llama.cpp", but got a number'),
        ({"prompt": "hi", "k": 2, "speculative": {"n_max": 4}}, "k", "not both"),
        ({"prompt": "hi", "speculative": {"n_max": 2, "n_min": 3}}, "speculative.n_min", "it has to be <= n_max (2), but is 3."),
        ({"prompt": "hi", "speculative": {"p_min": 2}}, "speculative.p_min", "it has to be a number in [0, 1], but is 2."),
        ({"prompt": "hi", "speculative": {"n_max": 600}}, "speculative.n_max", "at most 511"),
        ({"prompt": "hi", "speculative": 5}, "speculative", "expected an object, but got a number"),
        ({"prompt": 5}, "prompt", "expected a string (or an array of one string), but got a number"),
        ({"prompt": ["a", "b"]}, "prompt", "expected a string (or an array of one string), but got an array"),
        ({}, "prompt", "Missing required parameter: 'prompt'."),
    ],
)
def test_bad_completion_requests_get_400_and_the_server_answers_the_next(idle, body, param, fragment):
    response = idle.post("/v1/completions", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param and fragment in error["message"]
    ok = idle.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "unknown_field": {"ignored": True}})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize(
    "body, param",
    [
        ({"messages": "hello"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{}]}, "messages[0].role"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content[0]"),
        ({"messages": [{"role": "user", "content": "hi"}], "stream_options": 3}, "stream_options"),
    ],
)
def test_bad_chat_requests_get_400(idle, body, param):
    response = idle.post("/v1/chat/completions", json=body)
    assert response.status_code == 400 and response.json()["error"]["param"] == param


def test_malformed_json_and_an_over_long_prompt_get_400_naming_the_problem(idle):
    response = idle.post("/v1/chat/completions", content=b'{"messages": [', headers={"Content-Type": "application/json"})
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json"
    with pytest.raises(openai.BadRequestError) as caught:
        idle.client().completions.create(model="any", prompt="the cat " * 400, max_tokens=4)
    error = caught.value.body
    assert error["code"] == "context_length_exceeded"
    assert re.search(r"the prompt has \d{3,} tokens but the context holds 512", error["message"])
    with pytest.raises(openai.BadRequestError):
        idle.client().chat.completions.create(model="any", messages=[{"role": "user", "content": "the cat " * 400}], stream=True)
    assert idle.client().completions.create(model="any", prompt="hello", max_tokens=3).usage.completion_tokens == 3


CHAT_PATH, COMPLETION_PATH = "/v1/chat/completions", "/v1/completions"
VALID = {  # a body each endpoint serves; the malformed ones below change one thing in it
    CHAT_PATH: {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_tokens": 1},
    COMPLETION_PATH: {"prompt": "hi", "max_tokens": 1},
}
DEEP = "[" * 5000 + "]" * 5000
# One value of each JSON kind, and numbers no setting takes: not finite, beyond a double, 400 digits below zero.
KINDS = {
    "null": "null",
    "boolean": "true",
    "integer": "7",
    "number": "1.5",
    "string": '"x"',
    "array": '["x"]',
    "object": '{"x": 1}',
}
EXTREMES = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "-1" + "0" * 400]
# Field -> the kinds whose value in KINDS is a valid one there (null leaves a setting out); the others are malformed.
COMMON = {
    "n": {"null"},  # only 1
    "max_tokens": {"null", "integer"},
    "max_completion_tokens": {"null", "integer"},
    "temperature": {"null", "integer", "number"},
    "top_p": {"null"},  # in (0, 1]
    "top_k": {"null", "integer"},
    "min_p": {"null"},  # in [0, 1]
    "frequency_penalty": {"null", "number"},  # in [-2, 2]
    "presence_penalty": {"null", "number"},
    "repeat_penalty": {"null", "integer", "number"},  # in [0.01, 100]
    "repeat_last_n": {"null", "integer"},
    "ignore_eos": {"null", "boolean"},
    "typical_p": {"null"},  # in [0, 1]
    "top_n_sigma": {"null", "integer", "number"},
    "xtc_probability": {"null"},  # in [0, 1]
    "xtc_threshold": {"null"},
    "dry_multiplier": {"null"},
    "mirostat": {"null"},
    "dynatemp_range": {"null", "integer", "number"},
    "dynatemp_exponent": {"null", "integer", "number"},
    "seed": {"null", "integer"},
    "stop": {"null", "string", "array"},
    "stream": {"null", "boolean"},
    "stream_options": {"null", "object"},
    "stream_options.include_usage": {"null", "boolean"},
    "k": {"null", "integer"},
    "speculative": {"null", "object"},
    "speculative.n_max": {"null", "integer"},
    "speculative.n_min": {"null", "integer"},
    "speculative.p_min": {"null"},  # in [0, 1]
    "response_format": {"null"},  # an object with a type
    "response_format.type": set(),
    "json_schema": {"null"},  # {"x": 1} is no schema
    "grammar": {"null"},  # "x" has no root rule
    "logit_bias": {"null"},  # keyed by token ids
}
OWN = {
    CHAT_PATH: {
        "messages": set(),
        "messages.0": set(),
        "messages.0.role": set(),
        "messages.0.content": {"string"},
        "messages.0.content.0": set(),
        "messages.0.content.0.type": set(),
        "messages.0.content.0.text": {"string"},
        "messages.0.tool_calls": {"null"},
        "tools": {"null"},
        "tool_choice": {"null"},  # none to choose from
        "parallel_tool_calls": {"null", "boolean"},
        "logprobs": {"null", "boolean"},
        "top_logprobs": {"null"},  # only with logprobs
        "functions": {"null"},
        "function_call": {"null"},
    },  # OpenAI's deprecated API: refused
    COMPLETION_PATH: {"prompt": {"string", "array"}, "logprobs": {"null", "integer"}},  # ["x"]: an array of one string
}
NUMERIC = [
    "n",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repeat_penalty",
    "repeat_last_n",
    "xtc_probability",
    "xtc_threshold",
    "typical_p",
    "top_n_sigma",
    "dynatemp_range",
    "dynatemp_exponent",
    "k",
    "speculative.n_max",
    "speculative.n_min",
    "speculative.p_min",
]  # not seed: a negative one draws a fresh seed
NOT_A_REQUEST = [
    b"",
    b"[]",
    b'"hi"',
    b"7",
    b"null",
    b'{"prompt": ',
    DEEP.encode(),
    b'{"prompt": "\xff"}',
    b"\xff\xfe{}",
    b'{"messages": [{"role": "user", "content": "\xed\xa0\x80"}]}',
]  # the last: a surrogate in UTF-8


def with_value(body: dict, field: str, literal: str) -> bytes:
    """`body` as JSON with the JSON text `literal` at `field` (dotted; numbers index arrays)."""
    body = copy.deepcopy(body)
    *parents, last = (int(key) if key.isdigit() else key for key in field.split("."))
    target = body
    for key in parents:
        target = target.setdefault(key, {}) if isinstance(key, str) else target[key]
    target[last] = "<malformed>"
    return json.dumps(body).replace('"<malformed>"', literal).encode()


def malformed_bodies(path: str) -> list[bytes]:
    fields = {**COMMON, **OWN[path]}
    wrong_kinds = [
        with_value(VALID[path], field, KINDS[kind]) for field, takes in fields.items() for kind in KINDS if kind not in takes
    ]
    return wrong_kinds + [with_value(VALID[path], field, number) for field in NUMERIC for number in EXTREMES] + NOT_A_REQUEST


def post_raw(client, path: str, raw: bytes) -> httpx.Response:
    return client.post(path, content=raw, headers={"Content-Type": "application/json"})


def assert_refused(response: httpx.Response, raw: bytes) -> dict:
    assert response.status_code == 400, (raw[:200], response.status_code, response.text[:300])
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error", (raw[:200], error)
    assert isinstance(error["message"], str) and error["message"], raw[:200]
    return error


@pytest.mark.parametrize("path", VALID)
def test_json_nested_thousands_deep_and_lone_surrogates_get_400_not_500(idle, path):
    """Both were 500s: Python's json module raised RecursionError on the first, and tokenizing
    the second raised UnicodeEncodeError on the model thread. The JSON parser refuses both."""
    valid = json.dumps(VALID[path])
    nested = [DEEP, valid[:-1] + f', "ignored": {DEEP}}}', valid[:-1] + f', "stop": {DEEP}}}']
    spoken = {"messages": [{"role": "user", "content": "hi \ud800"}]} if path == CHAT_PATH else {"prompt": "hi \ud800"}
    surrogates = [{**VALID[path], **spoken}, {**VALID[path], "stop": ["\udc00"]}]  # json.dumps writes them as \uXXXX
    for raw in [body.encode() for body in nested] + [json.dumps(body).encode() for body in surrogates]:
        error = assert_refused(post_raw(idle, path, raw), raw)
        assert error["code"] == "invalid_json" and re.search(r"at line 1 column \d+", error["message"]), error
    assert idle.post(path, json=VALID[path]).status_code == 200


@pytest.mark.parametrize("path", VALID)
def test_every_malformed_body_gets_a_400_error_object_and_never_reaches_the_model(idle, path):
    bodies = malformed_bodies(path)
    rejected = metric(idle, "requests_rejected_total", reason="invalid")
    generated = metric(idle, "generation_tokens_total")
    with httpx.Client(base_url=idle.url, timeout=60) as client:
        for raw in bodies:
            assert_refused(post_raw(client, path, raw), raw)
    assert metric(idle, "requests_rejected_total", reason="invalid") == rejected + len(bodies)
    assert metric(idle, "generation_tokens_total") == generated
    assert idle.post(path, json=VALID[path]).json()["usage"]["completion_tokens"] == 1


def test_unknown_routes_get_openai_error_objects(idle):
    response = httpx.get(f"{idle.url}/v1/nothing")
    assert response.status_code == 404 and response.json()["error"]["type"] == "not_found_error"
    models = idle.client().models.list()
    assert [m.id for m in models.data] == ["chat"]


def test_a_second_request_repeating_the_first_drafts_from_the_store(idle):
    client = idle.client()
    prompt = "Hello , what was the one thing he said when we had"
    before = sum(metric(idle, "spec_decode_accepted_tokens_by_source_total", source=s) for s in ("store", "store-long"))
    first = client.completions.create(model="any", prompt=prompt, max_tokens=40, temperature=0)
    client.completions.create(model="any", prompt="water , I see", max_tokens=4, temperature=0)  # something between
    second = client.completions.create(model="any", prompt=prompt, max_tokens=40, temperature=0)
    assert second.choices[0].text == first.choices[0].text  # every token is still the target's
    after = sum(metric(idle, "spec_decode_accepted_tokens_by_source_total", source=s) for s in ("store", "store-long"))
    assert after > before and second.model_extra["timings"]["draft_n_accepted"] > 0
    for i in range(12):  # the store stays within its limit, oldest dropped first
        client.completions.create(model="any", prompt=f"request {i} : the cat and the dog", max_tokens=30)
        assert 0 < metric(idle, "ngram_store_tokens") <= STORE_LIMIT


def test_metrics_count_requests_tokens_and_speculation(idle):
    client = idle.client()
    before = {name: metric(idle, name) for name in ("generation_tokens_total", "spec_decode_num_draft_tokens_total")}
    done = metric(idle, "request_success_total", finished_reason="length")
    client.completions.create(model="any", prompt="the cat sat on the mat and the cat sat on the", max_tokens=30)
    assert metric(idle, "generation_tokens_total") == before["generation_tokens_total"] + 30
    assert metric(idle, "request_success_total", finished_reason="length") == done + 1
    text = httpx.get(f"{idle.url}/metrics").text
    for name in (
        "spec_decode_num_drafts_total",
        "spec_decode_num_draft_tokens_total",
        "spec_decode_num_accepted_tokens_total",
        "prompt_tokens_total",
        "num_requests_waiting",
    ):
        assert f"# TYPE specrun:{name} " in text
    accepted = metric(idle, "spec_decode_num_accepted_tokens_total")
    assert accepted <= metric(idle, "spec_decode_num_draft_tokens_total")
    by_position = [float(v) for v in re.findall(r'accepted_tokens_per_pos_total\{position="\d+"\} (\S+)', text)]
    assert sum(by_position) == accepted


def read_chunks(response, count: int) -> list[dict]:
    chunks = []
    for line in response.iter_lines():
        if line.startswith("data: {"):
            chunks.append(json.loads(line[6:]))
            if len(chunks) == count:
                break
    return chunks


def test_a_client_that_drops_mid_stream_stops_its_generation_within_a_step(idle, pace, monkeypatch):
    worker = idle.server.worker
    at_cancel = []
    cancel = Job.cancel

    def recording_cancel(job):
        if job in worker.running.values() and not job.cancelled:
            at_cancel.append(pace.decodes)
        cancel(job)

    monkeypatch.setattr(Job, "cancel", recording_cancel)
    aborted = metric(idle, "request_success_total", finished_reason="abort")
    generated = metric(idle, "generation_tokens_total")
    pace.delay = 0.02
    body = {"prompt": "the dog was there", "max_tokens": 400, "stream": True, "k": 1}
    with httpx.stream("POST", f"{idle.url}/v1/completions", json=body, timeout=60) as response:
        assert len(read_chunks(response, 3)) == 3
    idle.wait_idle()
    assert len(at_cancel) == 1 and pace.decodes - at_cancel[0] <= 1  # at most the decode in flight
    assert metric(idle, "request_success_total", finished_reason="abort") == aborted + 1
    assert metric(idle, "generation_tokens_total") - generated < 100  # far from its 400 tokens
    pace.delay = 0.0
    assert idle.client().completions.create(model="any", prompt="hello", max_tokens=3).choices[0].finish_reason == "length"


def test_a_client_that_drops_a_non_streamed_request_frees_the_model(idle, pace):
    pace.delay = 0.02
    aborted = metric(idle, "request_success_total", finished_reason="abort")
    with pytest.raises(httpx.ReadTimeout):
        idle.post("/v1/completions", json={"prompt": "the dog was there", "max_tokens": 400, "k": 1}, timeout=0.3)
    idle.wait_idle(timeout=5)
    assert metric(idle, "request_success_total", finished_reason="abort") == aborted + 1


def test_a_full_queue_gets_429_with_retry_after(idle, pace):
    worker = idle.server.worker
    worker.queue_size = 1
    pace.gate.clear()  # the first request holds the model until the gate opens
    results = {}

    def ask(name):
        results[name] = idle.post("/v1/completions", json={"prompt": "hello", "max_tokens": 2})

    running, waiting = (threading.Thread(target=ask, args=(name,)) for name in ("running", "waiting"))
    try:
        running.start()
        poll(lambda: bool(worker.running))
        waiting.start()
        poll(lambda: worker.waiting == 1)
        with pytest.raises(openai.RateLimitError) as caught:
            idle.client().completions.create(model="any", prompt="hello", max_tokens=2)
        assert int(caught.value.response.headers["Retry-After"]) >= 1
        assert caught.value.body["code"] == "queue_full"
    finally:
        pace.gate.set()
        running.join(30)
        waiting.join(30)
    assert results["running"].status_code == results["waiting"].status_code == 200


def poll(condition, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_four_concurrent_clients_all_get_their_own_complete_answers(idle):
    prompts = ["the cat sat", "hello world", "I see the water", "what was it"]
    client = idle.client()
    alone = [client.completions.create(model="any", prompt=p, max_tokens=24, temperature=0).choices[0].text for p in prompts]
    answers = {}

    def ask(i):
        chunks = client.completions.create(model="any", prompt=prompts[i], max_tokens=24, temperature=0, stream=True)
        answers[i] = "".join(c.choices[0].text for c in chunks if c.choices)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert [answers.get(i) for i in range(4)] == alone


def test_health_is_503_while_loading_and_the_api_key_is_required(config):
    loading = threading.Event()

    def slow_open():
        loading.wait(30)
        return Pace().open(config)

    running = RunningServer(config, ServeOptions(port=0, api_key="sesame"), open_session=slow_open, wait=False)
    try:
        health = _get(f"{running.url}/health")
        assert health.status_code == 503 and health.json()["error"]["message"] == "Loading model"
        early = running.post("/v1/completions", json={"prompt": "hi"}, headers={"Authorization": "Bearer sesame"})
        assert early.status_code == 503
        loading.set()
        running.wait_ready()
        with pytest.raises(openai.AuthenticationError):
            running.client("wrong").completions.create(model="any", prompt="hi", max_tokens=2)
        missing = running.post("/v1/completions", json={"prompt": "hi"})
        assert missing.status_code == 401 and missing.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(f"{running.url}/metrics").status_code == 401
        assert running.client("sesame").completions.create(model="any", prompt="hi", max_tokens=2).usage.completion_tokens == 2
    finally:
        loading.set()
        running.stop()


def _get(url: str) -> httpx.Response:
    deadline = time.monotonic() + 20
    while True:
        try:
            return httpx.get(url, timeout=5)
        except httpx.TransportError:
            assert time.monotonic() < deadline
            time.sleep(0.05)


def preflight(url: str, origin: str) -> httpx.Response:
    return httpx.options(
        f"{url}/v1/chat/completions",
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )


def test_browser_pages_on_this_machine_may_call_the_api_and_others_only_when_named(config):
    running = RunningServer(config, ServeOptions(port=0, api_key="sesame", cors_origins=("https://ui.example",)))
    try:
        for origin in ("http://localhost:3000", "http://127.0.0.1:8081", "http://ui.localhost:3000", "https://ui.example"):
            allowed = preflight(running.url, origin)
            assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == origin
            assert "authorization" in allowed.headers["access-control-allow-headers"].lower()
            reply = httpx.get(f"{running.url}/v1/models", headers={"Origin": origin, "Authorization": "Bearer sesame"})
            assert reply.status_code == 200 and reply.headers["access-control-allow-origin"] == origin
        for origin in ("https://evil.example", "http://localhost.evil.example"):
            refused = preflight(running.url, origin)
            assert refused.status_code == 400 and "access-control-allow-origin" not in refused.headers
    finally:
        running.stop()


def test_a_loopback_server_answers_only_requests_addressed_to_this_machine(idle):
    refused = httpx.get(f"{idle.url}/v1/models", headers={"Host": "rebound.example:8080"})
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "forbidden_host" and "rebound.example" in refused.json()["error"]["message"]
    for host in ("localhost:8080", "127.0.0.1", "[::1]:8080", "ui.localhost:3000"):
        assert httpx.get(f"{idle.url}/v1/models", headers={"Host": host}).status_code == 200, host
    assert metric(idle, "requests_rejected_total", reason="host") >= 1
    assert idle.client().completions.create(model="any", prompt="the cat", max_tokens=2).usage.completion_tokens == 2


@pytest.mark.parametrize(
    "host, local",
    [
        ("", True),
        ("LOCALHOST", True),
        ("127.0.0.2:80", True),
        ("[::1]", True),
        ("10.0.0.5:8080", False),
        ("example.com", False),
        ("[2001:db8::1]:8080", False),
    ],
)
def test_which_host_headers_name_this_machine(host, local):
    assert is_local_host(host) is local


def test_the_listening_socket_is_tcp_so_responses_are_not_held_for_delayed_acks():
    sock = bind("127.0.0.1", 0)
    try:
        # asyncio sets TCP_NODELAY only on connections of IPPROTO_TCP sockets; without it each
        # response on a kept-alive connection waited ~40 ms for the client's delayed ACK.
        assert sock.proto == socket.IPPROTO_TCP
    finally:
        sock.close()


@pytest.mark.gemma
def test_gemma_chat_turns_reuse_the_cache_through_its_own_template(gemma):
    config = SessionConfig(target=gemma, lookup=True, store_tokens=4096, k=4, n_ctx=1024, threads=2)
    running = RunningServer(config)
    try:
        client = running.client()
        messages = [{"role": "user", "content": "Name three colours of the rainbow."}]
        first = client.chat.completions.create(model="any", messages=messages, max_tokens=16, temperature=0)
        reply = first.choices[0].message.content
        assert reply.strip()
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "And three more?"}]
        second = client.chat.completions.create(model="any", messages=messages, max_tokens=8, temperature=0)
        timings = second.model_extra["timings"]
        # Gemma's template trims the reply and closes the turn; the tokens the model wrote are kept.
        assert timings["cache_n"] >= first.usage.prompt_tokens + first.usage.completion_tokens - 2
        assert timings["prompt_n"] <= 20
    finally:
        running.stop()


def metric_value(running: RunningServer, name: str) -> float:
    text = httpx.get(f"{running.url}/metrics", timeout=10).text
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(f"specrun:{name} ")))


def test_four_slots_run_four_clients_together_and_each_gets_its_own_answer(config):
    """With --parallel 4 the requests share decodes (rows per decode above one) while each answer
    stays what the request gets alone (greedy)."""
    pace = Pace()
    parallel = replace(config, parallel=4, n_ctx=4 * N_CTX)
    running = RunningServer(parallel, ServeOptions(port=0), open_session=lambda: pace.open(parallel))
    try:
        client = running.client()
        prompts = ["the cat sat", "hello world", "I see the water", "what was it"]
        alone = [client.completions.create(model="any", prompt=p, max_tokens=24, temperature=0).choices[0].text for p in prompts]
        decodes, rows = metric_value(running, "decodes_total"), metric_value(running, "decode_rows_total")
        decodes_before = pace.decodes
        answers = {}

        def ask(i):
            answers[i] = client.completions.create(model="any", prompt=prompts[i], max_tokens=24, temperature=0).choices[0].text

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
        pace.gate.clear()  # the first request's first decode holds the model ...
        threads[0].start()
        poll(lambda: pace.decodes > decodes_before)
        for thread in threads[1:]:  # ... while the other three arrive: all four then run together
            thread.start()
        poll(lambda: running.server.worker.waiting == 3)
        pace.gate.set()
        for thread in threads:
            thread.join(60)
        assert [answers.get(i) for i in range(4)] == alone
        health = httpx.get(f"{running.url}/health", timeout=10).json()
        assert health["slots_idle"] == 4 and health["slots_processing"] == 0
        together = (metric_value(running, "decode_rows_total") - rows) / (metric_value(running, "decodes_total") - decodes)
        assert together > 2  # four streams' rows in most decodes
    finally:
        pace.gate.set()
        running.stop()


def test_a_request_longer_than_its_slot_is_refused_and_the_server_keeps_serving(config):
    parallel = replace(config, parallel=2, n_ctx=2 * 256)
    running = RunningServer(parallel, ServeOptions(port=0))
    try:
        refused = running.post("/v1/completions", json={"prompt": "the cat sat " * 200, "max_tokens": 4})
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "context_length_exceeded"
        assert running.client().completions.create(model="any", prompt="hello", max_tokens=3).choices[0].finish_reason
    finally:
        running.stop()
