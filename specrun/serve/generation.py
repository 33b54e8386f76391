"""One generation request over HTTP, whatever its protocol: parsed into the request the worker runs
and the protocol's `Answer`, queued, and answered whole or as server-sent events; cancelled when
its client goes away. OpenAI's chunks are here (`OpenAIAnswer`); the other protocols' answers live
with their translations (serve/messages.py, serve/responses_api.py, serve/native.py)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Protocol, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from specrun.serve.api import GenerationRequest
from specrun.serve.api_errors import ApiError
from specrun.serve.jobs import Failed, Finished, Job, Started, Text
from specrun.serve.metrics import Metrics
from specrun.serve.responses import Outcome, Shape
from specrun.serve.sources import join_pieces
from specrun.serve.tool_calls import CallPiece, merged
from specrun.serve.worker import Worker
from specrun.settings import SettingError

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class ClientGone(Exception):
    """The client closed the connection while its request waited or ran."""


class Answer(Protocol):
    """How a protocol answers a generation: its body for the whole outcome, or its events."""

    def response(self, outcome: Outcome) -> dict: ...

    def events(self, job: Job, started: Started) -> AsyncIterator[str]: ...


@dataclass(frozen=True)
class OpenAIAnswer:
    """OpenAI's bodies and stream chunks (`shape`), and `stream_options.include_usage`."""

    shape: Shape
    include_usage: bool = False

    def response(self, outcome: Outcome) -> dict:
        return self.shape.response(outcome)

    def events(self, job: Job, started: Started) -> AsyncIterator[str]:
        return _events(job, self.shape, self.include_usage)


Prepared = tuple[GenerationRequest, Answer]
"""What a protocol's route makes of a body: the request the worker runs, and how it is answered."""
Parsed = TypeVar("Parsed")


def prepared(
    parse: Callable[[bytes], GenerationRequest], answer: Callable[[GenerationRequest], Answer]
) -> Callable[[bytes], Prepared]:
    """A route's `prepare`: the parsed request, and the answer made for it."""

    def prepare(raw: bytes) -> Prepared:
        parsed = parse(raw)
        return parsed, answer(parsed)

    return prepare


async def parse_counted(request: Request, parse: Callable[[bytes], Parsed], metrics: Metrics) -> Parsed:
    """`parse` of the request's body; a body it refuses counts as rejected (invalid) before its error answers it."""
    try:
        return parse(await request.body())
    except (ApiError, ValidationError, SettingError):
        metrics.reject("invalid")
        raise


async def generate(request: Request, prepare: Callable[[bytes], Prepared], worker: Worker, metrics: Metrics) -> Response:
    """One generation request: parsed, queued on the worker, answered whole or as server-sent events."""
    parsed, answer = await parse_counted(request, prepare, metrics)
    job = worker.submit(parsed, asyncio.get_running_loop())
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        first = await _next(job, watch)
        if isinstance(first, Failed):
            raise first.error
        if parsed.stream:
            assert isinstance(first, Started)  # a job's first report: it failed or started
            return StreamingResponse(answer.events(job, first), media_type="text/event-stream", headers=SSE_HEADERS)
        while not isinstance(report := await _next(job, watch), (Finished, Failed)):
            pass  # the outcome carries the whole text
        if isinstance(report, Failed):
            raise report.error
        if report.outcome.finish_reason == "abort":
            raise _stopping()
        return JSONResponse(answer.response(report.outcome))
    except ClientGone:
        return Response(status_code=499)  # nobody reads it; the job is cancelled
    finally:
        watch.cancel()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _next(job: Job, watch: asyncio.Future) -> object:
    """The job's next report, unless the client leaves first (then the job is cancelled)."""
    getter = asyncio.ensure_future(job.next())
    await asyncio.wait({getter, watch}, return_when=asyncio.FIRST_COMPLETED)
    if getter.done():
        return getter.result()
    getter.cancel()
    job.cancel()
    raise ClientGone


async def _events(job: Job, shape: Shape, include_usage: bool) -> AsyncIterator[str]:
    """Server-sent events: reasoning chunks, text chunks, tool call chunks, the finishing chunk with
    timings, usage if asked, [DONE]. A reply's reasoning comes before its text, and its text before
    its calls, so a batch of reports keeps that order.

    Starlette stops this generator when the client disconnects; `finally` then cancels the job.
    """
    try:
        for chunk in shape.opening_chunks():
            yield _sse(chunk)
        while True:
            reports = [await job.next(), *job.ready()]
            thought = "".join(r.text for r in reports if isinstance(r, Text) and r.reasoning)  # before the answer
            if thought:
                yield _sse(shape.thought_chunk(thought))
            texts = [r for r in reports if isinstance(r, Text) and not r.reasoning]
            text = "".join(r.text for r in texts)
            if text:
                scored = None if texts[0].logprobs is None else tuple(s for r in texts for s in r.logprobs or ())
                yield _sse(shape.chunk(text, _page_field(texts), scored))
            for piece in merged([r for r in reports if isinstance(r, CallPiece)]):
                yield _sse(shape.call_chunk(piece))
            end = reports[-1]
            if isinstance(end, Failed):
                yield _sse(end.error.body())
                return
            if isinstance(end, Finished):
                if end.outcome.finish_reason == "abort":
                    yield _sse(_stopping().body())
                    return
                yield _sse(shape.final_chunk(end.outcome, None if end.stats is None else {"stats": end.stats}))
                if include_usage:
                    yield _sse(shape.usage_chunk(end.outcome))
                yield "data: [DONE]\n\n"
                return
    finally:
        job.cancel()


def _page_field(texts: list[Text]) -> dict | None:
    """The `specrun` field of a chunk made of these reports' text, when the request asked for it."""
    stats = texts[-1].stats
    if stats is None:
        return None
    pieces = join_pieces([piece for text in texts for piece in text.pieces])
    return {"pieces": [piece.body() for piece in pieces], "stats": stats}


def _stopping() -> ApiError:
    return ApiError(503, "the server is shutting down: the generation was stopped", code="unavailable", kind="unavailable_error")


def _sse(body: dict) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False, separators=(',', ':'))}\n\n"
