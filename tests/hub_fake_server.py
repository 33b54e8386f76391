"""A local HTTP server that answers the Hugging Face hub's API, for the hub tests.

It serves what huggingface_hub asks for: GET /api/models/{repo}[/revision/{rev}]
(?blobs=true lists sizes and LFS sha256), and HEAD/GET /{repo}/resolve/{rev}/{file}
with X-Repo-Commit, X-Linked-Etag, X-Linked-Size and Range support. Gated repos answer
401/403 with X-Error-Code: GatedRepo like the real hub.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

RESOLVE_RE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
API_RE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+?)(?:/revision/(?P<rev>[^/]+))?$")


@dataclass
class FakeRepo:
    files: dict[str, bytes]
    commit: str
    gated: bool = False
    served: dict[str, bytes] = field(default_factory=dict)  # bytes sent instead of the listed ones

    def sha256(self, path: str) -> str:
        return hashlib.sha256(self.files[path]).hexdigest()


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    authorization: str | None


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.requests: list[Request] = []
        self.drop_once: set[str] = set()  # file paths whose next GET stops halfway
        self.tokens_with_access = {"hf_granted"}
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def add_repo(self, repo: str, files: dict[str, bytes], gated: bool = False) -> FakeRepo:
        commit = hashlib.sha1((repo + "".join(sorted(files))).encode()).hexdigest()
        self.repos[repo] = FakeRepo(files, commit, gated)
        return self.repos[repo]

    def downloads(self) -> list[Request]:
        return [r for r in self.requests if r.method == "GET" and "/resolve/" in r.path]

    def __enter__(self) -> "FakeHub":
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_: object) -> None:  # keep pytest output clean
            pass

        def do_GET(self) -> None:
            self._route(send_body=True)

        def do_HEAD(self) -> None:
            self._route(send_body=False)

        def _route(self, send_body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            hub.requests.append(Request(self.command, path, self.headers.get("Range"), self.headers.get("Authorization")))
            if (match := API_RE.match(path)) and send_body:
                self._model_info(match["repo"])
            elif match := RESOLVE_RE.match(path):
                self._resolve(match["repo"], match["file"], send_body)
            else:
                self._error(404, "NotFound", "no such route")

        def _model_info(self, repo_id: str) -> None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                return self._error(401, "RepoNotFound", "Repository not found")
            siblings = [
                {
                    "rfilename": name,
                    "size": len(data),
                    "blobId": hashlib.sha1(data).hexdigest(),
                    "lfs": {"size": len(data), "sha256": repo.sha256(name), "pointerSize": 134},
                }
                for name, data in sorted(repo.files.items())
            ]
            body = {
                "id": repo_id,
                "sha": repo.commit,
                "gated": "manual" if repo.gated else False,
                "private": False,
                "siblings": siblings,
            }
            self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"}, True)

        def _resolve(self, repo_id: str, name: str, send_body: bool) -> None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                return self._error(401, "RepoNotFound", "Repository not found")
            if repo.gated and not self._granted():
                status = 403 if self.headers.get("Authorization") else 401
                return self._error(status, "GatedRepo", f"Access to model {repo_id} is restricted.")
            if name not in repo.files:
                return self._error(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": repo.commit})
            data = repo.served.get(name, repo.files[name])
            sha = repo.sha256(name)
            headers = {
                "X-Repo-Commit": repo.commit,
                "ETag": f'"{sha}"',
                "X-Linked-Etag": f'"{sha}"',
                "X-Linked-Size": str(len(data)),
                "Accept-Ranges": "bytes",
            }
            start = self._range_start()
            if start:
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            body = data[start:]
            if send_body and name in hub.drop_once:
                hub.drop_once.discard(name)
                return self._send_half_and_drop(206 if start else 200, body, headers)
            self._send(206 if start else 200, body, headers, send_body)

        def _granted(self) -> bool:
            auth = self.headers.get("Authorization") or ""
            return auth.removeprefix("Bearer ") in hub.tokens_with_access

        def _range_start(self) -> int:
            match = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
            return int(match.group(1)) if match else 0

        def _error(self, status: int, code: str, message: str, extra: dict[str, str] | None = None) -> None:
            headers = {"X-Error-Code": code, "X-Error-Message": message, **(extra or {})}
            body = json.dumps({"error": message}).encode()
            self._send(status, body, {"Content-Type": "application/json", **headers}, self.command != "HEAD")

        def _send(self, status: int, body: bytes, headers: dict[str, str], send_body: bool) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if send_body:
                self.wfile.write(body)

        def _send_half_and_drop(self, status: int, body: bytes, headers: dict[str, str]) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True

    return Handler
