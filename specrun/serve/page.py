"""The chat page beside the API: `GET /` and its files under /static, shipped inside the package
(specrun/serve/static, no build step), with headers that keep whatever a model writes from
running as script in it.

The page asks for the stream's `specrun` field (serve/sources.py) to colour each token by how
it came; it reads the model's name from /v1/models, the slots from /health and the draft from
/specrun/server.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, Response
from starlette.staticfiles import StaticFiles

STATIC = Path(__file__).parent / "static"
# No inline script or style, nothing from another origin, no framing; requests only to this server.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
PAGE_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",  # a new specrun's page replaces the old one at once
}


class PageFiles(StaticFiles):
    """The page's files, each with the page's headers."""

    def file_response(self, *args, **kwargs) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers.update(PAGE_HEADERS)
        return response


def add_page(app: FastAPI) -> None:
    """`GET /` and `/static/...`, unkeyed: the page holds nothing secret, and asks for a key when the API wants one."""
    app.mount("/static", PageFiles(directory=STATIC), name="static")

    @app.api_route("/", methods=["GET", "HEAD"])  # HEAD: clients (Claude Code) check that the server is there
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers=PAGE_HEADERS)
