"""Anthropic's Messages API (`POST /v1/messages` and `/v1/messages/count_tokens`), as a thin
translation into the chat completions request the server already runs.

Claude Code and the tools built on Anthropic's SDKs speak it, pointed at a server with
ANTHROPIC_BASE_URL. A request's blocks become OpenAI chat turns (an assistant's `tool_use` blocks
its tool calls, a user's `tool_result` blocks tool turns), its tools OpenAI functions, and it
runs through `api.parse_chat`: the same checks, slots, drafts and tool grammar. The finished
generation comes back as a `message`, or streamed as the protocol's events; errors go in its
envelope (`error_body`).
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from dataclasses import replace
from typing import Annotated, Any, AsyncIterator, Literal, Union

from pydantic import BeforeValidator, Field

from specrun.serve import api
from specrun.serve.api import GenerationRequest
from specrun.serve.api_errors import ApiError, invalid_value
from specrun.serve.bodies import Strict, expecting
from specrun.serve.jobs import Failed, Finished, Job, Started, Text, joined
from specrun.serve.responses import Outcome
from specrun.serve.tool_calls import CallPiece

PING_S = 10.0  # a stream quiet this long (a long prefill) gets a ping, as Anthropic's own streams get them

# Anthropic's error types by status (https://docs.anthropic.com/en/api/errors)
ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 413: "request_too_large"}
ERROR_TYPES |= {429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}


class TextBlock(Strict):
    type: Literal["text"]
    text: str


class MediaBlock(Strict):
    """An image or document: refused when translated (specrun serves text models)."""

    type: Literal["image", "document"]


class ThinkingBlock(Strict):
    """An earlier turn's reasoning, which clients send back: not part of the next prompt."""

    type: Literal["thinking", "redacted_thinking"]


class ToolUseBlock(Strict):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(Strict):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[Annotated[Union[TextBlock, MediaBlock], Field(discriminator="type")]] | None = None
    is_error: bool | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "\n".join(_text_of(block, "tool_result content") for block in self.content)


Block = Annotated[Union[TextBlock, MediaBlock, ThinkingBlock, ToolUseBlock, ToolResultBlock], Field(discriminator="type")]


def _as_blocks(value: Any) -> Any:
    return [{"type": "text", "text": value}] if isinstance(value, str) else value


class MessageIn(Strict):
    role: Literal["user", "assistant", "system"]  # system: an instruction mid-conversation (Claude Code sends them)
    content: Annotated[list[Block], BeforeValidator(_as_blocks), expecting("a string or an array of content blocks")]


class ToolIn(Strict):
    name: Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
    description: str | None = None
    input_schema: dict[str, Any]


class ToolChoiceIn(Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class CountTokensBody(Strict):
    """What /v1/messages/count_tokens reads: the prompt's parts."""

    messages: Annotated[list[MessageIn], Field(min_length=1)]
    system: Annotated[list[TextBlock], BeforeValidator(_as_blocks), expecting("a string or an array of text blocks")] | None = (
        None
    )
    tools: list[ToolIn] | None = None
    tool_choice: ToolChoiceIn | None = None


class MessagesBody(CountTokensBody):
    max_tokens: int
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool | None = None
    metadata: dict[str, Any] | None = None  # a user id for the publisher's abuse checks: nothing to do here
    thinking: dict[str, Any] | None = None  # accepted: a model that reasons does so as its template says


# A system block Claude Code starts with, for Anthropic's billing: no instruction, and one that
# changes every request would keep the prompt's cached prefix from being reused (llama-server edits it too).
BILLING_HEADER = "x-anthropic-billing-header:"

# Fields of the chat body a Messages request becomes, and the request's names for them.
CHAT_FIELDS = (
    (re.compile(r"^tools\[(\d+)\]\.function\.parameters"), r"tools[\1].input_schema"),
    (re.compile(r"^tools\[(\d+)\]\.function\.name"), r"tools[\1].name"),
    (re.compile(r"^tool_choice\.function\.name"), "tool_choice.name"),
    (re.compile(r"^stop\b"), "stop_sequences"),
)


def parse_messages(raw: bytes) -> GenerationRequest:
    """A Messages request as the chat request it runs as; errors as `api.parse_chat`'s."""
    body = MessagesBody.model_validate_json(raw)
    sampling = body.model_dump(include={"max_tokens", "temperature", "top_p", "top_k", "stream"}, exclude_none=True)
    chat = {**_chat(body), **sampling, "stop": [stop for stop in body.stop_sequences or () if stop]}
    # Clients ask for their model's most (Claude Code 64000): a reply ends when the context fills, as llama-server's does.
    return replace(api.parse_translated_chat(chat, CHAT_FIELDS), up_to_context=True)


def parse_count(raw: bytes) -> GenerationRequest:
    """A count_tokens request as the chat request whose prompt it counts."""
    return api.parse_translated_chat(_chat(CountTokensBody.model_validate_json(raw)), CHAT_FIELDS)


def _chat(body: CountTokensBody) -> dict[str, Any]:
    """The chat completions body of the request's prompt: system, turns, tools and tool_choice."""
    messages: list[dict[str, Any]] = []
    system = [block.text for block in body.system or () if not block.text.startswith(BILLING_HEADER)]
    if system:
        messages.append({"role": "system", "content": "\n".join(system)})
    called: set[str] = set()
    for i, message in enumerate(body.messages):
        for turn in _turns(message, i, called):
            _add_turn(messages, turn)
    chat: dict[str, Any] = {"messages": messages}
    if body.tools:
        chat["tools"] = [
            {"type": "function", "function": {"name": t.name, "parameters": t.input_schema} | _described(t)} for t in body.tools
        ]
    if body.tool_choice is not None:
        choice = body.tool_choice
        if choice.type == "tool" and not choice.name:
            raise invalid_value("tool_choice.name", 'a "tool" tool_choice names the tool to call.')
        forms = {"auto": "auto", "any": "required", "none": "none"}
        chat["tool_choice"] = forms.get(choice.type) or {"type": "function", "function": {"name": choice.name}}
        if choice.disable_parallel_tool_use:
            chat["parallel_tool_calls"] = False
    return chat


def _add_turn(messages: list[dict[str, Any]], turn: dict[str, Any]) -> None:
    """Consecutive user turns, and consecutive assistant turns, are one turn, as Anthropic combines
    them (and as templates that want turns to alternate need them)."""
    last = messages[-1] if messages else None
    if last is None or last["role"] != turn["role"] or turn["role"] not in ("user", "assistant"):
        messages.append(turn)
        return
    last["content"] = "\n".join(filter(None, (last["content"], turn["content"]))) or None
    if turn.get("tool_calls"):
        last["tool_calls"] = last.get("tool_calls", []) + turn["tool_calls"]


def _described(tool: ToolIn) -> dict[str, str]:
    return {"description": tool.description} if tool.description is not None else {}


def _turns(message: MessageIn, i: int, called: set[str]) -> list[dict[str, Any]]:
    """One message's chat turns: a user's tool results first (each a tool turn), then its text; an
    assistant's text with its tool calls. `called`: the tool_use ids so far, which results answer."""
    texts: list[str] = []
    calls, results = [], []
    for j, block in enumerate(message.content):
        where = f"messages[{i}].content[{j}]"
        if isinstance(block, ToolUseBlock) and message.role == "assistant":
            called.add(block.id)
            arguments = json.dumps(block.input)
            calls.append({"id": block.id, "type": "function", "function": {"name": block.name, "arguments": arguments}})
        elif isinstance(block, ToolResultBlock) and message.role == "user":
            if block.tool_use_id not in called:
                raise invalid_value(f"{where}.tool_use_id", f"no earlier tool_use block has the id {block.tool_use_id!r}.")
            results.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": block.text()})
        elif isinstance(block, (ToolUseBlock, ToolResultBlock)):
            raise invalid_value(f"{where}.type", f"{block.type!r} blocks belong in {_owner(block)} messages.")
        elif not isinstance(block, ThinkingBlock):
            texts.append(_text_of(block, where))
    turns: list[dict[str, Any]] = results
    if message.role == "assistant":
        turns.append({"role": "assistant", "content": "\n".join(texts) or None} | ({"tool_calls": calls} if calls else {}))
    elif texts or not results:  # a system message mid-conversation is the user's side's text
        turns.append({"role": "user", "content": "\n".join(texts)})
    return turns


def _owner(block: ToolUseBlock | ToolResultBlock) -> str:
    return "assistant" if isinstance(block, ToolUseBlock) else "user"


def _text_of(block: TextBlock | MediaBlock, where: str) -> str:
    if isinstance(block, MediaBlock):
        raise invalid_value(f"{where}.type", f"{block.type} blocks are not supported: specrun serves text models.")
    return block.text


# --- responses ---------------------------------------------------------------------------
class MessagesShape:
    """A message's bodies and events, sharing its id; `stops`: the request's stop_sequences."""

    def __init__(self, model: str, request: GenerationRequest):
        self.id = f"msg_{uuid.uuid4().hex}"
        self.model = model
        self.stops = request.stops

    def response(self, outcome: Outcome) -> dict:
        thought = [{"type": "thinking", "thinking": outcome.reasoning, "signature": ""}] if outcome.reasoning else []
        content: list[dict[str, Any]] = thought + ([{"type": "text", "text": outcome.text}] if outcome.text else [])
        content += [
            {"type": "tool_use", "id": call.id, "name": call.name, "input": json.loads(call.arguments)}
            for call in outcome.tool_calls
        ]
        return {**self._head(content, outcome.prompt_tokens, outcome.stats.tokens), **self._end(outcome)}

    def _head(self, content: list, input_tokens: int, output_tokens: int) -> dict:
        usage = {"input_tokens": input_tokens, "output_tokens": output_tokens}
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content, "usage": usage}

    def _end(self, outcome: Outcome) -> dict:
        """stop_reason and stop_sequence: a tool call, the length limit, one of the request's stop
        sequences, else the end of the turn (the model's end token or its template's stop)."""
        stop = outcome.stop if outcome.stop in self.stops else None
        reason = {"tool_calls": "tool_use", "length": "max_tokens"}.get(outcome.finish_reason)
        return {"stop_reason": reason or ("stop_sequence" if stop else "end_turn"), "stop_sequence": stop}

    async def events(self, job: Job, started: Started) -> AsyncIterator[str]:
        """message_start, a ping (and one each PING_S seconds without news), each content block (text deltas, or a tool_use's input as JSON
        deltas) between its start and stop, message_delta with the stop reason and usage,
        message_stop; an error event where the generation failed. Cancels the job when done."""
        blocks = _Blocks()
        try:
            head = self._head([], started.prompt_tokens, 0) | {"stop_reason": None, "stop_sequence": None}
            yield _event("message_start", {"type": "message_start", "message": head})
            yield _event("ping", {"type": "ping"})
            while True:
                try:
                    first = await asyncio.wait_for(job.next(), PING_S)
                except asyncio.TimeoutError:  # a long prefill (an agent's first turn): the client hears the server is there
                    yield _event("ping", {"type": "ping"})
                    continue
                for report in joined([first, *job.ready()]):
                    if isinstance(report, (Text, CallPiece)):
                        for name, body in blocks.add(report):
                            yield _event(name, body)
                    elif isinstance(report, Failed):
                        yield _event("error", error_body(report.error))
                        return
                    elif isinstance(report, Finished):
                        for name, body in self._closing(blocks, report.outcome):
                            yield _event(name, body)
                        return
        finally:
            job.cancel()

    def _closing(self, blocks: _Blocks, outcome: Outcome) -> list[tuple[str, dict]]:
        if outcome.finish_reason == "abort":
            return [("error", error_body(ApiError(503, "the server is shutting down: the generation was stopped")))]
        usage = {"output_tokens": outcome.stats.tokens}
        return [*blocks.close(), ("message_delta", {"type": "message_delta", "delta": self._end(outcome), "usage": usage})] + [
            ("message_stop", {"type": "message_stop"})
        ]


class _Blocks:
    """The content blocks of a streamed message: which is open, and its index."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None  # "thinking", "text" or "tool_use"

    def add(self, report: Text | CallPiece) -> list[tuple[str, dict]]:
        events: list[tuple[str, dict]] = []
        if isinstance(report, Text):
            if not report.text:
                return events
            kind, delta = ("thinking", "thinking_delta") if report.reasoning else ("text", "text_delta")
            if self.open != kind:
                events += self._start({"type": kind, kind: ""} | ({"signature": ""} if report.reasoning else {}))
            return events + [self._delta({"type": delta, kind: report.text})]
        if report.id is not None:  # a call's first piece: a block of its own
            events += self._start({"type": "tool_use", "id": report.id, "name": report.name, "input": {}})
        if report.arguments:
            events.append(self._delta({"type": "input_json_delta", "partial_json": report.arguments}))
        return events

    def close(self) -> list[tuple[str, dict]]:
        if self.open is None:
            return []
        self.open = None
        return [("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def _start(self, block: dict) -> list[tuple[str, dict]]:
        closing = self.close()
        self.index, self.open = self.index + 1, block["type"]
        return closing + [("content_block_start", {"type": "content_block_start", "index": self.index, "content_block": block})]

    def _delta(self, delta: dict) -> tuple[str, dict]:
        return "content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta}


def error_body(error: ApiError) -> dict:
    """Anthropic's error envelope, its type by the status."""
    kind = ERROR_TYPES.get(error.status) or ("api_error" if error.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": error.message}}


def _event(name: str, body: dict) -> str:
    return f"event: {name}\ndata: {json.dumps(body, ensure_ascii=False, separators=(',', ':'))}\n\n"
