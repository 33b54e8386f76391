"""Every malformed body on the routes other protocols speak (Anthropic's Messages, OpenAI's
Responses, llama-server's /completion and /infill): one field at a time set to each JSON kind it
does not take and to numbers no setting takes, plus bodies that are no request at all. Each gets a
4xx in its protocol's envelope, never reaches the model, and the server keeps serving."""

from __future__ import annotations

import httpx
import pytest
from serve_helpers import RunningServer
from test_serve import EXTREMES, KINDS, NOT_A_REQUEST, with_value
from tinymodels import write_tiny_llama

from specrun.config import SessionConfig
from specrun.serve.server import ServeOptions

ASK = [{"role": "user", "content": "hi"}]
VALID = {  # a body each route serves; the malformed ones change one field of it
    "/v1/messages": {"max_tokens": 1, "messages": ASK},
    "/v1/messages/count_tokens": {"messages": ASK},
    "/v1/responses": {"input": "hi", "max_output_tokens": 1},
    "/completion": {"prompt": "hi", "n_predict": 1},
    "/infill": {"input_prefix": "a", "input_suffix": "b", "n_predict": 1},
}
# Field -> the kinds of KINDS that are valid there (null leaves a setting out); the others are malformed.
MESSAGES = {
    "messages": set(),
    "messages.0": set(),
    "messages.0.role": set(),
    "messages.0.content": {"string"},
    "system": {"null", "string"},
    "tools": {"null"},
    "tool_choice": {"null"},
}
FIELDS = {
    "/v1/messages": MESSAGES
    | {
        "max_tokens": {"integer"},
        "temperature": {"null", "integer", "number"},
        "top_p": {"null"},
        "top_k": {"null", "integer"},
        "stop_sequences": {"null", "array"},
        "stream": {"null", "boolean"},
        "metadata": {"null", "object"},
        "thinking": {"null", "object"},
    },
    "/v1/messages/count_tokens": MESSAGES,
    "/v1/responses": {
        "input": {"string"},
        "instructions": {"null", "string"},
        "max_output_tokens": {"null", "integer"},
        "temperature": {"null", "integer", "number"},
        "top_p": {"null"},
        "tools": {"null"},
        "tool_choice": {"null"},
        "parallel_tool_calls": {"null", "boolean"},
        "text": {"null", "object"},
        "text.format": {"null"},
        "stream": {"null", "boolean"},
        "store": {"null", "boolean"},
        "previous_response_id": {"null"},
        "metadata": {"null", "object"},
        "reasoning": {"null", "object"},
        "background": {"null"},
        "conversation": {"null"},
    },
    "/completion": {
        "prompt": {"string"},
        "n_predict": {"null", "integer"},
        "n_probs": {"null", "integer"},
        "cache_prompt": {"null", "boolean"},
        "return_tokens": {"null", "boolean"},
        "temperature": {"null", "integer", "number"},
        "top_k": {"null", "integer"},
        "stop": {"null", "string", "array"},
        "grammar": {"null"},
        "logit_bias": {"null"},
    },
    "/infill": {
        "input_prefix": {"string"},
        "input_suffix": {"string"},
        "input_extra": set(),
        "input_extra.0": set(),
        "prompt": {"string"},
        "n_predict": {"null", "integer"},
    },
}
NUMERIC = {
    "/v1/messages": ["max_tokens", "temperature", "top_p", "top_k"],
    "/v1/messages/count_tokens": [],
    "/v1/responses": ["max_output_tokens", "temperature", "top_p"],
    "/completion": ["n_predict", "n_probs", "temperature", "top_k"],
    "/infill": ["n_predict"],
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = write_tiny_llama(tmp_path_factory.mktemp("fuzz") / "fim.gguf", seed=0, fim=True)
    running = RunningServer(SessionConfig(target=model, n_ctx=512, threads=1), ServeOptions(port=0))
    yield running
    running.stop()


def malformed_bodies(path: str) -> list[bytes]:
    body = VALID[path]
    if path == "/infill":
        body = body | {"input_extra": [{"text": "x"}]}
    wrong_kinds = [
        with_value(body, field, KINDS[kind]) for field, takes in FIELDS[path].items() for kind in KINDS if kind not in takes
    ]
    return wrong_kinds + [with_value(body, field, number) for field in NUMERIC[path] for number in EXTREMES] + NOT_A_REQUEST


def assert_refused(response: httpx.Response, path: str, raw: bytes) -> None:
    assert 400 <= response.status_code < 500, (path, raw[:200], response.status_code, response.text[:300])
    body = response.json()
    if path.startswith("/v1/messages"):
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", (raw[:200], body)
        assert body["error"]["message"], raw[:200]
    else:
        assert body["error"]["type"] in ("invalid_request_error", "not_found_error") and body["error"]["message"], (
            raw[:200],
            body,
        )


def generated(server) -> float:
    text = httpx.get(f"{server.url}/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("specrun:generation_tokens_total"))


@pytest.mark.parametrize("path", VALID)
def test_every_malformed_body_gets_a_4xx_in_its_protocols_envelope(server, path):
    before = generated(server)
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for raw in malformed_bodies(path):
            assert_refused(client.post(path, content=raw, headers={"Content-Type": "application/json"}), path, raw)
        assert client.post(path, json=VALID[path]).status_code == 200  # it keeps serving
    assert generated(server) <= before + 1
