"""OpenAI's Responses API, the request side: its bodies, their translation into the chat completions
request the server already runs, and the responses `previous_response_id` continues.

A request's `instructions` become the system turn, its `input` items chat turns (messages, an
assistant's `function_call`s its tool calls, `function_call_output`s tool turns), its function
tools OpenAI's, and `text.format` the response format; it runs through `api.parse_chat`: the same
checks, slots, drafts and grammars. serve/responses_api.py answers it.
"""

from __future__ import annotations

import logging
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union

from pydantic import BeforeValidator, Discriminator, Field, Tag

from specrun.serve import api
from specrun.serve.api import GenerationRequest
from specrun.serve.api_errors import ApiError, invalid_value
from specrun.serve.bodies import Strict, expecting

log = logging.getLogger(__name__)

RESPONSES_KEPT = 256  # responses previous_response_id may name: the newest, in memory
TOOL_CHOICE = '"none", "auto", "required" or {"type": "function", "name": ...}'


class TextPart(Strict):
    type: Literal["input_text", "output_text"]
    text: str


class RefusalPart(Strict):
    type: Literal["refusal"]
    refusal: str


class MediaPart(Strict):
    """An image, file or sound: refused when translated (specrun serves text models)."""

    type: Literal["input_image", "input_file", "input_audio"]


Part = Annotated[Union[TextPart, RefusalPart, MediaPart], Field(discriminator="type")]


def _as_parts(value: Any) -> Any:
    return [{"type": "input_text", "text": value}] if isinstance(value, str) else value


class MessageItem(Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Annotated[list[Part], BeforeValidator(_as_parts), expecting("a string or an array of content parts")]


class FunctionCallItem(Strict):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str  # JSON text


class FunctionCallOutputItem(Strict):
    type: Literal["function_call_output"]
    call_id: str
    output: Annotated[list[Part], BeforeValidator(_as_parts), expecting("a string or an array of content parts")]


class ReasoningItem(Strict):
    """An earlier turn's reasoning, which clients send back: not part of the next prompt."""

    type: Literal["reasoning"]


class OtherItem(Strict):
    """An item of a kind specrun does not run (a built-in tool's call, a reference to a stored item)."""

    type: str


def _item_kind(value: Any) -> str:
    kind = value.get("type", "message") if isinstance(value, dict) else "message"
    return kind if kind in ("message", "function_call", "function_call_output", "reasoning") else "other"


Item = Annotated[
    Union[
        Annotated[MessageItem, Tag("message")],
        Annotated[FunctionCallItem, Tag("function_call")],
        Annotated[FunctionCallOutputItem, Tag("function_call_output")],
        Annotated[ReasoningItem, Tag("reasoning")],
        Annotated[OtherItem, Tag("other")],
    ],
    Discriminator(_item_kind),
]


def _as_items(value: Any) -> Any:
    return [{"role": "user", "content": value}] if isinstance(value, str) else value


class ToolIn(Strict):
    """A tool: a function is run as chat completions' are; other kinds (OpenAI's built-in tools) are
    left out of the prompt, as llama-server leaves them (the model cannot call them here)."""

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChosenTool(Strict):
    type: Literal["function"]
    name: str


class TextFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextOptions(Strict):
    format: TextFormat | None = None


class ResponsesBody(Strict):
    input: Annotated[list[Item], BeforeValidator(_as_items), expecting("a string or an array of input items")]
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: list[ToolIn] | None = None
    tool_choice: Annotated[Literal["none", "auto", "required"] | ChosenTool, expecting(TOOL_CHOICE)] | None = None
    parallel_tool_calls: bool | None = None
    text: TextOptions | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool | None = None
    store: bool | None = None  # default: kept, as OpenAI keeps it
    metadata: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None  # accepted: a model that reasons does so as its template says
    background: bool | None = None  # refused when true: a response is answered while the client waits
    conversation: Any = None  # refused: OpenAI's Conversations API
    prompt: Any = None  # refused: a prompt template stored with OpenAI


# Fields of the chat body a Responses request becomes, and the request's names for them.
CHAT_FIELDS = (
    (re.compile(r"^tool_choice\.function\.name"), "tool_choice.name"),
    (re.compile(r"^max_tokens"), "max_output_tokens"),
    (re.compile(r"^response_format\.json_schema\.schema"), "text.format.schema"),
    (re.compile(r"^response_format"), "text.format"),
    (re.compile(r"^messages\b.*"), "input"),
)
UNSUPPORTED = {
    "background": "responses are answered while the client waits: leave it out or send false",
    "conversation": "OpenAI's Conversations API is not served here: send previous_response_id, or the whole conversation in 'input'",
    "prompt": "prompt templates stored with OpenAI are not served here: send 'instructions' and 'input'",
}


@dataclass
class Conversation:
    """A conversation this server answered: its turns (the instructions left out, as OpenAI leaves
    them out of a continuation) and the response body."""

    turns: list[dict[str, Any]]
    body: dict[str, Any]


class ResponseStore:
    """The newest RESPONSES_KEPT responses sent with `store` (the default), by id, in memory: what
    `previous_response_id` continues and `GET /v1/responses/{id}` returns. Used on the event loop only."""

    def __init__(self, kept: int = RESPONSES_KEPT):
        self.kept = kept
        self._conversations: OrderedDict[str, Conversation] = OrderedDict()

    def keep(self, response_id: str, conversation: Conversation) -> None:
        self._conversations[response_id] = conversation
        while len(self._conversations) > self.kept:
            self._conversations.popitem(last=False)

    def find(self, response_id: str, param: str | None = None) -> Conversation:
        """The conversation of `response_id`; a 400 naming `param` (404 without one) where it is not kept."""
        found = self._conversations.get(response_id)
        if found is None:
            why = (
                f"this server keeps the newest {self.kept} responses sent with store true (the default), in memory until it stops"
            )
            raise ApiError(
                400 if param else 404,
                f"Response with id {response_id!r} not found: {why}."
                + (" Send the whole conversation in 'input' instead." if param else ""),
                param,
                "previous_response_not_found" if param else "not_found",
                "invalid_request_error" if param else "not_found_error",
            )
        return found


@dataclass(frozen=True)
class ResponsesRequest:
    """A parsed Responses request: what the worker runs, the turns it continues and adds (for the
    store), and the request's settings a response object echoes."""

    request: GenerationRequest
    turns: list[dict[str, Any]]
    echo: dict[str, Any] = field(default_factory=dict)
    store: bool = True


def parse_responses(raw: bytes, store: ResponseStore) -> ResponsesRequest:
    """A Responses request as the chat request it runs as; errors as `api.parse_chat`'s."""
    body = ResponsesBody.model_validate_json(raw)
    for name, why in UNSUPPORTED.items():
        if getattr(body, name) not in (None, False):
            raise ApiError(400, f"Unsupported parameter: '{name}': {why}.", name, "unsupported_parameter")
    earlier = store.find(body.previous_response_id, "previous_response_id").turns if body.previous_response_id else []
    turns = earlier + _turns(body.input, _called(earlier))
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    chat: dict[str, Any] = {"messages": system + turns, **_tools(body), **_format(body)}
    chat |= body.model_dump(include={"temperature", "top_p", "stream", "parallel_tool_calls"}, exclude_none=True)
    if body.max_output_tokens is not None:
        chat["max_tokens"] = body.max_output_tokens
    request = api.parse_translated_chat(chat, CHAT_FIELDS)
    return ResponsesRequest(request, turns, _echo(body), store=body.store is not False)


def _echo(body: ResponsesBody) -> dict[str, Any]:
    """The request's settings, as a response object repeats them (OpenAI's defaults where not sent)."""
    found = body.text.format if body.text else None
    echo = body.model_dump(include={"instructions", "max_output_tokens", "temperature", "top_p", "previous_response_id"})
    return echo | {
        "tools": [tool.model_dump(exclude_none=True) for tool in body.tools or ()],
        "tool_choice": body.tool_choice.model_dump() if isinstance(body.tool_choice, ChosenTool) else body.tool_choice or "auto",
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "metadata": body.metadata or {},
        "text": {"format": found.model_dump(by_alias=True, exclude_none=True) if found else {"type": "text"}},
        "store": body.store is not False,
    }


def _called(turns: list[dict[str, Any]]) -> set[str]:
    return {call["id"] for turn in turns for call in turn.get("tool_calls") or ()}


def _turns(items: list[Any], called: set[str]) -> list[dict[str, Any]]:
    """Chat turns of the input items: consecutive assistant items (text, function calls) as one
    turn, as a chat template expects them. `called`: the call ids so far, which outputs answer."""
    turns: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        last = turns[-1] if turns and turns[-1]["role"] == "assistant" else None
        if isinstance(item, MessageItem):
            text = "\n".join(_text(part, f"{where}.content[{j}]") for j, part in enumerate(item.content))
            if item.role == "assistant" and last is not None and not last.get("tool_calls"):
                last["content"] = "\n".join(filter(None, (last["content"], text)))
            else:
                turns.append({"role": item.role, "content": text})
        elif isinstance(item, FunctionCallItem):
            called.add(item.call_id)
            call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
            if last is None:
                last = {"role": "assistant", "content": None}
                turns.append(last)
            last.setdefault("tool_calls", []).append(call)
        elif isinstance(item, FunctionCallOutputItem):
            if item.call_id not in called:
                raise invalid_value(f"{where}.call_id", f"no earlier function_call item has the call_id {item.call_id!r}.")
            output = "\n".join(_text(part, f"{where}.output[{j}]") for j, part in enumerate(item.output))
            turns.append({"role": "tool", "tool_call_id": item.call_id, "content": output})
        elif isinstance(item, OtherItem):
            raise invalid_value(
                f"{where}.type",
                f"{item.type!r} items are not supported: specrun runs messages, function_call, function_call_output "
                "and reasoning items.",
            )
    return turns


def _text(part: TextPart | RefusalPart | MediaPart, where: str) -> str:
    if isinstance(part, MediaPart):
        raise invalid_value(f"{where}.type", f"{part.type} parts are not supported: specrun serves text models.")
    return part.text if isinstance(part, TextPart) else part.refusal


def _tools(body: ResponsesBody) -> dict[str, Any]:
    """The chat body's tools and tool_choice: the function tools (others left out, with a log line)."""
    functions = []
    for i, tool in enumerate(body.tools or ()):
        if tool.type != "function":
            log.warning("a Responses request's %r tool (tools[%d]) was left out: specrun runs function tools", tool.type, i)
            continue
        if tool.name is None:
            raise ApiError(
                400, f"Missing required parameter: 'tools[{i}].name'.", f"tools[{i}].name", "missing_required_parameter"
            )
        described = tool.model_dump(include={"name", "description", "parameters", "strict"}, exclude_none=True)
        functions.append({"type": "function", "function": described})
    chat: dict[str, Any] = {"tools": functions} if functions else {}
    choice = body.tool_choice
    if isinstance(choice, ChosenTool):
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    elif choice is not None and (functions or choice == "none"):
        chat["tool_choice"] = choice
    return chat


def _format(body: ResponsesBody) -> dict[str, Any]:
    """The chat body's response_format for `text.format`."""
    found = body.text.format if body.text else None
    if found is None or found.type == "text":
        return {}
    if found.type == "json_object":
        return {"response_format": {"type": "json_object"}}
    if found.schema_ is None:
        raise ApiError(
            400, "Missing required parameter: 'text.format.schema'.", "text.format.schema", "missing_required_parameter"
        )
    schema = {"name": found.name or "response", "schema": found.schema_} | (
        {"strict": found.strict} if found.strict is not None else {}
    )
    return {"response_format": {"type": "json_schema", "json_schema": schema}}
