"""OpenAI's Responses API (`POST /v1/responses`, `GET /v1/responses/{id}`), the answer side.

Codex CLI and the newer OpenAI SDK examples speak it. A request (serve/responses_request.py: its
translation into a chat request) comes back as a `response` object, or streamed as the protocol's
events, and is kept for `previous_response_id` unless it was sent with `store` false.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from typing import Any, AsyncIterator

from specrun.serve.api_errors import ApiError
from specrun.serve.jobs import Failed, Finished, Job, Started, Text, joined
from specrun.serve.responses import Outcome
from specrun.serve.responses_request import Conversation, ResponsesRequest, ResponseStore
from specrun.serve.tool_calls import CallPiece, ToolCall


class ResponsesShape:
    """A response's body and events, sharing its ids; kept in `store` when it finishes, if asked."""

    def __init__(self, model: str, parsed: ResponsesRequest, store: ResponseStore):
        self.id = f"resp_{uuid.uuid4().hex}"
        self.message_id = f"msg_{uuid.uuid4().hex}"
        self.reasoning_id = f"rs_{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self.parsed = parsed
        self.store = store
        self.sequence = itertools.count()

    def response(self, outcome: Outcome) -> dict:
        output = [self._reasoning(outcome.reasoning)] if outcome.reasoning else []
        output += ([self._message(outcome.text)] if outcome.text else []) + [_call_item(call) for call in outcome.tool_calls]
        body = self._body(outcome.finish_reason, output) | {"usage": _usage(outcome)}
        if self.parsed.store:
            reply = {"role": "assistant", "content": outcome.text}
            calls = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in outcome.tool_calls
            ]
            self.store.keep(self.id, Conversation([*self.parsed.turns, reply | ({"tool_calls": calls} if calls else {})], body))
        return body

    def _body(self, finish_reason: str | None, output: list[dict]) -> dict:
        """The response object; finish_reason None: in progress."""
        status = {None: "in_progress", "length": "incomplete"}.get(finish_reason, "completed")
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "model": self.model,
            "output": output,
            "reasoning": {"effort": None, "summary": None},
            "truncation": "disabled",
            "usage": None,
            **self.parsed.echo,
        }

    def _reasoning(self, text: str, status: str = "completed") -> dict:
        """A reasoning item: the model's thinking (as llama-server gives it, in `content`)."""
        content = [{"type": "reasoning_text", "text": text}] if status == "completed" else []
        return {"id": self.reasoning_id, "type": "reasoning", "status": status, "summary": [], "content": content}

    def _message(self, text: str, status: str = "completed") -> dict:
        content = [_text_part(text)] if status == "completed" else []
        return {"id": self.message_id, "type": "message", "status": status, "role": "assistant", "content": content}

    async def events(self, job: Job, started: Started) -> AsyncIterator[str]:
        """response.created and .in_progress; each output item between its .added and .done (a
        message's text as output_text deltas in its content part, a call's arguments as deltas);
        then response.completed (response.incomplete at the length limit) with the whole response,
        or response.failed. Cancels the job when done."""
        items = _Items(self)
        try:
            for kind in ("response.created", "response.in_progress"):
                yield self._event(kind, response=self._body(None, []))
            while True:
                for report in joined([await job.next(), *job.ready()]):
                    if isinstance(report, (Text, CallPiece)):
                        for kind, fields in items.add(report):
                            yield self._event(kind, **fields)
                    elif isinstance(report, Failed):
                        yield self._failed(report.error, items.output)
                        return
                    elif isinstance(report, Finished):
                        for kind, fields in items.close():
                            yield self._event(kind, **fields)
                        if report.outcome.finish_reason == "abort":
                            yield self._failed(
                                ApiError(503, "the server is shutting down: the generation was stopped"), items.output
                            )
                            return
                        body = self.response(report.outcome)
                        yield self._event(f"response.{body['status']}", response=body)
                        return
        finally:
            job.cancel()

    def _failed(self, error: ApiError, output: list[dict]) -> str:
        body = self._body("stop", output) | {"status": "failed", "completed_at": None}
        body["error"] = {
            "code": error.code or ("server_error" if error.status >= 500 else "invalid_request"),
            "message": error.message,
        }
        return self._event("response.failed", response=body)

    def _event(self, kind: str, **fields: Any) -> str:
        body = {"type": kind, "sequence_number": next(self.sequence), **fields}
        return f"event: {kind}\ndata: {json.dumps(body, ensure_ascii=False, separators=(',', ':'))}\n\n"


class _Items:
    """The output items of a streamed response: the one open (reasoning, a message or a function
    call) and those done."""

    def __init__(self, shape: ResponsesShape):
        self.shape = shape
        self.output: list[dict] = []  # the items done
        self.open: dict | None = None
        self.text = ""  # the open message's or reasoning item's so far

    def add(self, report: Text | CallPiece) -> list[tuple[str, dict]]:
        if isinstance(report, Text):
            if not report.text:
                return []
            kind = "reasoning" if report.reasoning else "message"
            opened = self.open is not None and self.open["type"] == kind
            events = [] if opened else self.close() + self._open(kind)
            assert self.open is not None  # opened, or just now
            self.text += report.text
            if report.reasoning:
                return events + [("response.reasoning_text.delta", self._in_text(self.open, delta=report.text))]
            return events + [("response.output_text.delta", self._in_text(self.open, delta=report.text, logprobs=[]))]
        events = []
        if report.id is not None:  # a call's first piece: an item of its own
            events = self.close()
            self.open = _call_item(ToolCall(report.id, report.name or "", ""), "in_progress")
            events.append(("response.output_item.added", {"output_index": len(self.output), "item": dict(self.open)}))
        assert self.open is not None and self.open["type"] == "function_call"  # a call's pieces follow its head
        self.open["arguments"] += report.arguments
        delta = {"item_id": self.open["id"], "output_index": len(self.output), "delta": report.arguments}
        return events + ([("response.function_call_arguments.delta", delta)] if report.arguments else [])

    def _open(self, kind: str) -> list[tuple[str, dict]]:
        """A message's or a reasoning item's .added events."""
        self.text = ""
        item = self.open = (
            self.shape._message("", "in_progress") if kind == "message" else self.shape._reasoning("", "in_progress")
        )
        added = [("response.output_item.added", {"output_index": len(self.output), "item": dict(item)})]
        return added + ([("response.content_part.added", self._in_text(item, part=_text_part("")))] if kind == "message" else [])

    def _in_text(self, item: dict, **fields: Any) -> dict:
        """An event's fields about the text of `item` (the open one, at the next output index)."""
        return {"item_id": item["id"], "output_index": len(self.output), "content_index": 0, **fields}

    def close(self) -> list[tuple[str, dict]]:
        """The .done events of the open item, if any."""
        item, self.open = self.open, None
        if item is None:
            return []
        index = len(self.output)
        if item["type"] == "message":
            done = self.shape._message(self.text)
            events = [
                ("response.output_text.done", self._in_text(item, text=self.text, logprobs=[])),
                ("response.content_part.done", self._in_text(item, part=_text_part(self.text))),
            ]
        elif item["type"] == "reasoning":
            done = self.shape._reasoning(self.text)
            events = [("response.reasoning_text.done", self._in_text(item, text=self.text))]
        else:
            done = item | {"status": "completed"}
            events = [
                (
                    "response.function_call_arguments.done",
                    {"item_id": item["id"], "output_index": index, "name": item["name"], "arguments": item["arguments"]},
                )
            ]
        self.output.append(done)
        return events + [("response.output_item.done", {"output_index": index, "item": done})]


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _call_item(call: ToolCall, status: str = "completed") -> dict:
    """A function call output item: its id follows from the call's, so the streamed and the final
    items are the same item."""
    item_id = "fc_" + call.id.removeprefix("call_")
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
    }


def _usage(outcome: Outcome) -> dict:
    output = outcome.stats.tokens
    return {
        "input_tokens": outcome.prompt_tokens,
        "input_tokens_details": {"cached_tokens": outcome.prompt_tokens - outcome.stats.prefilled_tokens},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": outcome.prompt_tokens + output,
    }
