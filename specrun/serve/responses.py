"""OpenAI's response bodies: a finished generation as `chat.completion` / `text_completion`
bodies and stream chunks, each carrying `usage` and llama-server's `timings`."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from specrun.core.events import Stats
from specrun.drafts.translated import TranslationStats
from specrun.serve.logprobs import Alternative, Scored
from specrun.serve.tool_calls import CallPiece, ToolCall


@dataclass(frozen=True)
class Outcome:
    """A finished generation, as the responses report it."""

    text: str | None  # None: a reply that only called tools
    finish_reason: str  # "stop", "length", "tool_calls", or "abort" (the client went away or the server is stopping)
    prompt_tokens: int
    stats: Stats
    tool_calls: tuple[ToolCall, ...] = ()
    logprobs: tuple[Scored, ...] | None = None  # asked for: the kept tokens'
    stop: str | None = None  # the stop string that ended it, the request's or the chat template's
    tokens: tuple[int, ...] = ()  # the reply's token ids (its text's, as kept)
    reasoning: str | None = None  # a reasoning model's thinking, apart from `text` (serve/reasoning.py)


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
    forced = s.accepted_by_source.get("grammar", 0)
    translation = TranslationStats.of(s.counters)
    translated = (
        {
            "draft_translate_ms": 1000 * translation.seconds,
            "draft_n_reencoded": translation.reencoded,
            "draft_n_kept": translation.kept,
        }
        if translation
        else {}
    )
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
        **({"draft_n_grammar": forced} if forced else {}),
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
        logprobs = None if outcome.logprobs is None else self.logprobs(outcome.logprobs)
        body["choices"] = [{"index": 0, **self.whole(outcome), "logprobs": logprobs, "finish_reason": outcome.finish_reason}]
        return {**body, "usage": usage(outcome), "timings": timings(outcome)}

    def chunk(self, text: str, specrun: dict | None = None, scored: tuple[Scored, ...] | None = None) -> dict:
        """`specrun`: the field a request asked for with `specrun.pieces` (serve/sources.py);
        `scored`: the tokens the text completes, where the request asked for logprobs."""
        logprobs = None if scored is None else self.logprobs(scored)
        body = {
            **self._head(self.chunk_name),
            "choices": [{"index": 0, **self.piece(text), "logprobs": logprobs, "finish_reason": None}],
        }
        return body if specrun is None else {**body, "specrun": specrun}

    def final_chunk(self, outcome: Outcome, specrun: dict | None = None) -> dict:
        choice = {"index": 0, **self.piece(None), "logprobs": None, "finish_reason": outcome.finish_reason}
        body = {**self._head(self.chunk_name), "choices": [choice], "timings": timings(outcome)}
        return body if specrun is None else {**body, "specrun": specrun}

    def usage_chunk(self, outcome: Outcome) -> dict:
        """`stream_options.include_usage`: one more chunk, with no choices."""
        return {**self._head(self.chunk_name), "choices": [], "usage": usage(outcome), "timings": timings(outcome)}

    def call_chunk(self, piece: CallPiece) -> dict:
        """A piece of a tool call (chat only)."""
        raise NotImplementedError

    def thought_chunk(self, text: str) -> dict:
        """A piece of a reasoning model's thinking (chat only)."""
        raise NotImplementedError

    def opening_chunks(self) -> list[dict]:
        return []

    def whole(self, outcome: Outcome) -> dict:
        raise NotImplementedError

    def piece(self, text: str | None) -> dict:
        raise NotImplementedError

    def logprobs(self, scored: tuple[Scored, ...]) -> dict:
        raise NotImplementedError


class ChatShape(Shape):
    object_name, chunk_name, prefix = "chat.completion", "chat.completion.chunk", "chatcmpl"

    def whole(self, outcome: Outcome) -> dict:
        message: dict[str, Any] = {"role": "assistant", "content": outcome.text}
        if outcome.reasoning:
            message["reasoning_content"] = outcome.reasoning  # as llama-server names it
        if outcome.tool_calls:
            message["tool_calls"] = [
                {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
                for call in outcome.tool_calls
            ]
        return {"message": message}

    def piece(self, text: str | None) -> dict:
        return {"delta": {} if text is None else {"content": text}}

    def logprobs(self, scored: tuple[Scored, ...]) -> dict:
        return {
            "content": [{**_alternative(s.token), "top_logprobs": [_alternative(a) for a in s.top]} for s in scored],
            "refusal": None,
        }

    def call_chunk(self, piece: CallPiece) -> dict:
        """OpenAI's order: the call's index, id, type and name first, then pieces of its arguments."""
        call = {"index": piece.index, "function": {"arguments": piece.arguments}}
        if piece.id is not None:
            call = {
                "index": piece.index,
                "id": piece.id,
                "type": "function",
                "function": {"name": piece.name, "arguments": piece.arguments},
            }
        choice = {"index": 0, "delta": {"tool_calls": [call]}, "logprobs": None, "finish_reason": None}
        return {**self._head(self.chunk_name), "choices": [choice]}

    def thought_chunk(self, text: str) -> dict:
        choice = {"index": 0, "delta": {"reasoning_content": text}, "logprobs": None, "finish_reason": None}
        return {**self._head(self.chunk_name), "choices": [choice]}

    def opening_chunks(self) -> list[dict]:
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        return [{**self._head(self.chunk_name), "choices": [choice]}]


class CompletionShape(Shape):
    object_name, chunk_name, prefix = "text_completion", "text_completion", "cmpl"

    def whole(self, outcome: Outcome) -> dict:
        return {"text": outcome.text}

    def piece(self, text: str | None) -> dict:
        return {"text": text or ""}

    def logprobs(self, scored: tuple[Scored, ...]) -> dict:
        """The legacy form: parallel lists, and each token's alternatives as one object (by text:
        two tokens of the same text keep the likelier)."""
        return {
            "tokens": [s.token.text for s in scored],
            "token_logprobs": [s.token.logprob for s in scored],
            "top_logprobs": [_by_text(s.top) for s in scored],
            "text_offset": [s.offset for s in scored],
        }


def _by_text(top: tuple[Alternative, ...]) -> dict[str, float]:
    by_text: dict[str, float] = {}
    for alternative in top:
        by_text.setdefault(alternative.text, alternative.logprob)
    return by_text


def _alternative(token: Alternative) -> dict:
    return {"token": token.text, "logprob": token.logprob, "bytes": list(token.raw)}
