"""OpenAI's request bodies, with llama-server's additions, as pydantic models.

They are parsed from the raw bytes by pydantic's Rust JSON parser, which bounds nesting and
refuses lone surrogates and bytes that are not UTF-8. The models check only types and shapes
and ignore fields they do not name, as OpenAI does; what a value may be is checked after
parsing (specrun/serve/api.py), by the library's rules.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

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

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
EXPECTED = {  # pydantic's type errors, by what the field takes
    "int_type": "an integer",
    "float_type": "a number",
    "string_type": "a string",
    "bool_type": "a boolean",
    "list_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
}
CONTENT = "a string or an array of text parts"
TOOL_CHOICE = '"none", "auto", "required" or {"type": "function", "function": {"name": ...}}'


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
            raise PydanticCustomError(
                "invalid_value", what + ' supported: specrun serves text models; send text parts ({"type": "text", "text": ...})'
            ) from None


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
        None, validate_default=True
    )  # None only in an assistant's turn (one that only called tools)
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
    schema_: dict[str, Any] | None = Field(None, alias="schema")  # llama-server's json_object with a schema

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


class SpecrunOptions(Strict):
    """specrun's own request object; what it leaves out is off."""

    pieces: bool | None = None  # each stream chunk's text split by how its tokens came, with running statistics


class Body(Strict):
    """The fields both endpoints read."""

    n: int | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None  # OpenAI's newer name, before max_tokens
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repeat_penalty: float | None = None  # llama-server's
    repeat_last_n: int | None = None  # llama-server's
    ignore_eos: bool | None = None  # llama-server's
    xtc_probability: float | None = None  # llama-server's
    xtc_threshold: float | None = None  # llama-server's
    typical_p: float | None = None  # llama-server's
    top_n_sigma: float | None = None  # llama-server's
    dynatemp_range: float | None = None  # llama-server's
    dynatemp_exponent: float | None = None  # llama-server's
    # llama-server's samplers specrun does not run: refused unless off (api.SAMPLERS_NOT_RUN)
    dry_multiplier: float | None = None
    mirostat: int | None = None
    seed: int | None = None
    stop: Annotated[list[str], BeforeValidator(_listed), expecting("a string or an array of strings")] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    k: Annotated[int | str, expecting('an integer, "auto" or "llama.cpp"')] | None = None
    speculative: Speculative | None = None
    response_format: ResponseFormat | None = None
    json_schema: dict[str, Any] | None = None  # llama-server's: the schema itself
    grammar: str | None = None  # llama-server's: GBNF
    specrun: SpecrunOptions | None = None
    logit_bias: (
        Annotated[
            dict[str, float | bool] | list[list[int | float | bool]],  # pairs: checked with the ids
            expecting("an object of token ids to biases (or an array of [token id, bias] pairs)"),
        ]
        | None
    ) = None


class ChatBody(Body):
    messages: Annotated[list[Message], Field(min_length=1)]
    add_generation_prompt: bool | None = None  # llama-server's: end with the reply's cue (default)
    continue_final_message: bool | str | None = None  # llama-server's: continue the last (assistant) message
    tools: list[Tool] | None = None
    tool_choice: Annotated[ToolChoice, BeforeValidator(_choice_object), expecting(TOOL_CHOICE)] | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None  # with logprobs
    functions: Any = None  # refused: OpenAI's deprecated function calling
    function_call: Any = None


class TokenizeBody(Strict):
    """llama-server's /tokenize."""

    content: str
    add_special: bool | None = None  # the start token the model adds to a prompt (default: not)
    parse_special: bool | None = None  # special tokens written as text read as such (default: they are)
    with_pieces: bool | None = None  # each id with its text


class DetokenizeBody(Strict):
    """llama-server's /detokenize."""

    tokens: list[int]


class CompletionBody(Body):
    prompt: Annotated[str, BeforeValidator(_only_item), expecting("a string (or an array of one string)")]
    logprobs: int | None = None  # the legacy API's: how many alternatives (0 to 20) beside each token's
