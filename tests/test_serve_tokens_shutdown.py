"""Stopping `specrun serve` while /tokenize and /detokenize run on other threads: the session
(and the model whose vocabulary they read) closes only after they end, so the command exits
cleanly and every call gets its answer or a clean refusal, never a 500 or a crash.

The command's test is the whole story, but it passes without the worker's guard too, by luck of
the event loop (asyncio's runner joins its threads before the session closes); the in-process
test holds a call inside the tokenizer and stops the worker under it, which only the guard survives."""

import signal
import threading
import time

import httpx
import pytest
from serve_helpers import RunningServer
from test_serve_cli import start, stop

from specrun.backend import Model
from specrun.config import SessionConfig
from specrun.serve import tokens

TEXT = "the cat sat on the mat and the dog said hello world. " * 4000  # ~60k tokens: each call takes a while
CALLERS = 4
CALLS = 50  # per caller, at most
WITHIN_S = 60  # and for at most this long


@pytest.fixture(scope="module")
def expected(tiny):
    """The tokens of TEXT and the text of its first half's tokens, as the target's vocabulary has them."""
    model = Model(tiny["target"])
    tokens = model.tokenize(TEXT, add_special=False)
    half = tokens[: len(tokens) // 2]
    text = model.render(half)
    model.close()
    return tokens, half, text


def call(url: str, n: int, expected) -> str:
    """One /tokenize (even n) or /detokenize call: "ok", "refused" (no connection or no answer),
    "unavailable" (a 503 in the error envelope), or what went wrong."""
    tokens, half, text = expected
    path, body = ("/tokenize", {"content": TEXT}) if n % 2 == 0 else ("/detokenize", {"tokens": half})
    try:
        response = httpx.post(f"{url}{path}", json=body, timeout=30)
    except httpx.TransportError:
        return "refused"
    if response.status_code == 503 and response.json()["error"]["code"] == "unavailable":
        return "unavailable"
    if response.status_code != 200:
        return f"{path}: {response.status_code} {response.text[:200]}"
    answer = response.json()
    right = answer["tokens"] == tokens if n % 2 == 0 else answer["content"] == text
    return "ok" if right else f"{path}: a wrong answer"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_stopping_the_server_during_tokenizer_calls(tiny, expected, sig):
    process, url = start("--target", tiny["target"], "--threads", "1", "--ctx-size", "256")
    outcomes: list[str] = []
    deadline = time.monotonic() + WITHIN_S

    def caller(first: int) -> None:
        for n in range(first, first + CALLS):
            outcome = call(url, n, expected)
            outcomes.append(outcome)
            if outcome in ("refused", "unavailable") or time.monotonic() > deadline:
                return  # the server is going: later calls would be refused too

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(CALLERS)]
    try:
        for thread in threads:
            thread.start()
        while len(outcomes) < CALLERS and time.monotonic() < deadline:  # the calls are in full flow
            time.sleep(0.01)
    finally:
        code, err = stop(process, sig)  # mid-stream: every caller has a call in flight or about to be
        for thread in threads:
            thread.join(timeout=WITHIN_S)
    assert code == 0 and err.rstrip().endswith("stopped"), f"exit {code}: {err}"  # -11: a crash in freed memory
    assert "Traceback" not in err, err
    assert "ok" in outcomes and set(outcomes) <= {"ok", "refused", "unavailable"}, outcomes


def test_stopping_the_worker_waits_for_a_tokenizer_call_and_refuses_new_ones(tiny, expected, monkeypatch):
    inside, release = threading.Event(), threading.Event()
    tokenize = tokens.tokenize

    def held(model, body):  # the call stays inside the tokenizer until released
        inside.set()
        release.wait(30)
        return tokenize(model, body)

    monkeypatch.setattr(tokens, "tokenize", held)
    server = RunningServer(SessionConfig(target=tiny["target"], n_ctx=256))
    worker, answers = server.server.worker, []
    caller = threading.Thread(target=lambda: answers.append(server.post("/tokenize", json={"content": TEXT})))
    stopping = threading.Thread(target=worker.stop)
    try:
        caller.start()
        assert inside.wait(30)
        stopping.start()
        stopping.join(0.5)
        assert stopping.is_alive() and not worker.session.target_model.closed  # the worker waits for the call
        refused = server.post("/detokenize", json={"tokens": [5]})
        assert refused.status_code == 503 and refused.json()["error"]["message"] == "the server is shutting down"
    finally:
        release.set()
        caller.join(30)
        stopping.join(30)
        server.stop()
    assert answers[0].status_code == 200 and answers[0].json()["tokens"] == expected[0]
    assert worker.session.target_model.closed  # and then closed the session
