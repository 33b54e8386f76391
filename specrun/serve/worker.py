"""One model on one thread: up to `slots` requests run together, their rows in one target decode
per step (a `Batch`); the rest wait, in arrival order, in a bounded queue.

A waiting request takes the free slot that throws away least of what it holds
(`Slots.slot_for`), so a client's next turn prefills only what is new. The event loop submits a
`Job` and awaits what the worker reports on it: `Started` (the prompt fits and the reply
begins) or `Failed`, then `Text` pieces (and `CallPiece`s of the tools it calls, read from
the reply by `CallReader`), then `Finished`. A job that is cancelled (its client went away,
or the server is stopping) ends at the next event of its generation, within the step in
flight, and frees its slot.
"""

from __future__ import annotations

import asyncio
import math
import queue
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Callable

from specrun.chat.conversation import Transcript
from specrun.chat.formats import TEMPLATE, Rendered, choose_format
from specrun.chat.reply import Reply, ReplyStream
from specrun.core.engine import Engine
from specrun.core.events import Generation
from specrun.core.policy import SpeculativeRule
from specrun.errors import RpcLost, SpecrunError
from specrun.serve.api import GenerationRequest
from specrun.serve.api_errors import ApiError, invalid_value, setting_error
from specrun.serve.calibration import Calibration
from specrun.serve.jobs import Failed, Finished, Job, Started
from specrun.serve.logprobs import LogprobWatch
from specrun.serve.metrics import Metrics
from specrun.serve.native import infill_tokens
from specrun.serve.reasoning import ReasoningReader, opens_thinking, thinks
from specrun.serve.reporter import Reporter
from specrun.serve.sources import SourceLabels
from specrun.serve.tool_calls import CallReader
from specrun.serve.tools import prompt_messages, tool_grammar, tool_style
from specrun.session import Session
from specrun.session.slots import Slots
from specrun.settings import SettingError


@dataclass(frozen=True)
class Prompt:
    tokens: list[int]
    text: str
    stops: tuple[str, ...]


class Worker:
    def __init__(
        self,
        open_session: Callable[[], Session],
        metrics: Metrics,
        queue_size: int = 32,
        max_tokens: int | None = None,
        chat_format: str | None = None,
        on_ready: Callable[[Session], None] = lambda session: None,
        on_failed: Callable[[BaseException], None] = lambda error: None,
        grammar_drafts: bool = True,
        slots: int = 1,
    ):
        """`grammar_drafts`: a request held to a grammar drafts what the grammar forces; `slots`:
        requests run at once (the session's streams)."""
        self._open_session = open_session
        self.grammar_drafts = grammar_drafts
        self.metrics = metrics
        self.queue_size = queue_size
        self.max_tokens = max_tokens  # None: until the context is full
        self._chat_format_name = chat_format
        self._on_ready, self._on_failed = on_ready, on_failed
        self.state = "loading"  # then "ready", "failed", "stopping", or "lost" (an RPC server went away)
        self.error: BaseException | None = None
        self.session: Session | None = None
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self.tokenizers = ThreadPoolExecutor(thread_name_prefix="specrun-tokenize")  # /tokenize, beside generations
        self._submit_lock = threading.Lock()
        self.n_slots = slots
        self._slots: Slots[Job] | None = None  # once the model has loaded
        self._calibration = Calibration()  # auto's verify costs, measured between requests on a first start
        self._request_s = 0.0  # recent requests' time on the model, for Retry-After
        self._thread = threading.Thread(target=self._run, name="specrun-model", daemon=True)

    # --- the event loop's side ----------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    @property
    def running(self) -> dict[int, Job]:
        """slot -> the job running on it."""
        return self._slots.busy if self._slots is not None else {}

    @property
    def waiting(self) -> int:
        return self._jobs.qsize()

    def unavailable(self) -> ApiError | None:
        """Why the model takes no requests now (a 503 for /health and every request), or None when ready."""
        if self.state == "ready":
            return None
        if self.state == "lost":  # the RPC servers' layers are gone: every request would fail
            return self._lost()
        message = {"loading": "Loading model", "stopping": "the server is shutting down"}.get(
            self.state, "the model failed to load"
        )
        return ApiError(
            503,
            message,
            code="unavailable",
            kind="unavailable_error",
            headers={"Retry-After": "1"} if self.state == "loading" else None,
        )

    def ready(self) -> Session:
        """The session, once its model has loaded (else the 503 that says why not)."""
        refusal = self.unavailable()
        if refusal is not None:
            raise refusal
        return self._loaded

    def _lost(self) -> ApiError:
        return ApiError(503, str(self.error), code="rpc_lost", kind="unavailable_error")

    def submit(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop) -> Job:
        refusal = self.unavailable()
        if refusal is not None:
            raise refusal
        with self._submit_lock:
            if self._jobs.qsize() >= self.queue_size:
                self.metrics.reject("queue_full")
                wait = max(1, math.ceil(self._request_s * (self.queue_size + 1)))
                raise ApiError(
                    429,
                    f"the queue is full ({self.queue_size} requests waiting): retry in {wait} s",
                    code="queue_full",
                    kind="rate_limit_error",
                    headers={"Retry-After": str(wait)},
                )
            job = Job(request, loop)
            self._jobs.put(job)
        return job

    def cancel_all(self) -> None:
        with self._jobs.mutex:
            waiting = [job for job in self._jobs.queue if job is not None]
        for job in [*self.running.values(), *waiting]:
            if job is not None:
                job.cancel()

    def stop(self) -> None:
        """Cancel every request, let the thread finish, close the session."""
        if self.state in ("loading", "ready"):
            self.state = "stopping"
        self.cancel_all()
        self._jobs.put(None)
        if self._thread.is_alive():
            self._thread.join()

    # --- the model thread -------------------------------------------------------------
    @property
    def _loaded(self) -> Session:
        """The session, for the methods below `_run`, which run only once it has loaded."""
        assert self.session is not None
        return self.session

    def _run(self) -> None:
        try:
            self.session = self._open_session()
            self._chat_format = choose_format(self.session.target_model, self._chat_format_name)
            self._tool_style = tool_style(self._chat_format)
            self._thinks = self._chat_format.name == TEMPLATE and thinks(self.session.target_model.chat_template)
            self._transcript = Transcript(self.session.target_model)
            self.defaults = self.session.config.sampler  # the server's defaults; requests override them
            self._calibration.start(self.session)  # under auto, verify costs now, not in the first request
            if self.session.drafter is not None and not self._calibration.running:
                self.session.policies.policy(self.session.config.k)
        except BaseException as exc:  # noqa: BLE001 - reported to the command, which exits with it
            self.state, self.error = "failed", exc
            if self.session is not None:
                self.session.close()
            self._on_failed(exc)
            return
        if self.state == "loading":
            self.state = "ready"
            self._on_ready(self.session)
        self._slots = self.session.slots()
        try:
            while self._admit():
                self._step()
        finally:
            self.tokenizers.shutdown()  # refuses more calls and waits for those running: they read the model
            self.session.close()

    def _admit(self) -> bool:
        """Start waiting jobs on free slots; while nothing runs, measure what is left of auto's
        verify costs, or wait for a job. False once stopped with nothing left running."""
        while len(self.running) < self.n_slots:
            idle = not self.running
            try:
                job = self._jobs.get(block=idle and not self._calibration.running)
            except queue.Empty:
                if idle and self._calibration.running:
                    self._calibration.step(self._loaded)
                    continue
                break
            if job is None:
                self._jobs.put(None)  # stopping: every job was cancelled; let those running end
                return bool(self.running)
            self._guarded(self._start, job)
        return True

    def _step(self) -> None:
        """One decode for every running request; a failure ends them all."""
        slots = self._slots
        assert slots is not None
        self._guarded(lambda *jobs: slots.step(), *self.running.values())
        self.metrics.decoded(slots.batch.rows)

    def _guarded(self, work: Callable[..., None], *jobs: Job) -> None:
        """work(*jobs); where it fails, every job it was for, and every running one, fails with it
        (RpcLost: the servers' layers are gone; anything else is a bug, which must not take the
        server down)."""
        try:
            work(*jobs)
        except Exception as exc:
            if isinstance(exc, RpcLost):
                self.state, self.error = "lost", exc
                error = self._lost()
            else:
                traceback.print_exc(file=sys.stderr)
                error = ApiError(500, f"internal error: {exc}", code="internal_error", kind="server_error")
            for job in {*jobs, *self.running.values()}:
                job.report(Failed(error))
            assert self._slots is not None
            self._slots.reset()

    def _start(self, job: Job) -> None:
        """Put the job's generation on the free slot that has most of its prompt cached."""
        if job.cancelled:
            job.report(
                Failed(ApiError(503, "the request was cancelled before it started", code="cancelled", kind="unavailable_error"))
            )
            return
        started = time.perf_counter()
        assert self._slots is not None
        try:
            prompt = self._prompt(job.request)
            slot = self._slots.slot_for(prompt.tokens)
            engine = self._engine(job.request, slot)
        except ApiError as error:
            self.metrics.reject("invalid")
            job.report(Failed(error))
            return
        cached = self._loaded.target.sequence(slot).prefix_held(prompt.tokens)
        job.report(Started(len(prompt.tokens), min(cached, len(prompt.tokens) - 1)))  # the last is decoded for its logits
        max_tokens = job.request.max_tokens or self.max_tokens or self._loaded.target.n_ctx
        reader = CallReader(self._tool_style.form) if job.request.tools else None
        labels = SourceLabels(engine) if job.request.pieces else None
        scores = LogprobWatch(self._loaded.target_model.piece, engine.eog) if job.request.logprobs is not None else None
        view = Reporter(job, self.metrics, reader, labels, scores, self._thoughts(job.request, prompt))
        reply = ReplyStream(prompt.stops, view, started, cancelled=lambda: job.cancelled)
        on_token = reply.on_token if labels is None else labels.watching(reply.on_token)
        on_token = on_token if scores is None else scores.watching(on_token)

        def finished(run: Generation) -> None:
            self._finish(job, prompt, view, reply.reply(run.stats, run.stop_reason, engine.eog), started)

        self._slots.start(slot, job, engine, prompt.tokens, max_tokens, on_token, reply.on_step, finished)

    def _finish(self, job: Job, prompt: Prompt, view: Reporter, reply: Reply, started: float) -> None:
        view.finish()
        if job.request.chat:
            self._transcript.record(prompt.tokens, prompt.text, reply.tokens)
        self._loaded.remember(prompt.tokens + reply.tokens)
        outcome = view.outcome(reply, len(prompt.tokens))
        self.metrics.finish(
            outcome.finish_reason, outcome.prompt_tokens, outcome.prompt_tokens - reply.stats.prefilled_tokens, reply.stats
        )
        self._request_s = 0.8 * self._request_s + 0.2 * (time.perf_counter() - started)
        job.report(Finished(outcome, view.labels.stats(reply.stats) if view.labels else None))

    def prompt_text(self, request: GenerationRequest) -> str:
        """A chat request's prompt as the model would read it (llama-server's /apply-template).
        Off the model's thread, as `count_prompt_tokens`."""
        return self._rendered(request).text

    def slot_states(self) -> list[dict]:
        """llama-server's /slots, read-only: each slot's context and whether a request runs on it."""
        n_ctx = self.ready().target.n_ctx
        return [{"id": slot, "n_ctx": n_ctx, "is_processing": slot in self.running} for slot in range(self.n_slots)]

    def count_prompt_tokens(self, request: GenerationRequest) -> int:
        """The tokens a chat request's prompt comes to, as it would run: its template and tools.
        Off the model's thread: rendering and the vocabulary are read-only."""
        return len(self._transcript.tokenize(self._rendered(request).text))

    def _rendered(self, request: GenerationRequest) -> Rendered:
        messages, tools = prompt_messages(self._tool_style, request.messages or [], request.tools)
        try:
            return self._chat_format.render(messages, tools, request.ending)
        except SpecrunError as exc:
            raise ApiError(400, str(exc), "messages", "invalid_value") from None

    def _prompt(self, request: GenerationRequest) -> Prompt:
        if request.messages is not None:  # a chat request
            rendered = self._rendered(request)
            tokens, text, _ = self._transcript.prompt(rendered.text)
            prompt = Prompt(tokens, text, rendered.stops + request.stops)
        elif request.infill is not None:
            target = self._loaded.target
            n_predict = -1 if self.max_tokens is None else self.max_tokens  # llama-server's reads its own -n, too
            tokens = infill_tokens(self._loaded.target_model, request.infill, target.n_batch, n_predict, target.n_ctx)
            prompt = Prompt(tokens, request.infill.prompt, request.stops)
        elif request.prompt_tokens is not None:
            prompt = Prompt(self._token_ids(request.prompt_tokens), "", request.stops)
        else:
            if request.prompt is None:
                raise ValueError("a request carries messages, a prompt or an infill")
            prompt = Prompt(self._loaded.tokenize(request.prompt), request.prompt, request.stops)
        n_ctx = self._loaded.target.n_ctx
        if not prompt.tokens:
            raise ApiError(400, "the prompt is empty: give some text to continue", "prompt", "invalid_value")
        if len(prompt.tokens) >= n_ctx:
            raise ApiError(
                400,
                f"the prompt has {len(prompt.tokens)} tokens but the context holds {n_ctx}: shorten it, "
                "or start the server with a larger --ctx-size",
                "messages" if request.chat else "prompt",
                "context_length_exceeded",
            )
        if request.max_tokens is not None and request.max_tokens > n_ctx and not request.up_to_context:  # never that long
            raise ApiError(
                400,
                f"max_tokens is {request.max_tokens}, but the context holds {n_ctx} tokens, the prompt's included: "
                "ask for fewer, or start the server with a larger --ctx-size",
                "max_tokens",
                "context_length_exceeded",
            )
        return prompt

    def _thoughts(self, request: GenerationRequest, prompt: Prompt) -> ReasoningReader | None:
        """A reader of the reply's reasoning, for a chat reply of a template that writes it (not
        where the reply's text is reported as it came: its pieces, its log probabilities)."""
        if not (request.chat and self._thinks) or request.pieces or request.logprobs is not None:
            return None
        return ReasoningReader(thinking=opens_thinking(prompt.text))

    def _token_ids(self, tokens: tuple[int, ...]) -> list[int]:
        """A prompt given as token ids, each checked against the vocabulary."""
        n_vocab = self._loaded.target_model.n_vocab
        wrong = next((token for token in tokens if not 0 <= token < n_vocab), None)
        if wrong is not None:
            raise invalid_value("prompt", f"token id {wrong} is not in the vocabulary, whose ids run from 0 to {n_vocab - 1}.")
        return list(tokens)

    def _engine(self, request: GenerationRequest, slot: int) -> Engine:
        try:
            settings = replace(self.defaults, **request.sampling)
        except SettingError as exc:  # the API checked each field already: a backstop
            raise setting_error(exc) from None
        if request.seed is not None:
            settings = replace(settings, seed=request.seed if request.seed >= 0 else None)
        longest = self._loaded.target.n_batch - 1
        asked = request.speculative.n_max if request.speculative else request.k
        if isinstance(asked, int) and asked > longest:
            param = "speculative.n_max" if request.speculative else "k"
            raise invalid_value(param, f"drafts can be at most {longest} tokens long, but {asked} were asked for.")
        policy = SpeculativeRule(request.speculative) if request.speculative else request.k
        grammar = tool_grammar(self._tool_style.form, request.tools) if request.tools else request.grammar
        try:
            return self._loaded.engine(
                policy=policy,
                sampler=settings,
                grammar=grammar,
                grammar_drafts=self.grammar_drafts,
                slot=slot,
                logprobs=request.logprobs,
            )
        except SettingError as exc:  # a setting only the model can check: a logit bias's token ids
            raise setting_error(exc) from None
        except SpecrunError as exc:  # llama.cpp refused the request's GBNF (the tools' grammar is ours: a bug)
            if request.grammar_param is None:
                raise
            raise invalid_value(request.grammar_param, str(exc)) from None
