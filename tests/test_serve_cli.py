"""`specrun serve` as a command: the URL and ready lines, the same greedy output as
`specrun generate`, one-line errors, and a clean exit on SIGINT and SIGTERM."""

import json
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

COMMON = ["--lookup", "--k", "4", "--ctx-size", "512", "--threads", "1"]
PROMPT = "the cat sat on the mat and the dog"


def start(*args) -> tuple[subprocess.Popen, str]:
    """Start `specrun serve` on a free port; return it and its URL once it says it is ready."""
    process = subprocess.Popen(
        [sys.executable, "-m", "specrun", "serve", "--port", "0", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        if found := re.search(r"listening on (http://\S+)", line):
            url = found[1]
        if line.startswith("ready: "):
            return process, url
    process.kill()
    raise AssertionError(f"no ready line; exit {process.wait()}: {process.stderr.read()}")


def stop(process: subprocess.Popen, sig: int) -> tuple[int, str]:
    process.send_signal(sig)
    try:
        _, err = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    return process.returncode, err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_serves_the_same_greedy_output_as_generate_and_stops_cleanly(tiny, sig):
    generated = subprocess.run(
        [sys.executable, "-m", "specrun", "generate", PROMPT, "--target", tiny["target"], "-n", "24", "--json", *COMMON],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    expected = json.loads(generated.stdout)["text"]
    process, url = start("--target", tiny["target"], *COMMON)
    try:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url)
        response = httpx.post(f"{url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 24, "temperature": 0}, timeout=60)
        assert response.json()["choices"][0]["text"] == expected
    finally:
        code, err = stop(process, sig)
    assert code == 0 and err.rstrip().endswith("stopped"), err
    assert "Traceback" not in err


def test_bad_options_and_a_port_in_use_are_one_line_errors(tiny):
    bad = subprocess.run(
        [sys.executable, "-m", "specrun", "serve", "--target", tiny["target"], "--queue", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and bad.stderr.strip() == "error: --queue has to be an integer from 1 to 1000000, but is 0"
    process, url = start("--target", tiny["target"], "--threads", "1", "--ctx-size", "256")
    try:
        port = url.rsplit(":", 1)[1]
        taken = subprocess.run(
            [sys.executable, "-m", "specrun", "serve", "--target", tiny["target"], "--port", port],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert taken.returncode == 2
        assert re.fullmatch(
            rf"error: cannot listen on 127\.0\.0\.1:{port} \(.+\): pick another --host or --port",
            taken.stderr.strip().splitlines()[-1],
        )
        assert "Traceback" not in taken.stderr
    finally:
        stop(process, signal.SIGTERM)
