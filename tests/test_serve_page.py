"""The chat page's server side, without a browser: the stream's opt-in `specrun` field through the
official openai client and raw HTTP, /specrun/server, and the page's files and headers.
(tests/test_page.py drives the page itself in Chromium.)"""

import re

import httpx
import pytest
from serve_helpers import TEMPLATE, Pace, RunningServer
from tinymodels import write_tiny_llama

from specrun.config import SessionConfig
from specrun.serve.page import STATIC
from specrun.serve.server import ServeOptions

N_CTX = 512
REPEATING = [{"role": "user", "content": "hello world hello world hello world hello"}]  # lookup drafts from it
# Text the grammar forces whole: it drafts it, under the name "grammar".
FORCED = "<script>window.pwned = 1</script>"
PAGE_LIMIT = 100_000  # bytes: the page and every file it loads


@pytest.fixture(scope="module")
def pace() -> Pace:
    return Pace()


@pytest.fixture(scope="module")
def server(tmp_path_factory, pace):
    target = write_tiny_llama(tmp_path_factory.mktemp("page") / "chat.gguf", seed=0, chat_template=TEMPLATE)
    config = SessionConfig(target=target, lookup=True, store_tokens=400, k=4, n_ctx=N_CTX, threads=1)
    running = RunningServer(config, open_session=lambda: pace.open(config))
    yield running
    running.stop()


def stream(server, **body):
    """The chunks of a streamed chat reply, as the openai client parses them."""
    return list(server.client().chat.completions.create(model="any", stream=True, temperature=0, **body))


def content(chunks) -> str:
    return "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)


def fields(chunks) -> list[dict]:
    return [chunk.model_extra["specrun"] for chunk in chunks if "specrun" in chunk.model_extra]


def test_the_field_splits_the_text_by_source_and_only_when_asked(server):
    asked = stream(server, messages=REPEATING, max_tokens=60, extra_body={"specrun": {"pieces": True}})
    plain = stream(server, messages=REPEATING, max_tokens=60)
    assert fields(plain) == []
    pieces = [piece for field in fields(asked) for piece in field.get("pieces", ())]
    assert "".join(piece["text"] for piece in pieces) == content(asked) == content(plain)
    assert {piece["source"] for piece in pieces} >= {"target", "draft"}
    assert all(("draft_source" in piece) == (piece["source"] == "draft") for piece in pieces)
    final = asked[-1]
    stats, timings = final.model_extra["specrun"]["stats"], final.model_extra["timings"]
    assert final.choices[0].finish_reason in ("stop", "length")
    assert (stats["tokens"], stats["drafted"], stats["accepted"]) == (
        timings["predicted_n"],
        timings["draft_n"],
        timings["draft_n_accepted"],
    )
    assert stats["k"] == "4" and stats["tokens_per_s"] > 0
    drafted_under = {piece["draft_source"] for piece in pieces if piece["source"] == "draft"}
    assert drafted_under <= {name for name, accepted in stats["accepted_by_source"].items() if accepted}


def test_completions_carry_the_field_too(server):
    chunks = list(
        server.client().completions.create(
            model="any",
            prompt="hello world hello world",
            max_tokens=30,
            temperature=0,
            stream=True,
            extra_body={"specrun": {"pieces": True}},
        )
    )
    pieces = [piece for field in fields(chunks) for piece in field.get("pieces", ())]
    assert pieces and "".join(piece["text"] for piece in pieces) == "".join(chunk.choices[0].text for chunk in chunks)


def test_running_stats_grow_chunk_by_chunk(server, pace):
    # Reports that arrive together go out as one chunk; on a busy machine a tiny model's whole reply
    # can arrive before the event loop wakes, so each step waits long enough for it to be sent alone.
    pace.delay = 0.05
    try:
        chunks = stream(server, messages=REPEATING, max_tokens=30, extra_body={"specrun": {"pieces": True}})
    finally:
        pace.delay = 0.0
    counts = [field["stats"]["tokens"] for field in fields(chunks)]
    assert len(counts) > 2 and counts == sorted(counts) and counts[0] < counts[-1]


def test_tokens_the_grammar_forced_are_drafted_under_grammar(server):
    chunks = stream(
        server,
        messages=REPEATING,
        max_tokens=64,
        extra_body={"specrun": {"pieces": True}, "grammar": f"root ::= {FORCED!r}".replace("'", '"')},
    )
    pieces = [piece for field in fields(chunks) for piece in field.get("pieces", ())]
    assert content(chunks) == FORCED
    assert pieces[0]["source"] == "target"  # the prefill's token: nothing was drafted before it
    # every draft is of what the grammar forces (a random target splits the text into other tokens at times)
    assert {piece.get("draft_source") for piece in pieces if piece["source"] == "draft"} == {"grammar"}
    assert chunks[-1].model_extra["timings"]["draft_n_grammar"] > 0


@pytest.mark.parametrize(
    "body, param, code",
    [
        ({"specrun": {"pieces": True}}, "specrun.pieces", "invalid_value"),  # not streamed
        (
            {"specrun": {"pieces": True}, "stream": True, "tools": [{"type": "function", "function": {"name": "f"}}]},
            "specrun.pieces",
            "unsupported_parameter",
        ),
        ({"max_tokens": N_CTX + 1}, "max_tokens", "context_length_exceeded"),
        ({"specrun": {"pieces": "yes"}}, "specrun.pieces", "invalid_type"),
    ],
)
def test_bad_requests_get_the_api_error_and_the_server_goes_on(server, body, param, code):
    response = server.post("/v1/chat/completions", json={"messages": REPEATING, **body})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (param, code), error
    assert content(stream(server, messages=REPEATING, max_tokens=4))


def test_specrun_server_says_how_the_server_drafts(server):
    assert httpx.get(f"{server.url}/specrun/server").json() == {
        "draft": {"sources": ["lookup", "store"], "model": None},
        "k": "4",
        "context_tokens": N_CTX,
    }


def test_the_page_and_its_files_come_with_a_policy_that_forbids_inline_script(server):
    page = httpx.get(f"{server.url}/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    loaded = re.findall(r'(?:src|href)="(/[^"]*)"', page.text)
    assert sorted(loaded) == ["/static/favicon.svg", "/static/page.css", "/static/page.js"]
    for response in [page, *(httpx.get(f"{server.url}{path}") for path in loaded)]:
        assert response.status_code == 200
        policy = dict(part.strip().split(" ", 1) for part in response.headers["content-security-policy"].split(";"))
        assert policy["default-src"] == policy["script-src"] == policy["connect-src"] == "'self'"
        assert "unsafe" not in response.headers["content-security-policy"]
    assert httpx.get(f"{server.url}/static/nothing.js").json()["error"]["type"] == "not_found_error"


def test_the_page_is_small_has_no_inline_script_and_writes_no_markup():
    files = {path.name: path.read_text() for path in STATIC.iterdir()}
    assert sum(len(text.encode()) for text in files.values()) < PAGE_LIMIT
    assert not re.search(r"<script(?![^>]*\bsrc=)|\son\w+=|\sstyle=", files["index.html"])
    assert not re.search(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(|new Function", files["page.js"])
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", "".join(files.values()))  # no other host


def test_an_api_key_guards_specrun_server_but_not_the_page(tmp_path):
    target = write_tiny_llama(tmp_path / "plain.gguf", seed=0, chat_template=TEMPLATE)
    running = RunningServer(SessionConfig(target=target, n_ctx=N_CTX, threads=1), ServeOptions(port=0, api_key="sesame"))
    try:
        assert httpx.get(f"{running.url}/").status_code == 200
        assert httpx.get(f"{running.url}/specrun/server").status_code == 401
        keyed = httpx.get(f"{running.url}/specrun/server", headers={"Authorization": "Bearer sesame"}).json()
        assert keyed["draft"] == {"sources": [], "model": None} and keyed["k"] == "plain"
    finally:
        running.stop()
