"""`specrun serve`: an OpenAI-compatible HTTP server with speculative decoding."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Optional
from urllib.parse import urlsplit

import typer

from specrun.chat.formats import PLAIN, check_format_name
from specrun.cli import options as o
from specrun.cli.app import app, err_console
from specrun.config import SessionConfig
from specrun.drafts.store import DEFAULT_LIMIT
from specrun.errors import SpecrunError
from specrun.headers.read import read_keys
from specrun.hub.memory import ram_available_bytes
from specrun.pair.cost import kv_cache_bytes
from specrun.session import Session
from specrun.settings import check

PARALLEL = 4  # requests served at once by default, where memory holds their caches


def checked_origins(param: typer.CallbackParam, values: list[str] | None) -> list[str] | None:
    """Origins as browsers send them: scheme://host[:port], no path (one trailing / is dropped)."""
    checked = []
    for value in values or []:
        origin = value.removesuffix("/")
        parts = urlsplit(origin)
        if origin != "*" and not (
            parts.scheme in ("http", "https") and parts.hostname and not (parts.path or parts.query or parts.fragment)
        ):
            raise SpecrunError(
                f"--cors-origin {value!r} is not an origin: give scheme://host[:port], e.g. http://localhost:3000, or * for any"
            )
        checked.append(origin)
    return checked


Lookup = Annotated[
    bool,
    typer.Option("--lookup/--no-lookup", help="Draft by prompt lookup (n-grams copied from the request); with --draft: hybrid."),
]
MaxTokens = Annotated[
    Optional[int],
    typer.Option("--max-tokens", "-n", help="Most tokens per request that names none (default: until the context is full)."),
]
Host = Annotated[str, typer.Option("--host", help="Address to listen on (0.0.0.0: every interface; mind --api-key).")]
Port = Annotated[int, typer.Option("--port", help="Port to listen on (0: any free one).")]
ApiKey = Annotated[
    Optional[str],
    typer.Option(
        "--api-key",
        envvar="SPECRUN_API_KEY",
        help="Require 'Authorization: Bearer KEY' (also $SPECRUN_API_KEY; default: no key).",
    ),
]
CorsOrigin = Annotated[
    Optional[list[str]],
    typer.Option(
        "--cors-origin",
        callback=checked_origins,
        help="A browser origin allowed to call the API besides this machine's own pages (scheme://host[:port]; '*': any), once per origin (default: none).",
    ),
]
Parallel = Annotated[
    Optional[int],
    typer.Option(
        "--parallel",
        "-np",
        help="Requests run at once, each with --ctx-size tokens of context (default: up to 4, as many as memory holds).",
    ),
]
Queue = Annotated[int, typer.Option("--queue", help="Requests that may wait beyond those running; more get HTTP 429.")]
GrammarDrafts = Annotated[
    bool,
    typer.Option("--grammar-drafts/--no-grammar-drafts", help="Draft what a request's grammar (response_format, tools) forces."),
]


@app.command()
@o.model_options
def serve(
    lookup: Lookup = True,
    store_tokens: o.StoreTokens = DEFAULT_LIMIT,
    k: o.K = "auto",
    max_tokens: MaxTokens = None,
    chat_format: o.ChatFormat = None,
    host: Host = "127.0.0.1",
    port: Port = 8080,
    api_key: ApiKey = None,
    cors_origin: CorsOrigin = None,
    parallel: Parallel = None,
    queue: Queue = 32,
    grammar_drafts: GrammarDrafts = True,
    *,
    model: o.ModelOptions,
) -> None:
    """Serve the target over an OpenAI-compatible API (/v1/chat/completions, /v1/completions), drafting as generate does."""
    # uvicorn and FastAPI load only for this command: every other command would pay their import
    # (docs/benchmarks.md, "Small costs behind the code").
    from specrun.serve.server import ServeOptions, Server

    if api_key is not None and not api_key.strip():
        raise SpecrunError("--api-key is empty: give a key, or leave the option out to serve without one")
    if chat_format not in (None, PLAIN):
        check_format_name(chat_format)  # before minutes of model loading
    options = ServeOptions(
        host=host,
        port=port,
        api_key=api_key,
        queue=queue,
        max_tokens=max_tokens,
        chat_format=chat_format,
        cors_origins=tuple(cors_origin or ()),
        grammar_drafts=grammar_drafts,
    )
    config = model.session_config(lookup, k, store_tokens)
    if parallel is not None:
        check(parallel=parallel)  # before minutes of model loading; 0 is not "choose for me"
    slots = auto_parallel(config, model.ctx_size) if parallel is None else parallel
    config = replace(config, parallel=slots, n_ctx=model.ctx_size * slots)  # each request gets --ctx-size
    server = Server(config, options, on_ready=lambda session: note(f"ready: {describe(config, session)}"))
    note(f"specrun serve: listening on {server.url} (loading {config.target.name}; /health answers 503 until ready)")
    server.run()
    note("stopped")


def auto_parallel(config: SessionConfig, ctx_size: int) -> int:
    """Up to PARALLEL slots, as many as memory holds beside the weights, each with ctx_size tokens of
    KV cache (one where memory is unknown)."""
    kv, free = kv_cache_bytes(read_keys(config.target).meta, ctx_size), ram_available_bytes()
    if kv is None or free is None:
        return 1
    return max(1, min(PARALLEL, (free - config.target.stat().st_size) // kv))


def describe(config: SessionConfig, session: Session) -> str:
    drafting = [
        name
        for name, on in (
            ("prompt lookup", config.lookup),
            (f"store of {config.store_tokens} tokens", session.store is not None),
            (config.draft.name if config.draft else "", config.draft),
        )
        if on
    ]
    drafting += [f"{name} drafts" for name in config.sources]  # registered sources: mtp, the target's own MTP layers
    how = " + ".join(drafting) + f", k {config.k}" if drafting else "plain decoding"
    return f"{config.target.name} ({how}; {config.parallel} slot(s) of {session.target.n_ctx} tokens of context)"


def note(text: str) -> None:
    """A line on stderr, never wrapped (scripts wait for these lines)."""
    err_console.print(text, markup=False, highlight=False, soft_wrap=True)
