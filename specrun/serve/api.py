"""OpenAI's request bodies, with llama-server's additions, and its error objects.

Request bodies are pydantic models parsed from the raw bytes, whose Rust JSON parser bounds
nesting and refuses lone surrogates and bytes that are not UTF-8. The models check only types
and shapes, and ignore fields they do not name (as OpenAI does), except OpenAI's fields that
specrun cannot honour (`UNSUPPORTED`), which are refused rather than ignored. What a setting
may be is the library's rule (`specrun.settings`, `SpeculativeSettings`, `parse_k`), applied
before the request is queued; so is the grammar of `response_format`, `json_schema` or
`grammar` (`specrun.structured`) and of the tools' schemas. `body_error` and `setting_error`
turn those errors into OpenAI's error object. Builders turn a finished generation into
`chat.completion` / `text_completion` bodies and stream chunks (specrun/serve/responses.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Mapping

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    WrapValidator,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from specrun.core.policy import SpeculativeSettings, parse_k
from specrun.errors import SpecrunError
from specrun.grammar.schemas import Grammar, SchemaError, grammar_from_gbnf, grammar_from_json_schema, json_object_grammar
from specrun.serve.tools import ToolRequest, call_grammar, function_parameters
from specrun.settings import SettingError, check

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
SAMPLING = {"temperature", "top_p", "top_k", "min_p"}  # request fields passed on to SamplerSettings, named as there
SPECULATIVE = ("n_max", "n_min", "p_min")  # the settings of llama-server's `speculative` object
EXPECTED = {  # pydantic's type errors, by what the field takes
    "int_type": "an integer", "float_type": "a number", "string_type": "a string", "bool_type": "a boolean",
    "list_type": "an array", "dict_type": "an object", "model_type": "an object",
}
CONTENT = "a string or an array of text parts"
TOOL_CHOICE = '"none", "auto", "required" or {"type": "function", "function": {"name": ...}}'
NO_LOGPROBS = "specrun returns no log probabilities"
UNSUPPORTED = {  # OpenAI's fields specrun cannot honour, refused (not ignored) when they ask for something
    "logit_bias": "specrun does not bias tokens: every token is drawn from the target's own distribution",
    "logprobs": NO_LOGPROBS,
    "top_logprobs": NO_LOGPROBS,
    "functions": "it is OpenAI's deprecated function calling: send 'tools' instead",
    "function_call": "it is OpenAI's deprecated function calling: send 'tool_choice' (with 'tools') instead",
}


class ApiError(Exception):
    """An error answered with an HTTP status and OpenAI's error object."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class GenerationRequest:
    messages: list[dict[str, Any]] | None = None  # a chat request: its turns (Message.turn)
    prompt: str | None = None  # a completion request
    max_tokens: int | None = None  # None: the server's default
    sampling: dict[str, Any] = field(default_factory=dict)  # SamplerSettings overrides, checked by the library's rules
    seed: int | None = None  # None: the server's; a negative seed draws a fresh one
    stops: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    k: int | str | None = None  # None: the server's --k
    speculative: SpeculativeSettings | None = None
    grammar: Grammar | None = None  # what the output is held to (response_format, json_schema or grammar)
    grammar_param: str | None = None  # the field the grammar came from, for an error llama.cpp finds in it
    tools: ToolRequest | None = None  # the tools a chat reply may call (none with tool_choice "none")

    @property
    def chat(self) -> bool:
        return self.messages is not None


# --- request bodies ------------------------------------------------------------------
def expecting(expected: str) -> WrapValidator:
    """For a field that takes several shapes: when the value or its items have the wrong
    types, one error saying what the field takes, in place of pydantic's one per item or
    union member. Other errors (a bad part of a message) are kept as they are."""

    def validate(value: Any, handler) -> Any:
        try:
            return handler(value)
        except ValidationError as error:
            if all(problem["type"] in EXPECTED for problem in error.errors()):
                raise PydanticCustomError("invalid_type", "expected {expected}", {"expected": expected}) from None
            raise

    return WrapValidator(validate)


def _listed(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


def _only_item(value: Any) -> Any:
    return value[0] if isinstance(value, list) and len(value) == 1 else value


def _as_parts(value: Any) -> Any:
    return [{"type": "text", "text": value}] if isinstance(value, str) else value


class Strict(BaseModel):
    # No string is taken for a number, nor a number for a boolean; unknown fields are ignored.
    model_config = ConfigDict(strict=True, extra="ignore")


class TextPart(Strict):
    type: Literal["text"]
    text: str

    @model_validator(mode="wrap")
    @classmethod
    def _text_only(cls, value: Any, handler) -> "TextPart":
        try:
            return handler(value)
        except ValidationError:
            kind = value.get("type") if isinstance(value, dict) else None
            what = f"{kind!r} parts are not" if isinstance(kind, str) and kind != "text" else "only text parts are"
            raise PydanticCustomError("invalid_value", what + ' supported: specrun serves text models; send text parts '
                                      '({"type": "text", "text": ...})') from None


class FunctionCall(Strict):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCallIn(Strict):
    """A call an assistant's turn made, as the client sends it back."""

    id: str
    type: Literal["function"]
    function: FunctionCall


class Message(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Annotated[list[TextPart], BeforeValidator(_as_parts), expecting(CONTENT)] | None = Field(
        None, validate_default=True)  # None only in an assistant's turn (one that only called tools)
    tool_calls: list[ToolCallIn] | None = None  # an assistant's turn that called tools
    tool_call_id: str | None = Field(None, validate_default=True)  # a tool's result: the call it answers

    @field_validator("content")
    @classmethod
    def _given(cls, content: list[TextPart] | None, info: ValidationInfo) -> list[TextPart] | None:
        if content is None and info.data.get("role") != "assistant":
            raise PydanticCustomError("invalid_type", "expected {expected}", {"expected": CONTENT})
        return content

    @field_validator("tool_call_id")
    @classmethod
    def _answers(cls, tool_call_id: str | None, info: ValidationInfo) -> str | None:
        if tool_call_id is None and info.data.get("role") == "tool":
            raise PydanticCustomError("missing", "a tool's message names the call it answers")
        return tool_call_id

    def turn(self) -> dict[str, Any]:
        """The turn as chat templates take it: role and text, an assistant's calls, the call a result answers."""
        turn: dict[str, Any] = {"role": ROLES[self.role], "content": "\n".join(part.text for part in self.content or ())}
        if self.role == "assistant" and self.tool_calls:
            turn["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.role == "tool":
            turn["tool_call_id"] = self.tool_call_id
        return turn


class Function(Strict):
    name: Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]  # OpenAI's rule; the call reader counts on it
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of an object
    strict: bool | None = None  # the arguments are held to the schema either way

    def as_dict(self) -> dict:
        """As the template and the tools prompt take it: what the request gave, nothing more."""
        given = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {key: value for key, value in given.items() if value is not None}


class Tool(Strict):
    type: Literal["function"]
    function: Function


class ChosenFunction(Strict):
    name: str


class ToolChoice(Strict):
    """tool_choice: a string ("none", "auto", "required") stands for {"type": it}."""

    type: Literal["none", "auto", "required", "function"]
    function: ChosenFunction | None = Field(None, validate_default=True)

    @field_validator("function")
    @classmethod
    def _named(cls, function: ChosenFunction | None, info: ValidationInfo) -> ChosenFunction | None:
        if function is None and info.data.get("type") == "function":
            raise PydanticCustomError("missing", "a function tool_choice names the function")
        return function


def _choice_object(value: Any) -> Any:
    return {"type": value} if isinstance(value, str) else value


class JsonSchemaFormat(Strict):
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")  # None: any JSON object
    strict: bool | None = None  # the output is held to the schema either way


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = Field(None, validate_default=True)

    @field_validator("json_schema")
    @classmethod
    def _described(cls, json_schema: JsonSchemaFormat | None, info: ValidationInfo) -> JsonSchemaFormat | None:
        if json_schema is None and info.data.get("type") == "json_schema":
            raise PydanticCustomError("missing", "a json_schema response format gives the schema")
        return json_schema


class StreamOptions(Strict):
    include_usage: bool | None = None


class Speculative(Strict):
    """llama-server's per-request `speculative` object; what it leaves out keeps its default."""

    n_max: int | None = None
    n_min: int | None = None
    p_min: float | None = None


class Body(Strict):
    """The fields both endpoints read."""

    n: int | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None  # OpenAI's newer name, before max_tokens
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: Annotated[list[str], BeforeValidator(_listed), expecting("a string or an array of strings")] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    k: Annotated[int | str, expecting('an integer, "auto" or "llama.cpp"')] | None = None
    speculative: Speculative | None = None
    response_format: ResponseFormat | None = None
    json_schema: dict[str, Any] | None = None  # llama-server's: the schema itself
    grammar: str | None = None  # llama-server's: GBNF
    logit_bias: dict[str, Any] | None = None  # refused unless empty
    top_logprobs: int | None = None  # refused


class ChatBody(Body):
    messages: Annotated[list[Message], Field(min_length=1)]
    tools: list[Tool] | None = None
    tool_choice: Annotated[ToolChoice, BeforeValidator(_choice_object), expecting(TOOL_CHOICE)] | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None  # refused when true
    functions: Any = None  # refused: OpenAI's deprecated function calling
    function_call: Any = None


class CompletionBody(Body):
    prompt: Annotated[str, BeforeValidator(_only_item), expecting("a string (or an array of one string)")]
    logprobs: int | None = None  # refused


def parse_chat(raw: bytes) -> GenerationRequest:
    """Raises ValidationError for a body of the wrong shape, SettingError for a setting out of range,
    ApiError for a field specrun cannot honour."""
    body = ChatBody.model_validate_json(raw)
    tools = _tools(body)
    request = _request(body, messages=[message.turn() for message in body.messages], tools=tools)
    if tools is not None and request.grammar is not None:
        raise ApiError(400, f"Unsupported parameter: '{request.grammar_param}' together with 'tools': hold the reply to "
                            "one or the other (or send tool_choice \"none\").", request.grammar_param, "unsupported_parameter")
    return request


def parse_completion(raw: bytes) -> GenerationRequest:
    """Raises ValidationError for a body of the wrong shape, SettingError for a setting out of range,
    ApiError for a field specrun cannot honour."""
    body = CompletionBody.model_validate_json(raw)
    return _request(body, prompt=body.prompt)


def _request(body: Body, **what: Any) -> GenerationRequest:
    """What the worker runs, every setting checked by the library's rule."""
    _refuse_unsupported(body)
    if body.n not in (None, 1):
        raise invalid_value("n", f"specrun returns one choice per request, but {body.n} were asked for.")
    if body.k is not None and body.speculative is not None:
        raise ApiError(400, "Give either 'k' or 'speculative', not both.", "k", "invalid_value")
    sampling = body.model_dump(include=SAMPLING, exclude_none=True)
    check(**sampling)
    speculative = SpeculativeSettings(**body.speculative.model_dump(exclude_none=True)) if body.speculative else None
    options = body.stream_options
    grammar, grammar_param = _output_grammar(body)
    return GenerationRequest(max_tokens=_max_tokens(body), sampling=sampling, seed=body.seed,
                             stops=tuple(stop for stop in body.stop or () if stop), stream=bool(body.stream),
                             include_usage=bool(options and options.include_usage),
                             k=None if body.k is None else parse_k(body.k), speculative=speculative,
                             grammar=grammar, grammar_param=grammar_param, **what)


def _refuse_unsupported(body: Body) -> None:
    """OpenAI's fields specrun cannot honour, when they ask for something, are refused rather than ignored."""
    for name, why in UNSUPPORTED.items():
        value = getattr(body, name, None)
        if not (value is None or value is False or value in ({}, [])):
            raise ApiError(400, f"Unsupported parameter: '{name}': {why}.", name, "unsupported_parameter")


def _output_grammar(body: Body) -> tuple[Grammar | None, str | None]:
    """The grammar the output is held to and the field it came from: response_format, or
    llama-server's json_schema (a schema) or grammar (GBNF); at most one of them."""
    response_format = body.response_format
    kind = response_format.type if response_format else "text"
    asked = {"response_format": kind != "text", "json_schema": body.json_schema is not None, "grammar": body.grammar is not None}
    given = [name for name, on in asked.items() if on]
    if len(given) > 1:
        raise ApiError(400, f"Give only one of {' and '.join(map(repr, given))}: each says what the output is held to.",
                       given[1], "invalid_value")
    if not given:
        return None, None
    param = "response_format.json_schema.schema" if kind == "json_schema" else given[0]
    try:
        if response_format is not None and kind != "text":
            # json_schema's validator makes it present with that type; json_object holds to any JSON object
            described = response_format.json_schema if kind == "json_schema" else None
            schema = None if described is None else described.schema_
            return (json_object_grammar() if schema is None else grammar_from_json_schema(schema)), param
        if body.json_schema is not None:
            return grammar_from_json_schema(body.json_schema), param
        assert body.grammar is not None  # given names exactly one field, and it is this one
        return grammar_from_gbnf(body.grammar), param
    except SpecrunError as error:  # SchemaError names the schema feature, a GBNF error what is missing
        raise invalid_value(param, f"{error}.") from None


def _tools(body: ChatBody) -> ToolRequest | None:
    """The tools a reply may call, each one's schema checked; None without tools or with tool_choice "none"."""
    choice = body.tool_choice.type if body.tool_choice else "auto"
    if not body.tools:
        if choice not in ("auto", "none"):
            raise invalid_value("tool_choice", f"{choice!r} needs 'tools' to choose from.")
        return None
    if choice == "none":
        return None
    functions = [tool.function.as_dict() for tool in body.tools]
    _check_names(functions)
    # ToolChoice's validator makes the function present with the "function" type
    chosen_function = body.tool_choice.function if body.tool_choice and choice == "function" else None
    named = chosen_function.name if chosen_function else None
    chosen = [function for function in functions if named in (None, function["name"])]
    call = _call_grammar(functions, chosen)
    if call is None:
        raise invalid_value("tool_choice.function.name", f"no tool is called {named!r} "
                            f"(the tools: {', '.join(function['name'] for function in functions)}).")
    return ToolRequest(tuple({"type": "function", "function": function} for function in functions),
                       must_call=choice != "auto", named=named, parallel=body.parallel_tool_calls is not False, call=call)


def _check_names(functions: list[dict]) -> None:
    for i, function in enumerate(functions):
        if any(function["name"] == other["name"] for other in functions[:i]):
            raise invalid_value(f"tools[{i}].function.name", f"another tool is called {function['name']!r} too.")


def _call_grammar(functions: list[dict], chosen: list[dict]) -> Grammar | None:
    """One call of a chosen tool (None: none is chosen), every tool's parameters checked that they
    can be held to. Each schema goes through the converter once: the chosen ones together, the
    rest alone; only when that fails is each converted alone, to name the first tool at fault."""
    try:
        for function in functions:
            if function not in chosen:
                grammar_from_json_schema(function_parameters(function))
        return call_grammar(chosen) if chosen else None
    except SchemaError as together:
        for i, function in enumerate(functions):
            try:
                grammar_from_json_schema(function_parameters(function))
            except SchemaError as error:
                raise invalid_value(f"tools[{i}].function.parameters", f"{error}.") from None
        raise invalid_value("tools", f"{together}.") from None  # each alone passed; together they do not


def _max_tokens(body: Body) -> int | None:
    """max_completion_tokens (OpenAI's newer name) or max_tokens; an error names the one given."""
    name = "max_tokens" if body.max_completion_tokens is None else "max_completion_tokens"
    try:
        check(max_tokens=getattr(body, name))
    except SettingError as error:
        raise setting_error(error, name) from None
    return getattr(body, name)


# --- errors ----------------------------------------------------------------------------
def invalid_value(param: str, why: str) -> ApiError:
    """OpenAI's 400 for a request field's value: "Invalid value for 'param': why"."""
    return ApiError(400, f"Invalid value for '{param}': {why}", param, "invalid_value")


def setting_error(error: SettingError, param: str | None = None) -> ApiError:
    """A library setting's error as OpenAI's 400. `param` is the request field; by default
    the library's name, under `speculative.` for llama-server's speculative settings."""
    param = param or (f"speculative.{error.param}" if error.param in SPECULATIVE else error.param)
    return invalid_value(param, f"{error.phrase('it')}.")


def body_error(error: ValidationError) -> ApiError:
    """The first problem pydantic found in a request body, as OpenAI's 400."""
    problem = error.errors(include_url=False)[0]
    kind, location, value = problem["type"], problem["loc"], problem.get("input")
    param = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in location).lstrip(".")
    if kind == "json_invalid":
        return ApiError(400, f"We could not parse the JSON body of your request ({problem['ctx']['error']}): "
                             "send a JSON object.", code="invalid_json")
    if not location:
        return ApiError(400, f"The request body has to be a JSON object, but is {_json_type(value)}.", code="invalid_json")
    if kind == "missing":
        return ApiError(400, f"Missing required parameter: '{param}'.", param, "missing_required_parameter")
    expected = problem["ctx"]["expected"] if kind == "invalid_type" else EXPECTED.get(kind)
    if expected:
        return ApiError(400, f"Invalid type for '{param}': expected {expected}, but got {_json_type(value)} instead.",
                        param, "invalid_type")
    message = problem["msg"]
    return invalid_value(param, f"{message[0].lower()}{message[1:]}.")


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"
