"""OpenAI's request and response shapes, with llama-server's additions, and its error objects.

Parsing checks every field this server uses, by type and range, and ignores the rest
(as OpenAI does); a bad field becomes an `ApiError` naming it. Builders turn a finished
generation into `chat.completion` / `text_completion` bodies and stream chunks, each
carrying `usage` and llama-server's `timings`.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from specrun.engine import Stats
from specrun.policy import parse_k
from specrun.errors import SpecrunError

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
SAMPLING = {  # request field -> (kind, low, high, low open): checked, then passed to SamplerSettings
    "temperature": (float, 0.0, 2.0, False),
    "top_p": (float, 0.0, 1.0, True),
    "top_k": (int, 0, None, False),
    "min_p": (float, 0.0, 1.0, False),
}


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
class Speculative:
    """llama-server's per-request `speculative` object (its defaults)."""

    n_max: int = 16
    n_min: int = 0
    p_min: float = 0.75


@dataclass(frozen=True)
class GenerationRequest:
    messages: list[dict[str, str]] | None = None  # a chat request
    prompt: str | None = None  # a completion request
    max_tokens: int | None = None  # None: the server's default
    sampling: dict[str, Any] = field(default_factory=dict)  # overrides of the server's sampler settings
    seed: int | None = None  # None: the server's; a negative seed draws a fresh one
    stops: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    k: int | str | None = None  # None: the server's --k
    speculative: Speculative | None = None

    @property
    def chat(self) -> bool:
        return self.messages is not None


def read_json(raw: bytes) -> dict:
    try:
        payload = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, f"We could not parse the JSON body of your request ({exc}): send a JSON object.",
                       code="invalid_json") from None
    if not isinstance(payload, dict):
        raise ApiError(400, f"The request body has to be a JSON object, but is {_json_type(payload)}.", code="invalid_json")
    return payload


def parse_chat(payload: dict) -> GenerationRequest:
    messages = payload.get("messages")
    if messages is None:
        raise ApiError(400, "Missing required parameter: 'messages'.", "messages", "missing_required_parameter")
    if not isinstance(messages, list) or not messages:
        raise _type_error("messages", "a non-empty array of messages", messages)
    return _common(payload, messages=[_message(m, i) for i, m in enumerate(messages)])


def parse_completion(payload: dict) -> GenerationRequest:
    prompt = payload.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if prompt is None:
        raise ApiError(400, "Missing required parameter: 'prompt'.", "prompt", "missing_required_parameter")
    if not isinstance(prompt, str):
        raise _type_error("prompt", "a string (or an array of one string)", prompt)
    return _common(payload, prompt=prompt)


def _message(message: Any, index: int) -> dict[str, str]:
    param = f"messages[{index}]"
    if not isinstance(message, dict):
        raise _type_error(param, "an object", message)
    role = message.get("role")
    if role not in ROLES:
        raise ApiError(400, f"Invalid value for '{param}.role': {role!r}; supported roles are {', '.join(ROLES)}.",
                       f"{param}.role", "invalid_value")
    content = message.get("content")
    if content is None and role == "assistant":
        content = ""
    if isinstance(content, list):
        content = "\n".join(_text_part(part, f"{param}.content[{i}]") for i, part in enumerate(content))
    if not isinstance(content, str):
        raise _type_error(f"{param}.content", "a string or an array of text parts", content)
    return {"role": ROLES[role], "content": content}


def _text_part(part: Any, param: str) -> str:
    if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
        raise ApiError(400, f"Invalid value for '{param}': only text parts ({{\"type\": \"text\", \"text\": ...}}) are supported.",
                       param, "invalid_value")
    return part["text"]


def _common(payload: dict, **what: Any) -> GenerationRequest:
    n = _integer(payload, "n", 1, None)
    if n not in (None, 1):
        raise ApiError(400, f"Invalid value for 'n': specrun returns one choice per request, but {n} were asked for.",
                       "n", "invalid_value")
    max_tokens = _integer(payload, "max_completion_tokens", 1, None)
    if max_tokens is None:
        max_tokens = _integer(payload, "max_tokens", 1, None)
    sampling = {}
    for name, (kind, low, high, low_open) in SAMPLING.items():
        value = _integer(payload, name, low, high) if kind is int else _number(payload, name, low, high, low_open)
        if value is not None:
            sampling[name] = value
    seed = _integer(payload, "seed", None, None)
    stream = _boolean(payload, "stream") or False
    options = payload.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _type_error("stream_options", "an object", options)
    include_usage = bool(options and _boolean(options, "include_usage", "stream_options.include_usage"))
    k, speculative = _k(payload), _speculative(payload)
    if k is not None and speculative is not None:
        raise ApiError(400, "Give either 'k' or 'speculative', not both.", "k", "invalid_value")
    return GenerationRequest(max_tokens=max_tokens, sampling=sampling, seed=seed, stops=_stops(payload), stream=stream,
                             include_usage=include_usage, k=k, speculative=speculative, **what)


def _stops(payload: dict) -> tuple[str, ...]:
    stop = payload.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise _type_error("stop", "a string or an array of strings", stop)
    return tuple(s for s in stops if s)


def _k(payload: dict) -> int | str | None:
    k = payload.get("k")
    if k is None:
        return None
    if isinstance(k, str) and k in ("auto", "llama.cpp"):
        return k
    if isinstance(k, bool) or not isinstance(k, int):
        raise _type_error("k", "an integer or \"auto\"", k)
    try:
        return parse_k(str(k))
    except SpecrunError:
        raise ApiError(400, f"Invalid 'k': a draft length has to be >= 1, but is {k}.", "k", "invalid_value") from None


def _speculative(payload: dict) -> Speculative | None:
    settings = payload.get("speculative")
    if settings is None:
        return None
    if not isinstance(settings, dict):
        raise _type_error("speculative", "an object", settings)
    defaults = Speculative()
    n_max = _integer(settings, "n_max", 1, None, "speculative.n_max")
    n_min = _integer(settings, "n_min", 0, None, "speculative.n_min")
    p_min = _number(settings, "p_min", 0.0, 1.0, False, "speculative.p_min")
    result = Speculative(defaults.n_max if n_max is None else n_max, defaults.n_min if n_min is None else n_min,
                         defaults.p_min if p_min is None else p_min)
    if result.n_min > result.n_max:
        raise ApiError(400, f"Invalid 'speculative.n_min': it has to be <= n_max ({result.n_max}), but is {result.n_min}.",
                       "speculative.n_min", "invalid_value")
    return result


def _integer(payload: dict, name: str, low: int | None, high: int | None, param: str | None = None) -> int | None:
    value = payload.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _type_error(param or name, "an integer", value)
    _check_range(param or name, value, low, high, False)
    return value


def _number(payload: dict, name: str, low: float, high: float, low_open: bool, param: str | None = None) -> float | None:
    value = payload.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _type_error(param or name, "a number", value)
    _check_range(param or name, value, low, high, low_open)
    return float(value)


def _boolean(payload: dict, name: str, param: str | None = None) -> bool | None:
    value = payload.get(name)
    if value is not None and not isinstance(value, bool):
        raise _type_error(param or name, "a boolean", value)
    return value


def _check_range(param: str, value: float, low: float | None, high: float | None, low_open: bool) -> None:
    below = low is not None and (value <= low if low_open else value < low)
    if below or (high is not None and value > high):
        bounds = f"{'(' if low_open else '['}{low}, {high}]" if high is not None else f">= {low}"
        raise ApiError(400, f"Invalid value for '{param}': it has to be {'in ' if high is not None else ''}{bounds}, but is {value}.",
                       param, "invalid_value")


def _type_error(param: str, expected: str, value: Any) -> ApiError:
    return ApiError(400, f"Invalid type for '{param}': expected {expected}, but got {_json_type(value)} instead.",
                    param, "invalid_type")


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
    """llama-server's `timings`: prompt tokens processed (not cached) and generated, with their times."""
    s = outcome.stats
    prompt_n, prompt_ms, predicted_ms = _prompt_n(outcome), 1000 * s.prefill_s, 1000 * s.generate_s
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
