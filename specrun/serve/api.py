"""What the server runs for a request.

`parse_chat` and `parse_completion` read a body (specrun/serve/bodies.py) and check every
setting by the library's rule (`specrun.settings`, `SpeculativeSettings`, `parse_k`) before
the request is queued; so is the grammar of `response_format`, `json_schema` or `grammar`
(specrun/grammar/schemas.py) and of the tools' schemas. OpenAI's fields that specrun cannot
honour (`UNSUPPORTED`) are refused rather than ignored, with the errors of
specrun/serve/api_errors.py. A chat prompt ends with the reply's cue, or continues a last
assistant message as llama-server does (`_ending`). Builders turn a finished generation into
`chat.completion` / `text_completion` bodies and stream chunks (specrun/serve/responses.py).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from specrun.chat.formats import Ending
from specrun.core.policy import SpeculativeSettings
from specrun.errors import SpecrunError
from specrun.grammar.schemas import Grammar, SchemaError, grammar_from_gbnf, grammar_from_json_schema, json_object_grammar
from specrun.serve.api_errors import ApiError, invalid_value, setting_error
from specrun.serve.bodies import Body, ChatBody, CompletionBody
from specrun.serve.tools import ToolRequest, call_grammar, function_parameters
from specrun.settings import SettingError, check, check_logit_bias, parse_k, shown

# Request fields passed on to SamplerSettings, named as there: OpenAI's, and llama-server's own.
SAMPLING = {
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repeat_penalty",
    "repeat_last_n",
    "xtc_probability",
    "xtc_threshold",
    "typical_p",
    "top_n_sigma",
    "dynatemp_range",
    "dynatemp_exponent",
}
UNSUPPORTED = {  # OpenAI's fields specrun cannot honour, refused (not ignored) when they ask for something
    "functions": "it is OpenAI's deprecated function calling: send 'tools' instead",
    "function_call": "it is OpenAI's deprecated function calling: send 'tool_choice' (with 'tools') instead",
}


# llama-server's samplers specrun does not run: the field that turns each on, what it is, when it is off.
SAMPLERS_NOT_RUN: dict[str, tuple[str, str, Callable[[float], bool]]] = {
    "dry_multiplier": ("DRY", "0", lambda value: value == 0),
    "mirostat": ("Mirostat", "0", lambda value: value == 0),
}


@dataclass(frozen=True)
class Infill:
    """What fills the middle of a file (llama-server's /infill): the text before and after it,
    other files as (name, text), and the text the middle starts with."""

    prefix: str
    suffix: str
    extra: tuple[tuple[str, str], ...] = ()
    prompt: str = ""


@dataclass(frozen=True)
class GenerationRequest:
    messages: list[dict[str, Any]] | None = None  # a chat request: its turns (Message.turn)
    ending: Ending = "reply"  # a chat request's prompt: ends with the reply's cue, with nothing, or continues the last turn
    prompt: str | None = None  # a completion request
    prompt_tokens: tuple[int, ...] | None = None  # a completion request's prompt as token ids (llama-server's)
    infill: Infill | None = None  # a fill-in-the-middle request (llama-server's /infill)
    max_tokens: int | None = None  # None: the server's default
    up_to_context: bool = False  # a max_tokens beyond the context ends the reply when the context fills (not a 400)
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
    pieces: bool = False  # `specrun.pieces`: stream chunks carry their text split by how it came (serve/sources.py)
    logprobs: int | None = None  # each token's log-probability and this many alternatives (None: not asked)
    return_tokens: bool = False  # llama-server's: the reply's token ids too
    return_progress: bool = False  # llama-server's: a stream reports the prompt's processing

    @property
    def chat(self) -> bool:
        return self.messages is not None


def parse_chat(raw: bytes) -> GenerationRequest:
    """Raises ValidationError for a body of the wrong shape, SettingError for a setting out of range,
    ApiError for a field specrun cannot honour."""
    body = ChatBody.model_validate_json(raw)
    tools = _tools(body)
    messages = [message.turn() for message in body.messages]
    ending = _ending(body, messages)
    request = checked_request(body, messages=messages, ending=ending, tools=tools, logprobs=_chat_logprobs(body))
    if tools is not None and request.logprobs is not None:
        why = 'a reply\'s calls carry no log probabilities (send one or the other, or tool_choice "none").'
        raise _not_with_tools("logprobs", why)
    if tools is not None and request.pieces:
        raise _not_with_tools("specrun.pieces", "a reply's calls are not split by how their tokens came (send one or the other).")
    if tools is not None and request.grammar is not None:
        raise _not_with_tools(str(request.grammar_param), 'hold the reply to one or the other (or send tool_choice "none").')
    return request


def _ending(body: ChatBody, messages: list[dict[str, Any]]) -> Ending:
    """How the prompt ends, by llama-server's rules: a last assistant message is continued (a
    prefill) unless continue_final_message says otherwise; add_generation_prompt false ends it
    after the last message."""
    asked = body.continue_final_message
    if isinstance(asked, str) and asked != "content":
        raise invalid_value(
            "continue_final_message", f'specrun continues a message\'s content: send true or "content", not {asked!r}.'
        )
    last_two = [message["role"] for message in messages[-2:]]
    if asked is None and last_two[-1] == "assistant":
        if last_two == ["assistant", "assistant"]:
            raise invalid_value(
                "messages", "two or more assistant messages end the conversation: only the last can be continued."
            )
        asked = True
    elif asked and body.add_generation_prompt is not False:
        raise invalid_value(
            "continue_final_message", "send add_generation_prompt false with it: a continued message has no reply cue."
        )
    if asked and (last_two[-1] != "assistant" or messages[-1].get("tool_calls")):
        raise invalid_value(
            "continue_final_message", "the last message is continued, so it must be an assistant's text without tool calls."
        )
    if asked:
        return "continue"
    return "none" if body.add_generation_prompt is False else "reply"


def _not_with_tools(param: str, why: str) -> ApiError:
    return ApiError(400, f"Unsupported parameter: '{param}' together with 'tools': {why}", param, "unsupported_parameter")


def parse_translated_chat(chat: dict[str, Any], renames: Sequence[tuple[re.Pattern, str]]) -> GenerationRequest:
    """`parse_chat` of a body another protocol's request was translated into (serve/messages.py,
    serve/responses_api.py); an error about one of its fields names the field that request sent,
    by the first of `renames` (a pattern of the chat field, its replacement) that matches."""
    try:
        return parse_chat(json.dumps(chat).encode())
    except ApiError as error:
        theirs = error.param or ""
        ours = next((pattern.sub(name, theirs) for pattern, name in renames if pattern.match(theirs)), theirs)
        if ours == theirs:
            raise
        raise ApiError(error.status, error.message.replace(theirs, ours), ours, error.code, error.kind, error.headers) from None


def parse_completion(raw: bytes) -> GenerationRequest:
    """Raises ValidationError for a body of the wrong shape, SettingError for a setting out of range,
    ApiError for a field specrun cannot honour."""
    body = CompletionBody.model_validate_json(raw)
    check(logprobs=body.logprobs)
    return checked_request(body, prompt=body.prompt, logprobs=body.logprobs)


def _chat_logprobs(body: ChatBody) -> int | None:
    """How many alternatives a chat request asked for beside each token's log-probability (None: no logprobs)."""
    if body.top_logprobs is not None and not body.logprobs:
        raise invalid_value("top_logprobs", 'it comes with each token\'s log-probability: send "logprobs": true too.')
    try:
        check(logprobs=body.top_logprobs)
    except SettingError as error:
        raise setting_error(error, "top_logprobs") from None
    return (body.top_logprobs or 0) if body.logprobs else None


def checked_request(body: Body, **what: Any) -> GenerationRequest:
    """What the worker runs, every setting checked by the library's rule."""
    _refuse_unsupported(body)
    if body.n not in (None, 1):
        raise invalid_value("n", f"specrun returns one choice per request, but {body.n} were asked for.")
    if body.k is not None and body.speculative is not None:
        raise ApiError(400, "Give either 'k' or 'speculative', not both.", "k", "invalid_value")
    sampling = body.model_dump(include=SAMPLING, exclude_none=True)
    check(**sampling)
    if body.logit_bias:
        sampling["logit_bias"] = _logit_bias(body.logit_bias)
    if body.ignore_eos is not None:
        sampling["ignore_eos"] = body.ignore_eos
    speculative = SpeculativeSettings(**body.speculative.model_dump(exclude_none=True)) if body.speculative else None
    options = body.stream_options
    pieces = bool(body.specrun and body.specrun.pieces)
    if pieces and not body.stream:
        raise invalid_value("specrun.pieces", 'the pieces come in stream chunks: send "stream": true too.')
    grammar, grammar_param = _output_grammar(body)
    return GenerationRequest(
        max_tokens=_max_tokens(body),
        sampling=sampling,
        seed=body.seed,
        stops=tuple(stop for stop in body.stop or () if stop),
        stream=bool(body.stream),
        include_usage=bool(options and options.include_usage),
        k=None if body.k is None else parse_k(body.k),
        speculative=speculative,
        grammar=grammar,
        grammar_param=grammar_param,
        pieces=pieces,
        **what,
    )


def _refuse_unsupported(body: Body) -> None:
    """OpenAI's fields specrun cannot honour, and llama-server's samplers it does not run, when they
    ask for something, are refused rather than ignored."""
    for name, why in UNSUPPORTED.items():
        value = getattr(body, name, None)
        if not (value is None or value is False or value in ({}, [])):
            raise ApiError(400, f"Unsupported parameter: '{name}': {why}.", name, "unsupported_parameter")
    for name, (sampler, off_value, off) in SAMPLERS_NOT_RUN.items():
        value = getattr(body, name)
        if value is not None and not off(value):
            raise ApiError(
                400,
                f"Unsupported parameter: '{name}': specrun does not run llama.cpp's {sampler} sampler ({off_value} turns it off).",
                name,
                "unsupported_parameter",
            )


def _logit_bias(given: dict[str, float | bool] | list[list[int | float | bool]]) -> dict[int, float]:
    """OpenAI's logit_bias (token ids as strings, to a bias from -100 to 100), or llama-server's
    [[id, bias], ...]; false bans a token, as llama-server's does. The ids are checked against the
    model's vocabulary when the request runs."""
    bias = {}
    for entry in given.items() if isinstance(given, dict) else given:
        if len(entry) != 2:
            raise invalid_value("logit_bias", f"its pairs are [token id, bias], but one is {shown(list(entry))}.")
        key, value = entry
        token = key if type(key) is int else int(key) if isinstance(key, str) and _an_id(key) else None
        if token is None:
            raise invalid_value("logit_bias", f'it names tokens by their ids, such as "15043", but one is {shown(key)}.')
        if isinstance(value, bool) and value:
            raise invalid_value("logit_bias", "a bias is a number from -100 to 100, or false to ban the token, but one is true.")
        bias[token] = -math.inf if value is False else value
    check_logit_bias(bias)
    return bias


def _an_id(key: str) -> bool:
    """Whether a logit_bias key reads as a token id (no vocabulary has 18 digits' worth)."""
    return key.isascii() and key.isdigit() and len(key) <= 18


def _output_grammar(body: Body) -> tuple[Grammar | None, str | None]:
    """The grammar the output is held to and the field it came from: response_format, or
    llama-server's json_schema (a schema) or grammar (GBNF); at most one of them."""
    response_format = body.response_format
    kind = response_format.type if response_format else "text"
    asked = {"response_format": kind != "text", "json_schema": body.json_schema is not None, "grammar": body.grammar is not None}
    given = [name for name, on in asked.items() if on]
    if len(given) > 1:
        raise ApiError(
            400,
            f"Give only one of {' and '.join(map(repr, given))}: each says what the output is held to.",
            given[1],
            "invalid_value",
        )
    if not given:
        return None, None
    with_schema = kind == "json_object" and response_format is not None and response_format.schema_ is not None
    param = (
        "response_format.json_schema.schema" if kind == "json_schema" else "response_format.schema" if with_schema else given[0]
    )
    try:
        if response_format is not None and kind != "text":
            # json_schema's validator makes it present with that type; json_object holds to its schema
            # (llama-server's form) or, without one, to any JSON object
            schema = response_format.json_schema.schema_ if response_format.json_schema else None
            schema = response_format.schema_ if kind == "json_object" else schema
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
        raise invalid_value(
            "tool_choice.function.name",
            f"no tool is called {named!r} (the tools: {', '.join(function['name'] for function in functions)}).",
        )
    return ToolRequest(
        tuple({"type": "function", "function": function} for function in functions),
        must_call=choice != "auto",
        named=named,
        parallel=body.parallel_tool_calls is not False,
        call=call,
    )


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
                grammar_from_json_schema(function_parameters(function), tool_arguments=True)
        return call_grammar(chosen) if chosen else None
    except SchemaError as together:
        for i, function in enumerate(functions):
            try:
                grammar_from_json_schema(function_parameters(function), tool_arguments=True)
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
