"""OpenAI's request and response shapes, with llama-server's additions, and its error objects.

Request bodies are pydantic models parsed from the raw bytes, whose Rust JSON parser bounds
nesting and refuses lone surrogates and bytes that are not UTF-8. The models check only types
and shapes, and ignore fields they do not name (as OpenAI does); what a setting may be is the
library's rule (`specrun.settings`, `SpeculativeSettings`, `parse_k`), applied before the
request is queued. `body_error` and `setting_error` turn those errors into OpenAI's error
object. Builders turn a finished generation into `chat.completion` / `text_completion` bodies
and stream chunks, each carrying `usage` and llama-server's `timings`.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
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

from specrun.engine import Stats
from specrun.policy import SpeculativeSettings, parse_k
from specrun.settings import SettingError, check

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
SAMPLING = {"temperature", "top_p", "top_k", "min_p"}  # request fields passed on to SamplerSettings, named as there
SPECULATIVE = ("n_max", "n_min", "p_min")  # the settings of llama-server's `speculative` object
EXPECTED = {  # pydantic's type errors, by what the field takes
    "int_type": "an integer", "float_type": "a number", "string_type": "a string", "bool_type": "a boolean",
    "list_type": "an array", "dict_type": "an object", "model_type": "an object",
}
CONTENT = "a string or an array of text parts"


class ApiError(Exception):
    """An error answered with an HTTP status and OpenAI's error object."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class GenerationRequest:
    messages: list[dict[str, str]] | None = None  # a chat request
    prompt: str | None = None  # a completion request
    max_tokens: int | None = None  # None: the server's default
    sampling: dict[str, Any] = field(default_factory=dict)  # SamplerSettings overrides, checked by the library's rules
    seed: int | None = None  # None: the server's; a negative seed draws a fresh one
    stops: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    k: int | str | None = None  # None: the server's --k
    speculative: SpeculativeSettings | None = None

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
            raise PydanticCustomError("invalid_value", 'only text parts ({"type": "text", "text": ...}) are supported') from None


class Message(Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: Annotated[list[TextPart], BeforeValidator(_as_parts), expecting(CONTENT)] | None = Field(
        None, validate_default=True)  # None only in an assistant's turn (one that only called tools)

    @field_validator("content")
    @classmethod
    def _given(cls, content: list[TextPart] | None, info: ValidationInfo) -> list[TextPart] | None:
        if content is None and info.data.get("role") != "assistant":
            raise PydanticCustomError("invalid_type", "expected {expected}", {"expected": CONTENT})
        return content

    def turn(self) -> dict[str, str]:
        return {"role": ROLES[self.role], "content": "\n".join(part.text for part in self.content or ())}


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


class ChatBody(Body):
    messages: Annotated[list[Message], Field(min_length=1)]


class CompletionBody(Body):
    prompt: Annotated[str, BeforeValidator(_only_item), expecting("a string (or an array of one string)")]


def parse_chat(raw: bytes) -> GenerationRequest:
    """Raises ValidationError for a body of the wrong shape, SettingError for a setting out of range."""
    body = ChatBody.model_validate_json(raw)
    return _request(body, messages=[message.turn() for message in body.messages])


def parse_completion(raw: bytes) -> GenerationRequest:
    """Raises ValidationError for a body of the wrong shape, SettingError for a setting out of range."""
    body = CompletionBody.model_validate_json(raw)
    return _request(body, prompt=body.prompt)


def _request(body: Body, **what: Any) -> GenerationRequest:
    """What the worker runs, every setting checked by the library's rule."""
    if body.n not in (None, 1):
        raise ApiError(400, f"Invalid value for 'n': specrun returns one choice per request, but {body.n} were asked for.",
                       "n", "invalid_value")
    if body.k is not None and body.speculative is not None:
        raise ApiError(400, "Give either 'k' or 'speculative', not both.", "k", "invalid_value")
    sampling = body.model_dump(include=SAMPLING, exclude_none=True)
    check(**sampling)
    speculative = SpeculativeSettings(**body.speculative.model_dump(exclude_none=True)) if body.speculative else None
    options = body.stream_options
    return GenerationRequest(max_tokens=_max_tokens(body), sampling=sampling, seed=body.seed,
                             stops=tuple(stop for stop in body.stop or () if stop), stream=bool(body.stream),
                             include_usage=bool(options and options.include_usage),
                             k=None if body.k is None else parse_k(body.k), speculative=speculative, **what)


def _max_tokens(body: Body) -> int | None:
    """max_completion_tokens (OpenAI's newer name) or max_tokens; an error names the one given."""
    name = "max_tokens" if body.max_completion_tokens is None else "max_completion_tokens"
    try:
        check(max_tokens=getattr(body, name))
    except SettingError as error:
        raise setting_error(error, name) from None
    return getattr(body, name)


# --- errors ----------------------------------------------------------------------------
def setting_error(error: SettingError, param: str | None = None) -> ApiError:
    """A library setting's error as OpenAI's 400. `param` is the request field; by default
    the library's name, under `speculative.` for llama-server's speculative settings."""
    param = param or (f"speculative.{error.param}" if error.param in SPECULATIVE else error.param)
    return ApiError(400, f"Invalid value for '{param}': {error.phrase('it')}.", param, "invalid_value")


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
    return ApiError(400, f"Invalid value for '{param}': {message[0].lower()}{message[1:]}.", param, "invalid_value")


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


# --- responses -------------------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    """A finished generation, as the responses report it."""

    text: str
    finish_reason: str  # "stop", "length", or "abort" (the client went away or the server is stopping)
    prompt_tokens: int
    stats: Stats


def usage(outcome: Outcome) -> dict:
    cached = outcome.prompt_tokens - _prompt_n(outcome)
    return {
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": outcome.stats.tokens,
        "total_tokens": outcome.prompt_tokens + outcome.stats.tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def timings(outcome: Outcome) -> dict:
    """llama-server's `timings`: prompt tokens processed (not cached) and generated, with their times;
    with a draft of another vocabulary also what translating for it did (specrun's own keys)."""
    s = outcome.stats
    prompt_n, prompt_ms, predicted_ms = _prompt_n(outcome), 1000 * s.prefill_s, 1000 * s.generate_s
    translated = {"draft_translate_ms": 1000 * s.translate_s, "draft_n_reencoded": s.draft_tokens_reencoded,
                  "draft_n_mapped": s.draft_tokens_mapped, "draft_n_kept": s.draft_tokens_kept} if s.translated_feed else {}
    return {
        "cache_n": outcome.prompt_tokens - prompt_n,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": 1000 * prompt_n / prompt_ms if prompt_ms else 0.0,
        "predicted_n": s.tokens,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / s.tokens if s.tokens else 0.0,
        "predicted_per_second": 1000 * s.tokens / predicted_ms if predicted_ms else 0.0,
        "draft_n": s.drafted,
        "draft_n_accepted": s.accepted,
        **translated,
    }


def _prompt_n(outcome: Outcome) -> int:
    return outcome.stats.prefilled_tokens


class Shape:
    """Response bodies of one request: ids and creation time shared by all its chunks."""

    object_name = ""
    chunk_name = ""
    prefix = ""

    def __init__(self, model: str):
        self.id = f"{self.prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model

    def _head(self, name: str) -> dict:
        return {"id": self.id, "object": name, "created": self.created, "model": self.model}

    def response(self, outcome: Outcome) -> dict:
        body = self._head(self.object_name)
        body["choices"] = [{"index": 0, **self.whole(outcome.text), "logprobs": None, "finish_reason": outcome.finish_reason}]
        return {**body, "usage": usage(outcome), "timings": timings(outcome)}

    def chunk(self, text: str) -> dict:
        return {**self._head(self.chunk_name), "choices": [{"index": 0, **self.piece(text), "logprobs": None, "finish_reason": None}]}

    def final_chunk(self, outcome: Outcome) -> dict:
        choice = {"index": 0, **self.piece(None), "logprobs": None, "finish_reason": outcome.finish_reason}
        return {**self._head(self.chunk_name), "choices": [choice], "timings": timings(outcome)}

    def usage_chunk(self, outcome: Outcome) -> dict:
        """`stream_options.include_usage`: one more chunk, with no choices."""
        return {**self._head(self.chunk_name), "choices": [], "usage": usage(outcome), "timings": timings(outcome)}

    def opening_chunks(self) -> list[dict]:
        return []

    def whole(self, text: str) -> dict:
        raise NotImplementedError

    def piece(self, text: str | None) -> dict:
        raise NotImplementedError


class ChatShape(Shape):
    object_name, chunk_name, prefix = "chat.completion", "chat.completion.chunk", "chatcmpl"

    def whole(self, text: str) -> dict:
        return {"message": {"role": "assistant", "content": text}}

    def piece(self, text: str | None) -> dict:
        return {"delta": {} if text is None else {"content": text}}

    def opening_chunks(self) -> list[dict]:
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        return [{**self._head(self.chunk_name), "choices": [choice]}]


class CompletionShape(Shape):
    object_name, chunk_name, prefix = "text_completion", "text_completion", "cmpl"

    def whole(self, text: str) -> dict:
        return {"text": text}

    def piece(self, text: str | None) -> dict:
        return {"text": text or ""}
