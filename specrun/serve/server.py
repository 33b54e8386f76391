"""Runs the app with uvicorn on a bound socket while the worker loads the model.

The socket is bound first, so a port in use fails at once and port 0 picks a free one;
/health answers 503 while the model loads. SIGINT and SIGTERM stop every generation at
its next step, let the responses end, and close the session.
"""

from __future__ import annotations

import contextlib
import ipaddress
import signal
import socket
import threading
from dataclasses import dataclass
from typing import Callable, Iterator

import uvicorn

from specrun.config import SessionConfig
from specrun.errors import SpecrunError
from specrun.serve.app import create_app
from specrun.serve.metrics import Metrics
from specrun.serve.worker import Worker
from specrun.session import Session
from specrun.settings import check


@dataclass(frozen=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    queue: int = 32  # requests that may wait while one runs
    max_tokens: int | None = None  # per request when it names none; None: until the context is full
    chat_format: str | None = None
    model_name: str | None = None  # the id /v1/models reports (default: the target file's name)
    cors_origins: tuple[str, ...] = ()  # browser origins allowed besides loopback ones ("*": any)
    grammar_drafts: bool = True  # a request held to a grammar drafts what the grammar forces

    def __post_init__(self) -> None:
        check(port=self.port, queue=self.queue, max_tokens=self.max_tokens)


class Server:
    def __init__(
        self,
        config: SessionConfig,
        options: ServeOptions = ServeOptions(),
        on_ready: Callable[[Session], None] = lambda session: None,
        open_session: Callable[[], Session] | None = None,
    ):
        self.metrics = Metrics()
        self.worker = Worker(
            open_session or (lambda: Session(config)),
            self.metrics,
            options.queue,
            options.max_tokens,
            options.chat_format,
            on_ready=on_ready,
            on_failed=lambda error: self.stop(),
            grammar_drafts=options.grammar_drafts,
            slots=config.parallel,
        )
        model = options.model_name or config.target.stem
        self.socket = bind(options.host, options.port)
        host, port = self.socket.getsockname()[:2]
        # Only a server other machines can reach answers to their names.
        self.app = create_app(
            self.worker,
            self.metrics,
            model,
            options.api_key,
            options.cors_origins,
            local_hosts_only=ipaddress.ip_address(host).is_loopback,
        )
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
        self._uvicorn = _Uvicorn(
            uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=5),
            on_exit=self.worker.cancel_all,
        )

    def run(self) -> None:
        """Serve until stop() or a signal; raise the model's loading error, if that is why it stopped."""
        self.worker.start()
        try:
            self._uvicorn.run(sockets=[self.socket])
        finally:
            self.worker.stop()
            self.socket.close()
        error = self.worker.error
        if isinstance(error, SpecrunError):
            raise error
        if error is not None:
            raise SpecrunError(f"the model failed to load: {error}") from error

    def stop(self) -> None:
        """From any thread: end every generation and shut down."""
        self.worker.cancel_all()
        self._uvicorn.should_exit = True


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket. Made with IPPROTO_TCP, so asyncio sets TCP_NODELAY on its
    connections: without it a response's body waits ~40 ms for the client's delayed ACK."""
    sock = None
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)[0]
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen()
        return sock
    except OSError as exc:
        if sock is not None:
            sock.close()
        raise SpecrunError(f"cannot listen on {host}:{port} ({exc.strerror or exc}): pick another --host or --port") from None


class _Uvicorn(uvicorn.Server):
    """uvicorn that first cancels the generations on SIGINT/SIGTERM, and returns afterwards
    instead of raising the signal again, so the session closes and the command exits 0."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]):
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig: int, frame) -> None:
        self._on_exit()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
