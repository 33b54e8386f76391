"""The chat page in a real browser: Debian's Chromium, headless, driven by Playwright, against
`specrun serve` on tiny generated models (in-process where a test paces the decodes, the command
where the server has to go away and come back).

Skipped, saying why, only where Chromium or Playwright is missing; .ci/run installs both.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from serve_helpers import CHROMIUM_ARGS, TEMPLATE, Pace, RunningServer, wait_healthy
from tinymodels import write_tiny_llama

from specrun.config import SessionConfig

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is missing: pip install 'specrun[test]'")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Chromium is missing: apt-get install chromium"),
]

N_CTX = 512
REPEATING = "hello world hello world hello world hello"  # prompt lookup drafts from it
WAIT_MS = 30_000
FORCED = '<script>window.pwned = 1</script><img src="x" onerror="window.pwned = 2">'


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("page") / "chat.gguf", seed=0, chat_template=TEMPLATE)


@pytest.fixture(scope="module")
def pace() -> Pace:
    return Pace()


@pytest.fixture(scope="module")
def config(target) -> SessionConfig:
    return SessionConfig(target=target, lookup=True, store_tokens=400, k=4, n_ctx=N_CTX, threads=1)


@pytest.fixture(scope="module")
def server(config, pace):
    running = RunningServer(config, open_session=lambda: pace.open(config))
    yield running
    running.stop()


@pytest.fixture
def browser():
    """A fresh Chromium with its own profile; every request it makes is recorded."""
    with sync_api.sync_playwright() as playwright, tempfile.TemporaryDirectory() as profile:
        context = playwright.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
        )
        context.requested = []
        context.on("request", lambda request: context.requested.append(request.url))
        yield context
        context.close()


def wait_until(page, predicate: str, arg=None) -> None:
    """Until the JavaScript function `predicate` returns true (a function, not an expression: the
    page's policy forbids eval, and Playwright evaluates an expression with it)."""
    page.wait_for_function(predicate, arg=arg, timeout=WAIT_MS)


def open_page(browser, url: str):
    """The page at `url`, once its server panel has read the model; console errors fail the test."""
    page = browser.new_page()
    page.errors = []
    page.on("console", lambda message: message.type == "error" and page.errors.append(message.text))
    page.on("pageerror", lambda error: page.errors.append(str(error)))
    page.goto(url)
    wait_until(page, "() => document.getElementById('model').textContent !== '…'")
    return page


def send(page, text: str, max_tokens: int = 40, temperature: str = "0") -> None:
    page.fill("#temperature", temperature)
    page.fill("#max-tokens", str(max_tokens))
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")


def wait_done(page) -> None:
    wait_until(page, "() => document.getElementById('send').textContent === 'Send'")


def reply_text(page, turn: int = -1) -> str:
    return page.evaluate(f"[...document.querySelectorAll('.reply')].at({turn}).textContent")


def api_reply(server_url: str, text: str, max_tokens: int) -> str:
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "temperature": 0}
    return httpx.post(f"{server_url}/v1/chat/completions", json=body, timeout=60).json()["choices"][0]["message"]["content"]


def test_the_page_loads_its_panel_from_its_own_server_only(server, browser):
    page = open_page(browser, f"{server.url}/")
    assert page.text_content("#model") == "chat"  # the target file's name
    assert page.text_content("#draft") == "lookup + store, k 4"
    assert page.text_content("#context") == f"{N_CTX} tokens a slot"
    wait_until(page, "() => document.getElementById('slots').textContent === '0 of 1 busy'")
    assert page.text_content("#queue") == "0 waiting"
    assert page.is_hidden("#status")
    assert all(url.startswith(f"{server.url}/") for url in browser.requested), browser.requested
    assert page.errors == []


def test_keyboard_alone_reaches_every_control_in_order(server, browser):
    page = open_page(browser, f"{server.url}/")
    assert page.evaluate("document.activeElement.id") == "prompt"  # focused on load
    order = []
    for _ in range(7):
        page.keyboard.press("Tab")
        order.append(page.evaluate("document.activeElement.id"))
    assert order == ["send", "system", "temperature", "max-tokens", "json", "key", "schema"]
    labelled = page.evaluate("[...document.querySelectorAll('textarea, input')].every((el) => el.labels.length === 1)")
    assert labelled


def test_a_reply_streams_coloured_tokens_and_stats_that_update(server, browser, pace):
    page = open_page(browser, f"{server.url}/")
    pace.delay = 0.03  # about a second and a half for the reply: time to watch it stream
    try:
        send(page, REPEATING, max_tokens=50)
        wait_until(page, "() => /^\\d+ tokens/.test(document.querySelector('.stats').textContent)")
        early = page.text_content(".stats")
        wait_until(page, "(early) => document.querySelector('.stats').textContent !== early", early)
        assert page.text_content("#send") == "Stop"  # the stats changed while the reply streamed
        wait_done(page)
    finally:
        pace.delay = 0.0
    assert reply_text(page) == api_reply(server.url, REPEATING, 50)
    assert page.locator(".reply .src-draft").count() > 0 and page.locator(".reply .src-target").count() > 0
    stats = page.text_content(".stats")
    assert re.match(
        r"\d+ tokens · [\d.]+ tok/s · acceptance \d+% · mean accepted length [\d.]+ · k 4 \(last drafted \d\) · draft ", stats
    )
    assert re.search(r"draft .*(lookup|store)", stats), stats
    assert page.errors == []


def test_two_tabs_at_once_on_two_slots(config, pace, browser):
    parallel = replace(config, parallel=2, n_ctx=2 * N_CTX)
    running = RunningServer(parallel, open_session=lambda: pace.open(parallel))
    pace.delay = 0.05  # a reply takes a while even where lookup keeps many drafted tokens
    try:
        tabs = [open_page(browser, f"{running.url}/") for _ in range(2)]
        send(tabs[0], REPEATING, max_tokens=60)
        send(tabs[1], "the cat and the dog and the cat", max_tokens=60)
        # Both replies on their slots, the decodes are held until each tab has seen it: a page asks
        # /health once a second, and two short replies can overlap for less than that.
        deadline = time.monotonic() + 30
        while len(running.server.worker.running) < 2:
            assert time.monotonic() < deadline, "the two requests never ran together"
            time.sleep(0.005)
        pace.gate.clear()
        for tab in tabs:
            wait_until(tab, "() => document.getElementById('slots').textContent === '2 of 2 busy'")
        pace.gate.set()
        for tab in tabs:
            wait_done(tab)
        pace.delay = 0.0
        for tab, prompt in zip(tabs, [REPEATING, "the cat and the dog and the cat"]):
            assert reply_text(tab) == api_reply(running.url, prompt, 60)
            assert "tok/s" in tab.text_content(".stats") and tab.locator(".error").count() == 0
    finally:
        pace.delay = 0.0
        pace.gate.set()
        running.stop()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_command(target: Path, port: int) -> subprocess.Popen:
    """`specrun serve` on `port`, once it answers /health."""
    process = subprocess.Popen(
        [sys.executable, "-m", "specrun", "serve", "--target", str(target), "--port", str(port), "--ctx-size", str(N_CTX)]
        + ["--threads", "1", "--k", "4"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_healthy(f"http://127.0.0.1:{port}")
    except TimeoutError:
        process.kill()
        raise
    return process


def stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=60)


def test_a_server_that_goes_away_shows_one_line_and_the_page_recovers(target, browser):
    port = free_port()
    process = serve_command(target, port)
    try:
        page = open_page(browser, f"http://127.0.0.1:{port}/")
        send(page, REPEATING, max_tokens=12)
        wait_done(page)
        first = reply_text(page)
        stop(process)
        page.wait_for_selector("#status:not([hidden])", timeout=WAIT_MS)
        status = page.text_content("#status")
        assert "not answering" in status and "\n" not in status
        send(page, "anyone there?", max_tokens=12)
        page.wait_for_selector(".turn:nth-child(2) .error", timeout=WAIT_MS)
        assert page.input_value("#prompt") == "anyone there?"  # given back, to send again
        time.sleep(1.5)  # more failed polls: still the one line
        assert page.locator("#status").count() == 1 and page.text_content("#status") == status
        process = serve_command(target, port)
        page.wait_for_selector("#status", state="hidden", timeout=WAIT_MS)
        page.press("#prompt", "Enter")
        wait_done(page)
    finally:
        stop(process)
    assert reply_text(page, 0) == first and page.locator(".turn").count() == 3
    assert reply_text(page) and page.locator(".turn:last-child .error").count() == 0


def test_a_reply_holding_markup_shows_as_text(server, browser):
    """The grammar makes the model write a script and an image with an onerror handler: the page
    shows both as text. The page sends no grammar, so the test adds one to its request on the way."""
    page = open_page(browser, f"{server.url}/")

    def with_grammar(route):
        body = route.request.post_data_json
        route.continue_(post_data=json.dumps({**body, "grammar": "root ::= " + json.dumps(FORCED)}))

    page.route("**/v1/chat/completions", with_grammar)
    send(page, "write some markup", max_tokens=80)
    wait_done(page)
    assert reply_text(page) == FORCED
    assert page.evaluate("window.pwned") is None
    assert page.locator("#log script, #log img").count() == 0 and page.evaluate("document.scripts.length") == 1
    assert page.locator(".reply .src-grammar").count() > 0  # the forced tokens, coloured as such
    assert page.errors == []


def test_bad_input_shows_the_api_error_and_keeps_the_conversation(server, browser):
    page = open_page(browser, f"{server.url}/")
    send(page, REPEATING, max_tokens=8)
    wait_done(page)
    first = reply_text(page)
    too_long = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 100_000}
    expected = httpx.post(f"{server.url}/v1/chat/completions", json=too_long, timeout=60).json()["error"]["message"]
    send(page, "second", max_tokens=100_000)
    page.wait_for_selector(".turn:nth-child(2) .error", timeout=WAIT_MS)
    assert page.text_content(".turn:nth-child(2) .error") == expected
    assert page.input_value("#prompt") == "second"
    send(page, "third", max_tokens=8, temperature="-1")
    page.wait_for_selector(".turn:nth-child(3) .error", timeout=WAIT_MS)
    assert "temperature" in page.text_content(".turn:nth-child(3) .error")
    page.fill("#prompt", "   ")
    page.press("#prompt", "Enter")
    assert page.is_visible("#hint") and page.locator(".turn").count() == 3
    with page.expect_request("**/v1/chat/completions") as sent:
        send(page, "fourth", max_tokens=8)
    wait_done(page)
    messages = sent.value.post_data_json["messages"]
    assert messages == [
        {"role": "user", "content": REPEATING},
        {"role": "assistant", "content": first},
        {"role": "user", "content": "fourth"},
    ]
    assert reply_text(page, 0) == first and page.locator(".turn:last-child .error").count() == 0


def test_reply_as_json_holds_the_reply_to_the_schema_or_shows_why_not(server, browser):
    page = open_page(browser, f"{server.url}/")
    page.check("#json")
    page.fill("#schema", '{"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}')
    send(page, "a number, please", max_tokens=40)
    wait_done(page)
    assert re.fullmatch(r'\{"n": -?\d+\}', reply_text(page)), reply_text(page)
    assert page.locator(".reply .src-grammar").count() > 0
    page.fill("#schema", '{"type": "object",')
    send(page, "again", max_tokens=40)
    page.wait_for_selector(".turn:nth-child(2) .error", timeout=WAIT_MS)
    assert page.text_content(".turn:nth-child(2) .error").startswith("the JSON schema is not JSON")
    unenforceable = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3}}}
    expected = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "reply", "schema": unenforceable}},
        },
        timeout=60,
    ).json()["error"]["message"]
    page.fill("#schema", json.dumps(unenforceable))
    send(page, "once more", max_tokens=40)
    page.wait_for_selector(".turn:nth-child(3) .error", timeout=WAIT_MS)
    assert page.text_content(".turn:nth-child(3) .error") == expected
    assert re.fullmatch(r'\{"n": -?\d+\}', reply_text(page, 0))
