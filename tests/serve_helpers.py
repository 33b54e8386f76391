"""Running `specrun serve` in-process for tests (not a test module itself).

`RunningServer` starts the server on a free loopback port in a thread and stops it by
its handle; `Pace` slows and counts the target's decodes, so a test can hold a
generation on the model long enough to disconnect from it or fill the queue behind it.
"""

from __future__ import annotations

import threading
import time

import httpx
from openai import OpenAI

from specrun.config import SessionConfig
from specrun.serve.server import ServeOptions, Server
from specrun.session import Session

# A Jinja template in the style of real GGUFs (trims content like Gemma's), so chat goes through one.
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] | trim }}{{ eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


class Pace:
    """Wraps a session's target decodes: sleeps `delay` seconds before each, counts them,
    and while `gate` is clear, holds them until it is set."""

    def __init__(self) -> None:
        self.delay = 0.0
        self.decodes = 0
        self.gate = threading.Event()
        self.gate.set()

    def open(self, config: SessionConfig) -> Session:
        session = Session(config)
        decode = session.target.decode_many  # the server's batch decodes every request's rows through it

        def paced(parts):
            self.decodes += 1
            self.gate.wait(30)
            if self.delay:
                time.sleep(self.delay)
            return decode(parts)

        session.target.decode_many = paced
        return session


def wait_healthy(url: str, timeout: float = 60) -> None:
    """Until the server at `url` answers /health with 200 (a TimeoutError after `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"the server at {url} did not become ready")


class RunningServer:
    def __init__(self, config: SessionConfig, options: ServeOptions | None = None, open_session=None, wait: bool = True):
        options = options or ServeOptions(port=0)
        self.server = Server(config, options, open_session=open_session)
        self.url = self.server.url
        self.thread = threading.Thread(target=self.server.run, name="test-server", daemon=True)
        self.thread.start()
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout: float = 60) -> None:
        wait_healthy(self.url, timeout)

    def client(self, api_key: str = "none") -> OpenAI:
        return OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, timeout=60)

    def post(self, path: str, **kwargs) -> httpx.Response:
        kwargs.setdefault("timeout", 60)
        return httpx.post(f"{self.url}{path}", **kwargs)

    def wait_idle(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        worker = self.server.worker
        while worker.running or worker.waiting:
            if time.monotonic() > deadline:
                raise TimeoutError("the model did not become idle")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.stop()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()


# Chromium as root in a container, talking to nothing but the server under test.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
