"""llama-server's own routes on `specrun serve`, called as its clients call them: the native
/completion (text or token ids, n_predict, n_probs, return_tokens, streamed chunks, return_progress), /infill
with the model's fill-in-the-middle tokens, and the unprefixed aliases."""

from __future__ import annotations

import json

import httpx
import pytest
from llama_cpp import llama_chat_format as lcf
from serve_helpers import RunningServer
from test_serve_tools import HERMES_TEMPLATE
from tinymodels import FIM_IDS, write_tiny_llama

from specrun.backend import Model
from specrun.chat.formats import ChatFormat
from specrun.config import SessionConfig
from specrun.serve.api import Infill
from specrun.serve.native import REPOSITORY_LINE, infill_tokens
from specrun.serve.server import ServeOptions

PROMPT = "the cat sat on the mat and the dog"
PRE, SUF, MID, REP, SEP = FIM_IDS.values()


@pytest.fixture(scope="module")
def fim_model(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("native") / "fim.gguf", seed=0, fim=True, endless=True)


@pytest.fixture(scope="module")
def server(fim_model):
    running = RunningServer(SessionConfig(target=fim_model, lookup=True, k=4, n_ctx=2048, threads=1), ServeOptions(port=0))
    yield running
    running.stop()


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=60)


def test_a_native_completion_is_the_openai_completions_greedy_text(server):
    native = post(server, "/completion", {"prompt": PROMPT, "n_predict": 12}).json()
    openai = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 12}).json()
    assert native["content"] == openai["choices"][0]["text"] and native["stop"] is True
    assert (native["tokens_predicted"], native["tokens_evaluated"]) == (12, openai["usage"]["prompt_tokens"])
    assert native["stop_type"] == "limit" and native["stopping_word"] == "" and native["tokens"] == []
    assert native["timings"]["predicted_n"] == 12 and native["generation_settings"]["n_predict"] == 12
    assert post(server, "/completions", {"prompt": PROMPT, "n_predict": 12}).json()["content"] == native["content"]


def test_a_prompt_of_token_ids_and_the_reply_s_tokens(server):
    ids = httpx.post(f"{server.url}/tokenize", json={"content": PROMPT, "add_special": True}).json()["tokens"]
    by_text = post(server, "/completion", {"prompt": PROMPT, "n_predict": 8, "return_tokens": True}).json()
    by_ids = post(server, "/completion", {"prompt": ids, "n_predict": 8, "return_tokens": True}).json()
    assert by_ids["content"] == by_text["content"] and by_ids["tokens"] == by_text["tokens"] and len(by_ids["tokens"]) == 8
    text = httpx.post(f"{server.url}/detokenize", json={"tokens": by_ids["tokens"]}).json()["content"]
    assert text == by_ids["content"]


def test_a_stop_word_and_n_probs(server):
    whole = post(server, "/completion", {"prompt": PROMPT, "n_predict": 12}).json()["content"]
    word = whole.split()[1]
    stopped = post(server, "/completion", {"prompt": PROMPT, "n_predict": 12, "stop": [word]}).json()
    assert (
        stopped["stop_type"] == "word" and stopped["stopping_word"] == word and stopped["content"] == whole[: whole.index(word)]
    )
    scored = post(server, "/completion", {"prompt": PROMPT, "n_predict": 4, "n_probs": 3, "return_tokens": True}).json()
    probabilities = scored["completion_probabilities"]
    assert [p["id"] for p in probabilities] == scored["tokens"]
    assert all(len(p["top_logprobs"]) == 3 and p["top_logprobs"][0]["logprob"] >= p["logprob"] for p in probabilities)


def test_a_stream_is_chunks_ending_with_stop_and_no_done(server):
    whole = post(server, "/completion", {"prompt": PROMPT, "n_predict": 10}).json()
    with httpx.stream("POST", f"{server.url}/completion", json={"prompt": PROMPT, "n_predict": 10, "stream": True}) as response:
        lines = [line for line in response.iter_lines() if line]
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines]
    assert all(line.startswith("data: {") for line in lines)
    assert [c["stop"] for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert "".join(c["content"] for c in chunks) == whole["content"] and chunks[-1]["stop_type"] == "limit"


def test_a_stream_with_return_progress_reports_the_prompt_first(server):
    """A chunk at the start (what the slot held), one when the prompt is processed, then the text;
    the same prompt again is held by its slot but for the last token, which is decoded again."""
    body = {"prompt": PROMPT + " ran", "n_predict": 4, "stream": True, "return_progress": True}
    for turn in range(2):
        with httpx.stream("POST", f"{server.url}/completion", json=body) as response:
            chunks = [json.loads(line.removeprefix("data: ")) for line in response.iter_lines() if line]
        progress = [c["prompt_progress"] for c in chunks if "prompt_progress" in c]
        total = chunks[-1]["tokens_evaluated"]
        assert [p["processed"] for p in progress] == [progress[0]["cache"], total] and progress[0]["total"] == total
        assert all(c["content"] == "" for c in chunks[:2]) and chunks[-1]["stop"] is True
        assert progress[0]["cache"] == (total - 1 if turn else progress[0]["cache"]) and progress[1]["time_ms"] >= 0


def test_n_predict_0_processes_the_prompt_for_the_next_request(server):
    """llama.vscode's preparation: the extra files sent with n_predict 0 (and fields specrun does
    not read), so that the completion that follows finds them cached."""
    extra = [{"text": "x = 1\n" * 20, "time": 1733650000, "filename": "util.py"}]
    ready = {"input_prefix": "", "input_suffix": "", "input_extra": extra, "prompt": "", "n_predict": 0, "samplers": []}
    answer = post(server, "/infill", ready | {"t_max_prompt_ms": 500, "t_max_predict_ms": 1}).json()
    assert (answer["tokens_predicted"], answer["stop_type"]) == (1, "limit")  # as llama-server: the prefill's token
    asked = {"input_prefix": "def f():\n    return", "input_suffix": "\n", "input_extra": extra, "n_predict": 4}
    completion = post(server, "/infill", asked | {"samplers": ["top_k", "top_p", "infill"], "n_indent": 4}).json()
    # All the preparation's prompt but its last two tokens (the suffix and middle tokens, later in this one's)
    assert completion["tokens_predicted"] == 4 and completion["timings"]["cache_n"] == answer["tokens_evaluated"] - 2


def test_the_infill_prompt_is_llama_servers(fim_model):
    """Repo-level: the repository line, each extra file after a file separator, the current file's,
    then BOS, the prefix and the middle's start, the suffix, the middle token."""
    model = Model(fim_model)
    try:
        tokens = lambda text: model.tokenize(text, add_special=False, parse_special=False)  # noqa: E731
        infill = Infill("def add(a, b):\n    return", "\n\nprint(add(1, 2))\n", (("util.py", "x = 1\n"),), " a")
        built = infill_tokens(model, infill, n_batch=512, n_predict=-1, n_ctx=2048)
        extra = [REP, *tokens(REPOSITORY_LINE), SEP, *tokens("util.py\n"), *tokens("x = 1\n"), SEP, *tokens("filename\n")]
        middle = [model.bos, PRE, *tokens(infill.prefix), *model.tokenize(" a", False, True), SUF, *tokens(infill.suffix), MID]
        assert built == extra + middle
        # a long file: the prefix's last 3/4 of a batch, the suffix's first quarter but 2
        prefix, suffix = tokens("a " * 600), tokens("b " * 600)
        cut = infill_tokens(model, Infill("a " * 600, "b " * 600), n_batch=64, n_predict=-1, n_ctx=2048)
        assert cut[-(48 + 14 + 3) :] == [PRE, *prefix[-48:], SUF, *suffix[:14], MID] and cut[-(48 + 14 + 4)] == model.bos
    finally:
        model.close()


def test_infill_fills_the_middle_and_refuses_a_model_without_fim_tokens(server, tmp_path):
    body = {"input_prefix": "the cat sat", "input_suffix": "on the mat", "input_extra": [{"filename": "a.txt", "text": "dog"}]}
    filled = post(server, "/infill", body | {"n_predict": 6}).json()
    assert filled["tokens_predicted"] == 6 and filled["stop"] is True and filled["content"]
    plain = RunningServer(
        SessionConfig(target=write_tiny_llama(tmp_path / "plain.gguf"), n_ctx=512, threads=1), ServeOptions(port=0)
    )
    try:
        refused = post(plain, "/infill", body)
        assert refused.status_code == 400 and "Infill is not supported by this model" in refused.json()["error"]["message"]
    finally:
        plain.stop()


@pytest.mark.parametrize(
    "path, body, fragment",
    [
        ("/completion", {"prompt": [1, 10**6]}, "token id 1000000 is not in the vocabulary"),
        ("/completion", {"prompt": {"x": 1}}, "Invalid type for 'prompt'"),
        ("/completion", {"prompt": PROMPT, "n_probs": 99}, "n_probs"),
        ("/completion", {"prompt": PROMPT, "return_tokens": True, "stream": True}, "return_tokens"),
        ("/completion", {"prompt": PROMPT, "return_progress": True}, "return_progress"),
        ("/infill", {"input_suffix": "x"}, "Missing required parameter: 'input_prefix'"),
        ("/infill", {"input_prefix": "a", "input_suffix": "b", "input_extra": [{"filename": "f"}]}, "input_extra[0].text"),
    ],
)
def test_bad_native_requests_are_400s(server, path, body, fragment):
    response = post(server, path, body)
    assert response.status_code == 400 and fragment in response.json()["error"]["message"], response.text
    assert post(server, "/completion", {"prompt": PROMPT, "n_predict": 1}).json()["tokens_predicted"] == 1


def test_llama_servers_unprefixed_aliases(server):
    assert httpx.get(f"{server.url}/models").json()["data"] == httpx.get(f"{server.url}/v1/models").json()["data"]
    assert httpx.get(f"{server.url}/v1/health").json()["status"] == "ok"
    chat = post(server, "/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).json()
    assert chat["object"] == "chat.completion"
    assert post(server, "/responses", {"input": "hi", "max_output_tokens": 2}).json()["object"] == "response"


def test_props_slots_and_apply_template(server, fim_model):
    props = httpx.get(f"{server.url}/props").json()
    assert props["total_slots"] == 1 and props["default_generation_settings"]["n_ctx"] == 2048
    assert props["model_path"] == str(fim_model) and props["bos_token"] == "<s>"
    assert props["default_generation_settings"]["params"]["temperature"] == 0.0
    assert httpx.get(f"{server.url}/slots").json() == [{"id": 0, "n_ctx": 2048, "is_processing": False}]
    turns = [{"role": "user", "content": "hi"}]
    prompt = post(server, "/apply-template", {"messages": turns}).json()["prompt"]
    assert prompt == "User: hi\nAssistant:"  # no template in the file: the plain transcript
    assert post(server, "/apply-template", {"messages": turns, "add_generation_prompt": False}).json()["prompt"] == "User: hi\n"


def test_a_last_assistant_message_is_continued_as_llama_server_continues_it(server):
    """A prefill: the reply goes on from the assistant's text, as the same prompt sent to /completion does."""
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "the cat"}]
    assert post(server, "/apply-template", {"messages": turns}).json()["prompt"] == "User: hi\nAssistant:the cat"
    chat = post(server, "/v1/chat/completions", {"messages": turns, "max_tokens": 8}).json()
    native = post(server, "/completion", {"prompt": "User: hi\nAssistant:the cat", "n_predict": 8}).json()
    assert chat["choices"][0]["message"]["content"] == native["content"]
    explicit = {"messages": turns, "continue_final_message": True, "add_generation_prompt": False}
    assert post(server, "/apply-template", explicit).json()["prompt"] == "User: hi\nAssistant:the cat"


@pytest.mark.parametrize(
    "extra, fragment",
    [
        ({"messages": [{"role": "user", "content": "hi"}], "continue_final_message": True}, "send add_generation_prompt false"),
        (
            {
                "messages": [
                    {"role": "user", "content": "a"},
                    {"role": "assistant", "content": "b"},
                    {"role": "assistant", "content": "c"},
                ]
            },
            "two or more assistant messages",
        ),
        (
            {"messages": [{"role": "user", "content": "a"}], "continue_final_message": True, "add_generation_prompt": False},
            "must be an assistant's text",
        ),
        (
            {"messages": [{"role": "user", "content": "a"}], "continue_final_message": "reasoning_content"},
            "continue_final_message",
        ),
    ],
)
def test_continuations_llama_server_refuses_are_400s(server, extra, fragment):
    response = post(server, "/v1/chat/completions", extra | {"max_tokens": 2})
    assert response.status_code == 400 and fragment in response.json()["error"]["message"], response.text


def test_a_template_continues_inside_the_assistants_turn_and_can_leave_out_the_cue():
    template = lcf.Jinja2ChatFormatter(HERMES_TEMPLATE, eos_token="</s>", bos_token="<s>")
    bare = lcf.Jinja2ChatFormatter(HERMES_TEMPLATE, eos_token="</s>", bos_token="<s>", add_generation_prompt=False)
    chat = ChatFormat("hermes", template, "test", bare)
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "the cat "}]
    assert chat.render(turns, ending="continue").text.endswith("<|im_start|>assistant\nthe cat ")
    assert chat.render(turns[:1]).text.endswith("<|im_start|>assistant\n")
    assert chat.render(turns[:1], ending="none").text.endswith("hi<|im_end|>\n")
