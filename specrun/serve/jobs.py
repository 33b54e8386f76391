"""A request as the event loop and the model's worker thread share it: the `Job`, and what the
worker reports on it (`Started` or `Failed`, then `Text` and `CallPiece`s, then `Finished`)."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from typing import Union

from specrun.serve.api import GenerationRequest
from specrun.serve.api_errors import ApiError
from specrun.serve.logprobs import Scored
from specrun.serve.responses import Outcome
from specrun.serve.sources import SourcePiece
from specrun.serve.tool_calls import CallPiece, merged


@dataclass(frozen=True)
class Started:
    prompt_tokens: int
    cached: int = 0  # of them, those the slot's cache holds already: not decoded again


@dataclass(frozen=True)
class Text:
    text: str
    pieces: tuple[SourcePiece, ...] = ()  # asked for (`specrun.pieces`): the text split by how it came
    stats: dict | None = None  # asked for: the reply's statistics so far
    logprobs: tuple[Scored, ...] | None = None  # asked for: the tokens this text completes
    reasoning: bool = False  # the model's reasoning, not its answer (serve/reasoning.py)


@dataclass(frozen=True)
class Finished:
    outcome: Outcome
    stats: dict | None = None  # asked for (`specrun.pieces`): the reply's final statistics


@dataclass(frozen=True)
class Failed:
    error: ApiError


Report = Union[Started, Text, CallPiece, Finished, Failed]


def joined(reports: list[Report]) -> list[Report]:
    """Reports that arrived together, consecutive text as one and a call's argument pieces as one:
    fewer events, as OpenAI's stream joins them (generation._events)."""
    together: list[Report] = []
    for report in reports:
        last = together[-1] if together else None
        if isinstance(report, Text) and isinstance(last, Text) and report.reasoning == last.reasoning:
            together[-1] = Text(last.text + report.text, reasoning=report.reasoning)
        elif isinstance(report, CallPiece) and isinstance(last, CallPiece):
            together[-1:] = merged([last, report])
        else:
            together.append(report)
    return together


class Job:
    """A request waiting for or running on the model; the worker reports to the event loop awaiting it."""

    def __init__(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop):
        self.request = request
        self._loop = loop
        self._reports: asyncio.Queue[Report] = asyncio.Queue()
        self._cancelled = threading.Event()
        self.arrived = time.perf_counter()

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def report(self, item: Report) -> None:
        """From the worker thread."""
        try:
            self._loop.call_soon_threadsafe(self._reports.put_nowait, item)
        except RuntimeError:  # the event loop is closed: nobody is waiting any more
            self.cancel()

    async def next(self) -> Report:
        return await self._reports.get()

    def ready(self) -> list[Report]:
        """Reports that arrived and were not taken yet (to send several text pieces as one chunk)."""
        items = []
        while not self._reports.empty():
            items.append(self._reports.get_nowait())
        return items
