"""A local stand-in for the Hugging Face hub, enough for `pair` (not a test module).

Serves `/{owner}/{repo}/resolve/{revision}/{path}` with HTTP Range support and counts
the bytes it sends, so tests can prove only headers were read; `/api/models?search=`
lists repositories with their files (siblings) like the hub's model search.
"""

from __future__ import annotations

import json
import re
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator
from urllib.parse import parse_qs, unquote, urlparse

RANGE = re.compile(r"bytes=(\d+)-(\d*)")
RESOLVE = re.compile(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)")
MODEL_INFO = re.compile(r"/api/models/([^/]+/[^/]+?)(?:/revision/[^/]+)?")
COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    def __init__(self) -> None:
        self.files: dict[tuple[str, str], Path] = {}  # (repo, path in repo) -> local file
        self.gated: set[str] = set()
        self.bytes_sent = 0
        self.requests: list[str] = []
        self.honour_range = True
        self.url = ""

    def add(self, repo: str, filename: str, local: Path) -> None:
        self.files[(repo, filename)] = Path(local)

    def repos(self) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for repo, filename in self.files:
            found.setdefault(repo, []).append(filename)
        return found


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # keep test output clean
            pass

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            hub.requests.append(self.path)
            parsed = urlparse(self.path)
            if parsed.path == "/api/models":
                return self._search(parse_qs(parsed.query))
            info = MODEL_INFO.fullmatch(unquote(parsed.path))
            if info:
                return self._model_info(info.group(1))
            match = RESOLVE.fullmatch(unquote(parsed.path))
            if not match:
                return self._send(404, b"not found")
            repo, _revision, filename = match.groups()
            if repo in hub.gated:
                return self._send(401, b"gated")
            local = hub.files.get((repo, filename))
            if local is None:
                return self._send(404, b"entry not found")
            self._send_file(local)

        def _send_file(self, local: Path) -> None:
            data = local.read_bytes()
            wanted = RANGE.fullmatch(self.headers.get("Range", "")) if hub.honour_range else None
            if wanted is None:
                return self._send(200, data)
            start = int(wanted.group(1))
            end = min(int(wanted.group(2) or len(data) - 1), len(data) - 1)
            if start >= len(data):
                return self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
            self._send(206, data[start : end + 1], {"Content-Range": f"bytes {start}-{end}/{len(data)}"})

        def _model_info(self, repo: str) -> None:
            files = hub.repos().get(repo)
            if files is None:
                return self._send(401, b"{}", {"X-Error-Code": "RepoNotFound"})
            siblings = [_sibling(hub.files[(repo, f)], f) for f in files]
            body = {"id": repo, "sha": COMMIT, "gated": repo in hub.gated and "manual", "private": False, "siblings": siblings}
            self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"})

        def _search(self, query: dict[str, list[str]]) -> None:
            term = query.get("search", [""])[0].lower()
            models = [
                {"id": repo, "tags": ["gguf"], "siblings": [_sibling(hub.files[(repo, f)], f) for f in files]}
                for repo, files in hub.repos().items()
                if term in repo.lower()
            ]
            self._send(200, json.dumps(models).encode(), {"Content-Type": "application/json"})

        def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                return  # the client stopped reading (e.g. after refusing a 200 answer)
            hub.bytes_sent += len(body)

    return Handler


def _sibling(local: Path, name: str) -> dict[str, object]:
    size = local.stat().st_size
    return {"rfilename": name, "size": size, "lfs": {"size": size, "sha256": "0" * 64, "pointerSize": 134}}


@contextmanager
def serve() -> Iterator[FakeHub]:
    hub = FakeHub()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
