"""llama-server's native generation routes: `POST /completion` (and `/completions`, as llama-server
maps it) and `POST /infill`, with its fields and its answers.

Editor plugins (llama.vscode, Continue's autocomplete) and scripts written for llama-server call
them. A request is checked by the rules of the OpenAI routes (`api.checked_request`) and runs on
the same slots and drafts; a prompt may be token ids. /infill builds the fill-in-the-middle
prompt from the model's own FIM tokens as llama-server does (`infill_tokens`): the extra files,
then the prefix, the suffix and the middle token, so prompt lookup drafts from the file being
edited and its neighbours. The answer is llama-server's: `content`, `tokens`, `stop_type`,
`timings`, `generation_settings`, streamed as `data:` chunks with `stop` false, then the last.
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any, AsyncIterator, Sequence

from pydantic import Field

from specrun.backend import Model
from specrun.serve import api
from specrun.serve.api import GenerationRequest, Infill
from specrun.serve.api_errors import ApiError, invalid_value, setting_error
from specrun.serve.bodies import Body, Strict, expecting
from specrun.serve.jobs import Failed, Finished, Job, Started, Text
from specrun.serve.logprobs import Alternative, Scored
from specrun.serve.responses import Outcome, timings
from specrun.settings import SettingError, check

REPOSITORY_LINE = "myproject\n"  # llama-server's repository name in repo-level FIM prompts
SNIPPET_SEPARATOR = "\n\n--- snippet ---\n\n"  # between extra files where the vocabulary has no file separator
STOP_TYPES = {"stop": "eos", "length": "limit"}


class NativeBody(Body):
    """llama-server's /completion body: OpenAI's settings (by the same names) and its own."""

    prompt: Annotated[str | list[int], expecting("a string or an array of token ids")] = ""
    n_predict: int | None = None  # -1: until the context is full
    n_probs: int | None = None  # each token's probability and this many alternatives
    cache_prompt: bool | None = None  # accepted: a slot's cached prompt is always reused
    return_tokens: bool | None = None  # the reply's token ids in `tokens`
    return_progress: bool | None = None  # a stream's chunks report the prompt's processing


class ExtraFile(Strict):
    text: str
    filename: str = "tmp"


class InfillBody(NativeBody):
    prompt: str = ""  # text the middle starts with
    input_prefix: str
    input_suffix: str
    input_extra: list[ExtraFile] = Field(default_factory=list)


def parse_completion(raw: bytes) -> GenerationRequest:
    body = NativeBody.model_validate_json(raw)
    tokens = tuple(body.prompt) if isinstance(body.prompt, list) else None
    return _checked(body, prompt=body.prompt if tokens is None else None, prompt_tokens=tokens)


def parse_infill(raw: bytes) -> GenerationRequest:
    body = InfillBody.model_validate_json(raw)
    return _checked(
        body,
        infill=Infill(body.input_prefix, body.input_suffix, tuple((f.filename, f.text) for f in body.input_extra), body.prompt),
    )


def _checked(body: NativeBody, **what: Any) -> GenerationRequest:
    """The request, its settings checked by the OpenAI routes' rules; n_predict -1 or -2 (or left
    out) is the server's limit; 0 answers, as llama-server does, with the one token the prompt's
    processing gives (llama.vscode sends its extra files so, to find them cached next time);
    n_probs asks for log probabilities."""
    if body.n_predict is not None and body.n_predict < -2:
        raise invalid_value(
            "n_predict", f"it is -1 (or -2: as many as the server allows) or a number of tokens, not {body.n_predict}."
        )
    if body.n_predict is not None and body.n_predict >= 0:
        body = body.model_copy(update={"max_tokens": max(body.n_predict, 1)})
    try:
        check(logprobs=body.n_probs)
    except SettingError as error:
        raise setting_error(error, "n_probs") from None
    if body.return_tokens and body.stream:
        raise invalid_value("return_tokens", "the reply's token ids come with the whole reply: leave out stream.")
    if body.return_progress and not body.stream:
        raise invalid_value("return_progress", 'the prompt\'s progress comes in stream chunks: send "stream": true too.')
    return api.checked_request(
        body,
        logprobs=body.n_probs or None,
        return_tokens=bool(body.return_tokens),
        return_progress=bool(body.return_progress),
        **what,
    )


def infill_tokens(model: Model, infill: Infill, n_batch: int, n_predict: int, n_ctx: int) -> list[int]:
    """The fill-in-the-middle prompt, as llama-server's `format_prompt_infill` builds it (repo-level:
    the repository line and each extra file after a file separator, then the current file): the
    prefix's last 3/4 of a batch and the suffix's first part of the rest, the extra files taking
    what is left of the context after a batch and twice `n_predict`. A 400 for a vocabulary
    without FIM tokens."""
    fim = model.fim_tokens
    missing = [name for name, token in (("prefix", fim.pre), ("suffix", fim.suf), ("middle", fim.mid)) if token is None]
    if fim.pre is None or fim.suf is None or fim.mid is None:
        raise ApiError(
            400,
            f"Infill is not supported by this model: its vocabulary has no fill-in-the-middle {' or '.join(missing)} token. "
            "Serve a code model trained for infill (Qwen2.5-Coder, StarCoder2, CodeGemma, ...), or send the text to "
            "/completion.",
            "input_prefix",
            "infill_unsupported",
        )

    def tokens(text: str) -> list[int]:
        return model.tokenize(text, add_special=False, parse_special=False)

    extra = [fim.rep, *tokens(REPOSITORY_LINE)] if fim.rep is not None else []
    for filename, text in infill.extra:
        extra += [fim.sep, *tokens(filename + "\n")] if fim.sep is not None else tokens(SNIPPET_SEPARATOR)
        extra += tokens(text)
    if fim.sep is not None:
        extra += [fim.sep, *tokens("filename\n")]
    prompt = model.tokenize(infill.prompt, add_special=False, parse_special=True)
    prefix, suffix = tokens(infill.prefix), tokens(infill.suffix)
    prefix = prefix[len(prefix) - min(len(prefix), 3 * (n_batch // 4)) :]
    suffix = suffix[: min(len(suffix), max(0, n_batch // 4 - (2 + len(prompt))))]
    n_extra = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra))
    start = ([model.bos] if model.add_bos else []) + [fim.pre, *prefix, *prompt]
    return extra[len(extra) - n_extra :] + start + [fim.suf, *suffix, fim.mid]


class NativeShape:
    """llama-server's native answer: a body for the whole reply, or `data:` chunks ending with one
    whose `stop` is true (no [DONE])."""

    def __init__(self, model: str, request: GenerationRequest):
        self.model, self.request = model, request

    def response(self, outcome: Outcome) -> dict:
        return self._final(outcome, outcome.text or "")

    def _final(self, outcome: Outcome, content: str) -> dict:
        request, stats = self.request, outcome.stats
        word = outcome.stop if outcome.stop in request.stops else None  # not the template's stop
        body = {
            "index": 0,
            "content": content,
            "tokens": list(outcome.tokens) if request.return_tokens else [],
            "stop": True,
            "model": self.model,
            "tokens_predicted": stats.tokens,
            "tokens_evaluated": outcome.prompt_tokens,
            "generation_settings": self._settings(),
            "has_new_line": "\n" in (outcome.text or ""),
            "truncated": False,
            "stop_type": "word" if word else STOP_TYPES.get(outcome.finish_reason, "none"),
            "stopping_word": word or "",
            "tokens_cached": outcome.prompt_tokens + stats.tokens,
            "timings": timings(outcome),
        }
        if outcome.logprobs is not None and content:
            body["completion_probabilities"] = _probabilities(outcome.logprobs)
        return body

    def _settings(self) -> dict:
        """What the request set of the settings llama-server lists (the server's own where it left them out)."""
        request = self.request
        return {
            "n_predict": -1 if request.max_tokens is None else request.max_tokens,
            "n_probs": request.logprobs or 0,
            "stream": request.stream,
            "stop": list(request.stops),
            **({"seed": request.seed} if request.seed is not None else {}),
            **request.sampling,
        }

    async def events(self, job: Job, started: Started) -> AsyncIterator[str]:
        """A chunk per piece of text (with its tokens' probabilities where asked), then the final
        one; an error chunk where the generation failed. Cancels the job when done. With
        `return_progress`, a chunk with the prompt's progress first, and one when it is processed."""
        progress = PromptProgress(started) if self.request.return_progress else None
        try:
            if progress is not None:
                yield _data(progress.chunk())
            while True:
                report = await job.next()
                if progress is not None and isinstance(report, (Text, Finished)) and not progress.done:
                    yield _data(progress.chunk(done=True))
                if isinstance(report, Text) and report.text:
                    chunk = {"index": 0, "content": report.text, "tokens": [], "stop": False}
                    chunk["tokens_evaluated"] = started.prompt_tokens
                    if report.logprobs is not None:
                        chunk["completion_probabilities"] = _probabilities(report.logprobs)
                    yield _data(chunk)
                elif isinstance(report, Failed):
                    yield _data(report.error.body())
                    return
                elif isinstance(report, Finished):
                    if report.outcome.finish_reason == "abort":
                        yield _data(ApiError(503, "the server is shutting down: the generation was stopped").body())
                    else:
                        yield _data(self._final(report.outcome, ""))
                    return
        finally:
            job.cancel()


class PromptProgress:
    """llama-server's `prompt_progress`: of the prompt's tokens, those its slot held (`cache`) and
    those processed so far, and the milliseconds since its processing began. It is processed in
    one step here (a long prompt beside others in a few, which llama-server reports apart): a
    chunk at the start and one when the first token comes, as llama-server's for a prompt
    within its batch."""

    def __init__(self, started: Started):
        self.started, self.began, self.done = started, time.perf_counter(), False

    def chunk(self, done: bool = False) -> dict:
        self.done = done
        total, cache = self.started.prompt_tokens, self.started.cached
        progress = {
            "total": total,
            "cache": cache,
            "processed": total if done else cache,
            "time_ms": round(1000 * (time.perf_counter() - self.began)) if done else 0,
        }
        return {"index": 0, "content": "", "tokens": [], "stop": False, "tokens_evaluated": total, "prompt_progress": progress}


def _probabilities(scored: Sequence[Scored]) -> list[dict]:
    return [{**_token(s.token), "top_logprobs": [_token(a) for a in s.top]} for s in scored]


def _token(token: Alternative) -> dict:
    return {"id": token.id, "token": token.text, "bytes": list(token.raw), "logprob": token.logprob}


def _data(body: dict) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False, separators=(',', ':'))}\n\n"
