"""Several generations at once: each on its own sequence of one target context, every stream's
rows verified in one decode per step.

A stream is an `Engine`'s `steps` coroutine: it drafts, asks for a `TargetDecode`, and is sent its
rows back. `Batch.step` collects what every running stream asks, decodes it all at once, and
resumes each with its rows; each then accepts, rejects, rolls its own sequence back and drafts
again, sizing its draft for the rows the other streams will put in the next decode. Streams
drafting with a model ask for its decodes (`DraftDecode`) first: the batch runs those of every
stream together, one decode per draft cache for each position they draft, until every stream
has drafted. Of the drafts, the batch verifies the rows that pay most for the decode's cost, by
the verify-cost curve (`rows_to_verify`); a stream whose draft was cut sees rows for the part
verified. A new prompt is prefilled in chunks that share decodes with the running streams'
rows, so they do not stall behind a long prompt. A prompt that shares most of itself with one still being prefilled
(requests with one system prompt, arriving together) waits for that prefill and then shares its
cells (`Context.reuse_prefix`) instead of computing them again. Streams join and leave between
steps; each hands its events to its own `Consumer`, as `Engine.run`'s stream does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

from specrun.backend import Context
from specrun.core.auto import rows_to_verify
from specrun.core.drafting import DraftDecode, DraftRows
from specrun.core.engine import Engine, Steps, TargetDecode, TargetRows
from specrun.core.events import Consumer, Generation, OnStep, OnToken, Stats, StopReason
from specrun.sequences import common_prefix

OnDone = Callable[[Generation], None]


@dataclass
class _Stream:
    engine: Engine
    steps: Steps
    consumer: Consumer
    on_done: OnDone | None
    prompt: Sequence[int]
    waits_for: _Stream | None = None  # the stream whose prefill it waits for before it starts
    target_decode: TargetDecode | None = None  # the decode of the target it waits for
    draft_decode: DraftDecode | None = None  # the draft decode it waits for, before it asks for the target's
    sent: int = 0  # of its target decode's tokens, those sent to a decode already (a long prefill goes in chunks)
    rows: int = 0  # its rows in the last decode, or what it asks for now

    @property
    def prefilled(self) -> bool:
        """Whether its prompt is in the cache: what it asks for, if anything, is no prompt's rows."""
        return self.target_decode is None or not self.target_decode.prompt


class Batch:
    """Streams on sequences of `target`'s context, verified together."""

    def __init__(self, target: Context, verify_costs: Callable[[], Sequence[float]] | None = None, prefill_chunk: int = 128):
        """`verify_costs`: the seconds of a decode by width (index), asked for when a draft's rows
        carry chances (without it, every draft is verified whole); `prefill_chunk`: the most
        prompt tokens one step decodes for a joining stream."""
        self.target = target
        self.verify_costs = verify_costs
        self.prefill_chunk = prefill_chunk
        self.streams: list[_Stream] = []
        self.rows = 0  # the last decode's rows
        self.decodes = 0
        self.draft_decodes = 0

    def add(
        self,
        engine: Engine,
        prompt: Sequence[int],
        max_tokens: int,
        on_token: OnToken | None = None,
        on_step: OnStep | None = None,
        on_done: OnDone | None = None,
    ) -> None:
        """Start a generation on `engine`'s sequence; callbacks as `Engine.run`'s, and
        `on_done` with its result. It joins the next decode."""
        consumer = Consumer(on_token, on_step)
        steps = engine.steps(prompt, max_tokens, consumer, lambda: self._other_rows(stream))
        stream = _Stream(engine, steps, consumer, on_done, prompt)
        stream.waits_for = self._prefill_to_wait_for(stream)
        self.streams.append(stream)
        if stream.waits_for is None:
            self._advance(stream, None)

    def cancel(self, engine: Engine, reason: StopReason = "interrupted") -> None:
        """End a generation between steps (its client went away): it rolls back and reports its result."""
        for stream in list(self.streams):
            if stream.engine is engine:
                stream.steps.close()  # it rolls its sequence back in its finally
                # One cancelled while it waited never started: its engine's stats are the last generation's.
                stats = Stats(prompt_tokens=len(stream.prompt)) if stream.waits_for is not None else engine.stats
                stats.stop_reason = reason
                self._finish(stream, stream.consumer.result(stats, engine.target.model.detokenize))

    def step(self) -> None:
        """One decode for every running stream; each then takes its rows and asks again."""
        self._start_waiting()
        self._draft()
        self._cut_drafts()
        parts, waiting = self._parts()
        if not parts:
            return
        started = time.perf_counter()
        logits = self.target.decode_many(parts)
        seconds = time.perf_counter() - started
        self.rows, self.decodes = sum(len(tokens) for _, tokens, _ in parts), self.decodes + 1
        width = TargetRows.width_of([s.target_decode for s in waiting if s.target_decode is not None])
        # (stream, its rows' logits) of each stream whose whole ask was decoded
        done = [
            (s, rows) for s, rows in zip(waiting, logits) if s.target_decode is not None and s.sent == len(s.target_decode.tokens)
        ]
        for stream, rows in done:
            stream.rows = len(rows)
            self._advance(stream, TargetRows(rows, seconds, width))

    def _draft(self) -> None:
        """Run the draft decodes the streams ask for, every stream's next position in one decode
        per draft cache, until each has drafted and asks for the target's."""
        while drafting := [(s, s.draft_decode) for s in self.streams if s.draft_decode is not None]:
            for group in self._packed(drafting):
                for (stream, _), decoded in zip(group, self._draft_decode(group)):
                    self._advance(stream, decoded)

    @staticmethod
    def _packed(decodes: list[tuple[_Stream, DraftDecode]]) -> list[list[tuple[_Stream, DraftDecode]]]:
        """The streams' draft decodes as decodes of their caches: those of one cache together, as
        many as fit its batch."""
        groups: list[list[tuple[_Stream, DraftDecode]]] = []
        for stream, decode in decodes:
            fits = (
                group
                for group in groups
                if group[0][1].context.shares_cache(decode.context)
                and sum(len(d.tokens) for _, d in group) + len(decode.tokens) <= decode.context.n_batch
            )
            group = next(fits, None)
            if group is None:
                groups.append([(stream, decode)])
            else:
                group.append((stream, decode))
        return groups

    def _draft_decode(self, group: list[tuple[_Stream, DraftDecode]]) -> list[DraftRows]:
        """What each of the draft decodes got, from one decode of their cache."""
        self.draft_decodes += 1
        if len(group) == 1:  # the plain eval, which also feeds one larger than a batch in turn
            return [group[0][1].alone()]
        started = time.perf_counter()
        rows = group[0][1].context.decode_many([(decode.context, decode.tokens, decode.rows) for _, decode in group])
        seconds, decodes = time.perf_counter() - started, [decode for _, decode in group]
        return [DraftRows.of(logits, seconds, decodes) for logits in rows]

    def _other_rows(self, stream: _Stream) -> int:
        """The rows the other streams will hold in the next decode, as `stream` sees them while it
        drafts: what those that asked already asked, and for those still drafting, their rows of
        the last decode (each stream drafts about as much from one step to the next)."""
        return sum(other.rows for other in self.streams if other is not stream and other.waits_for is None)

    def _prefill_to_wait_for(self, stream: _Stream) -> _Stream | None:
        """A started stream still to be prefilled whose prompt shares more than half of this one's
        beyond what the cache holds already; None when none does, or this stream cannot share."""
        target = stream.engine.target
        if not target.shares_prefixes:
            return None
        held = target.prefix_held(stream.prompt)
        prefilling = [s for s in self.streams if s.waits_for is None and not s.prefilled]
        gains = [(common_prefix(s.prompt, stream.prompt) - held, s) for s in prefilling]
        gain, other = max(gains, key=lambda pair: pair[0], default=(0, None))
        return other if gain > len(stream.prompt) // 2 else None

    def _start_waiting(self) -> None:
        for stream in list(self.streams):
            if stream.waits_for is not None and (stream.waits_for not in self.streams or stream.waits_for.prefilled):
                stream.waits_for = None
                self._advance(stream, None)

    def _cut_drafts(self) -> None:
        """Cut the running streams' drafts to the rows worth their cost in this decode; not beside
        a prompt's rows, which change what a row costs (only rows with logits pass the output head)."""
        asks = [(s, s.target_decode) for s in self.streams if s.target_decode is not None]
        if self.verify_costs is None or not any(a.chances for _, a in asks) or not all(s.prefilled for s, _ in asks):
            return
        fixed = sum(len(a.tokens) - len(a.chances) for _, a in asks)
        for (stream, ask), drafted in zip(asks, rows_to_verify(self.verify_costs(), fixed, [a.chances for _, a in asks])):
            if drafted < len(ask.chances):
                stream.target_decode = ask.cut(drafted)

    def _parts(self) -> tuple[list[tuple[Context, Sequence[int], int]], list[_Stream]]:
        """The next decode: the running streams' verifies, whole, then joining streams' prompts,
        in chunks while others run (all at once when nothing else does)."""
        running = [s for s in self.streams if s.target_decode is not None and s.prefilled]
        joining = [s for s in self.streams if s.target_decode is not None and not s.prefilled]
        room = self.target.n_batch
        parts, waiting = [], []
        for stream in running + joining:
            assert stream.target_decode is not None
            left = len(stream.target_decode.tokens) - stream.sent
            take = min(left, room, self.prefill_chunk if running and stream in joining else room)
            if take < (left if stream in running else 1):
                continue  # a verify goes whole or waits for the next decode
            tokens = stream.target_decode.tokens[stream.sent : stream.sent + take]
            stream.sent += take
            parts.append(
                (
                    stream.engine.target,
                    tokens,
                    stream.target_decode.rows if stream.sent == len(stream.target_decode.tokens) else 0,
                )
            )
            waiting.append(stream)
            room -= take
        return parts, waiting

    def _advance(self, stream: _Stream, reply: TargetRows | DraftRows | None) -> None:
        """Resume the stream with its rows (of the target's decode or its draft's) until it asks
        for the next decode of either, or ends."""
        stream.target_decode, stream.draft_decode, stream.sent = None, None, 0
        try:
            ask = stream.steps.send(reply) if reply is not None else next(stream.steps)
        except StopIteration as done:
            return self._finish(stream, done.value)
        if isinstance(ask, DraftDecode):
            stream.draft_decode = ask
        else:
            stream.target_decode = ask
            stream.rows = min(len(ask.tokens), self.prefill_chunk) if ask.prompt else len(ask.tokens)

    def _finish(self, stream: _Stream, result: Generation) -> None:
        self.streams.remove(stream)
        if stream.on_done:
            stream.on_done(result)
