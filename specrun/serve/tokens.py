"""llama-server's /tokenize and /detokenize: the target's token ids for text and back, which a
client needs for `logit_bias` and to count tokens."""

from __future__ import annotations

import asyncio
from typing import Callable, TypeVar

from fastapi import APIRouter, Request

from specrun.backend import Model
from specrun.serve.api_errors import ApiError, invalid_value
from specrun.serve.bodies import DetokenizeBody, TokenizeBody
from specrun.serve.worker import Worker
from specrun.session import Session

Answer = TypeVar("Answer")


def routes(worker: Worker) -> APIRouter:
    """POST /tokenize and /detokenize, answered off the model's thread, so a generation does not hold
    them up: the vocabulary is read-only, and each token's text is read into a buffer of its own."""
    router = APIRouter()

    @router.post("/tokenize")
    async def tokenize_route(request: Request) -> dict:
        body = TokenizeBody.model_validate_json(await request.body())
        return await off_thread(worker, lambda session: tokenize(session.target_model, body))

    @router.post("/detokenize")
    async def detokenize_route(request: Request) -> dict:
        body = DetokenizeBody.model_validate_json(await request.body())
        return await off_thread(worker, lambda session: detokenize(session.target_model, body))

    return router


async def off_thread(worker: Worker, work: Callable[[Session], Answer]) -> Answer:
    """work(the loaded session) on the worker's tokenizer threads, not the event loop's: the
    session closes once they are done, so no call outlives it, not even one whose await was
    cancelled (uvicorn's grace period ended) and whose thread runs on."""
    session = worker.ready()
    try:
        answer = asyncio.get_running_loop().run_in_executor(worker.tokenizers, work, session)
    except RuntimeError:  # the threads are shut down: the session is closing
        raise worker.unavailable() or ApiError(
            503, "the server is shutting down", code="unavailable", kind="unavailable_error"
        ) from None
    return await answer


def tokenize(model: Model, body: TokenizeBody) -> dict:
    """As llama-server: no start token unless `add_special`, special tokens written as text parsed
    as such unless `parse_special` is false; `with_pieces`: each id with its text (its bytes, as
    an array of numbers, where they are not UTF-8 on their own)."""
    tokens = model.tokenize(body.content, add_special=bool(body.add_special), parse_special=body.parse_special is not False)
    if not body.with_pieces:
        return {"tokens": tokens}
    return {"tokens": [{"id": token, "piece": _piece(model.token_bytes(token, special=True))} for token in tokens]}


def detokenize(model: Model, body: DetokenizeBody) -> dict:
    """The text of the ids, control tokens spelled out (`<end_of_turn>`), as llama-server writes them."""
    for i, token in enumerate(body.tokens):
        if not 0 <= token < model.n_vocab:
            raise invalid_value(f"tokens[{i}]", f"it has to be a token id from 0 to {model.n_vocab - 1}, but is {token}.")
    return {"content": model.render(body.tokens)}


def _piece(raw: bytes) -> str | list[int]:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)
