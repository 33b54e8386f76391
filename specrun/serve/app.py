"""The HTTP layer: FastAPI routes over the worker (each protocol's through serve/generation.py), API keys, error objects."""

from __future__ import annotations

import hmac
import ipaddress
import re
import socket
import time
from dataclasses import asdict
from typing import Callable

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException

from specrun import __version__
from specrun.backend import llama_cpp_version
from specrun.serve import api, messages, responses_api, responses_request, tokens
from specrun.serve import native as native_routes
from specrun.serve.api import GenerationRequest
from specrun.serve.api_errors import ApiError, body_error, setting_error
from specrun.serve.generation import OpenAIAnswer, Prepared, generate, parse_counted, prepared
from specrun.serve.messages import MessagesShape
from specrun.serve.metrics import MEDIA_TYPE, Metrics
from specrun.serve.native import NativeShape
from specrun.serve.page import add_page
from specrun.serve.responses import ChatShape, CompletionShape, Shape
from specrun.serve.worker import Worker
from specrun.settings import SettingError

# The names of this machine, for the Host check and for CORS alike: these, *.localhost and loopback addresses.
LOCAL_NAMES = ("localhost", socket.gethostname().lower())
# Browser pages served from this machine may call the API, as Ollama allows by default; other
# origins only when named (--cors-origin), since any web page could otherwise use the model.
LOCAL_ORIGINS = (
    r"(?i)https?://(" + "|".join(map(re.escape, LOCAL_NAMES)) + r"|[\w.-]+\.localhost|127(\.\d{1,3}){3}|\[::1\])(:\d+)?"
)


# The errors a request can meet that are answered with OpenAI's error object (error_object).
REQUEST_ERRORS = (ApiError, ValidationError, SettingError, HTTPException)


def create_app(
    worker: Worker,
    metrics: Metrics,
    model: str,
    api_key: str | None = None,
    cors_origins: tuple[str, ...] = (),
    local_hosts_only: bool = True,
) -> FastAPI:
    """`cors_origins`: browser origins allowed besides this machine's ("*": any).
    `local_hosts_only`: refuse requests addressed to another host name (for a loopback server)."""
    app = FastAPI(title="specrun", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(
        CORSMiddleware,
        allow_origins=list(cors_origins),
        allow_origin_regex=LOCAL_ORIGINS,
        allow_methods=["GET", "POST"],
        allow_headers=["*"],
        max_age=3600,
    )
    if local_hosts_only:
        app.add_middleware(LocalHostsOnly, metrics=metrics)
    for kind in REQUEST_ERRORS:
        app.add_exception_handler(kind, error_object)

    @app.get("/health")  # unkeyed: load balancers and supervisors ask it
    @app.get("/v1/health")
    async def health() -> JSONResponse:
        refusal = worker.unavailable()
        if refusal is not None:
            return error_response(refusal)
        return JSONResponse(
            {
                "status": "ok",
                "slots_idle": worker.n_slots - len(worker.running),
                "slots_processing": len(worker.running),
                "requests_waiting": worker.waiting,
            }
        )

    keyed = [Depends(key_check(api_key, metrics))]
    app.include_router(api_routes(worker, metrics, model), dependencies=keyed)
    app.include_router(anthropic_routes(worker, metrics, model), dependencies=keyed)
    app.include_router(responses_routes(worker, metrics, model), dependencies=keyed)
    app.include_router(llama_server_routes(worker, metrics, model), dependencies=keyed)
    app.include_router(tokens.routes(worker), dependencies=keyed)
    add_page(app)
    return app


def key_check(api_key: str | None, metrics: Metrics):
    """The dependency that refuses a request without `Authorization: Bearer KEY`, or `x-api-key: KEY`
    as Anthropic's clients send it (none without a key)."""

    def authorize(request: Request) -> None:
        if api_key is None:
            return
        scheme, _, bearer = request.headers.get("authorization", "").partition(" ")
        key = request.headers.get("x-api-key") or (bearer.strip() if scheme.lower() == "bearer" else "")
        if not hmac.compare_digest(key.encode(), api_key.encode()):
            metrics.reject("unauthorized")
            raise ApiError(
                401,
                "Incorrect or missing API key: send it as 'Authorization: Bearer KEY' (or 'x-api-key: KEY').",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return authorize


def api_routes(worker: Worker, metrics: Metrics, model: str) -> APIRouter:
    """The routes behind the API key: the model list, /metrics and the two generation endpoints
    (with tokens.routes', /tokenize and /detokenize)."""
    router = APIRouter()
    created = int(time.time())

    @router.get("/v1/models")
    @router.get("/models")  # llama-server's unprefixed alias
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model, "object": "model", "created": created, "owned_by": "specrun"}]}

    @router.get("/metrics")
    async def prometheus() -> Response:
        store = worker.session.store if worker.session is not None else None
        text = metrics.render(
            running=len(worker.running), waiting=worker.waiting, slots=worker.n_slots, store_tokens=len(store) if store else 0
        )
        return Response(text, media_type=MEDIA_TYPE)

    @router.get("/specrun/server")
    async def server() -> dict:
        """What the other endpoints do not say: how the server drafts, and a slot's context."""
        session = worker.ready()
        draft = session.config.draft
        return {
            "draft": {"sources": session.drafters.names, "model": draft.name if draft else None},
            "k": str(session.config.k) if session.drafter is not None else "plain",
            "context_tokens": session.target.n_ctx,
        }

    def answered(parse: Callable[[bytes], GenerationRequest], shape: type[Shape]) -> Callable[[bytes], Prepared]:
        return prepared(parse, lambda parsed: OpenAIAnswer(shape(model), parsed.include_usage))

    @router.post("/v1/chat/completions")
    @router.post("/chat/completions")  # llama-server's unprefixed alias
    async def chat_completions(request: Request) -> Response:
        return await generate(request, answered(api.parse_chat, ChatShape), worker, metrics)

    @router.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await generate(request, answered(api.parse_completion, CompletionShape), worker, metrics)

    return router


def llama_server_routes(worker: Worker, metrics: Metrics, model: str) -> APIRouter:
    """llama-server's native /completion (also /completions, as it maps it) and /infill
    (serve/native.py), /props, /slots (read-only) and /apply-template, behind the API key."""
    router = APIRouter()

    def native(parse: Callable[[bytes], GenerationRequest]) -> Callable[[bytes], Prepared]:
        return prepared(parse, lambda parsed: NativeShape(model, parsed))

    @router.post("/completion")
    @router.post("/completions")  # as llama-server maps it: its native completion, not OpenAI's
    async def native_completion(request: Request) -> Response:
        return await generate(request, native(native_routes.parse_completion), worker, metrics)

    @router.post("/infill")
    async def infill(request: Request) -> Response:
        return await generate(request, native(native_routes.parse_infill), worker, metrics)

    @router.get("/props")
    async def props() -> dict:
        return server_props(worker) | {"model_alias": model}

    @router.get("/slots")
    async def slots() -> list[dict]:
        return worker.slot_states()

    @router.post("/apply-template")
    async def apply_template(request: Request) -> dict:
        parsed = await parse_counted(request, api.parse_chat, metrics)
        return {"prompt": await tokens.off_thread(worker, lambda _: worker.prompt_text(parsed))}

    return router


def server_props(worker: Worker) -> dict:
    """llama-server's /props: the server's generation defaults, slots and model, its template and
    special tokens."""
    session = worker.ready()
    model = session.target_model
    sampler = {name: value for name, value in asdict(worker.defaults).items() if name != "logit_bias"}
    return {
        "default_generation_settings": {"n_ctx": session.target.n_ctx, "params": sampler},
        "total_slots": worker.n_slots,
        "model_path": str(model.path),
        "chat_template": model.chat_template or "",
        "bos_token": model.token_bytes(model.bos, True).decode("utf-8", "replace") if model.bos >= 0 else "",
        "eos_token": model.token_bytes(model.eos, True).decode("utf-8", "replace") if model.eos >= 0 else "",
        "modalities": {"vision": False, "audio": False},
        "build_info": f"specrun {__version__}, llama-cpp-python {llama_cpp_version()}",
        "is_sleeping": False,
    }


def anthropic_routes(worker: Worker, metrics: Metrics, model: str) -> APIRouter:
    """Anthropic's Messages API (serve/messages.py) behind the API key: its errors in its envelope (error_object)."""
    router = APIRouter()

    @router.post("/v1/messages")
    async def anthropic_messages(request: Request) -> Response:
        prepare = prepared(messages.parse_messages, lambda parsed: MessagesShape(model, parsed))
        return await generate(request, prepare, worker, metrics)

    @router.post("/v1/messages/count_tokens")
    async def anthropic_count_tokens(request: Request) -> dict:
        parsed = await parse_counted(request, messages.parse_count, metrics)
        return {"input_tokens": await tokens.off_thread(worker, lambda _: worker.count_prompt_tokens(parsed))}

    return router


def responses_routes(worker: Worker, metrics: Metrics, model: str) -> APIRouter:
    """OpenAI's Responses API (serve/responses_request.py, serve/responses_api.py) behind the API key, with the responses it keeps."""
    router = APIRouter()
    store = responses_request.ResponseStore()

    @router.post("/v1/responses")
    @router.post("/responses")  # llama-server's unprefixed alias
    async def create_response(request: Request) -> Response:
        def prepare(raw: bytes) -> Prepared:
            parsed = responses_request.parse_responses(raw, store)
            return parsed.request, responses_api.ResponsesShape(model, parsed, store)

        return await generate(request, prepare, worker, metrics)

    @router.get("/v1/responses/{response_id}")
    async def retrieve_response(response_id: str) -> dict:
        return store.find(response_id).body

    return router


async def error_object(request: Request, error: Exception) -> JSONResponse:
    """The one handler of every error a request meets: OpenAI's error object with its status, or
    Anthropic's envelope on its routes."""
    if not isinstance(error, REQUEST_ERRORS):  # Starlette calls it only for those it is registered for
        raise error
    answered = as_api_error(request, error)
    if request.url.path.startswith("/v1/messages"):
        return JSONResponse(messages.error_body(answered), status_code=answered.status, headers=answered.headers)
    return error_response(answered)


def as_api_error(request: Request, error: ApiError | ValidationError | SettingError | HTTPException) -> ApiError:
    """Any error a request meets, as the ApiError that answers it."""
    match error:
        case ApiError():
            return error
        case ValidationError():
            return body_error(error)
        case SettingError():
            return setting_error(error)
        case _:
            kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
            return ApiError(
                error.status_code, f"{request.method} {request.url.path}: {error.detail}", kind=kind, headers=error.headers
            )


def error_response(error: ApiError) -> JSONResponse:
    """OpenAI's error object with the error's status and headers."""
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


class LocalHostsOnly:
    """Answers 403 to a request whose Host header names another machine, as Ollama does on
    loopback: a web page whose domain an attacker points at 127.0.0.1 (DNS rebinding) would
    otherwise reach the API as its own origin, past CORS."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send) -> None:
        host = Headers(scope=scope).get("host", "") if scope["type"] == "http" else ""
        if is_local_host(host):
            await self.app(scope, receive, send)
            return
        self.metrics.reject("host")
        error = ApiError(
            403,
            f"Host {host!r} is not this machine: a server on loopback answers only requests to "
            "localhost or 127.0.0.1 (start it with --host to serve others).",
            code="forbidden_host",
            kind="permission_error",
        )
        await error_response(error)(scope, receive, send)


def is_local_host(host: str) -> bool:
    """Whether a Host header (name or address, with or without a port) names this machine; an
    absent one (HTTP/1.0 clients, never browsers) passes."""
    name = (host[1:].partition("]")[0] if host.startswith("[") else host.partition(":")[0]).lower()  # no port
    if not name or name in LOCAL_NAMES or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
