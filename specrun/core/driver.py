"""The one driver of a generation's coroutine, for one stream: each decode it asks for, run alone.

A generation (`Engine.steps`), and a draft source's `propose` inside it, are coroutines
that yield the decodes they need and are sent what each gave. Every decode they ask for
(`engine.TargetDecode` of the target, `drafting.DraftDecode` of a draft's cache) knows how to run
alone; a `Batch` runs several streams' at once instead.
"""

from __future__ import annotations

from typing import Any, Generator, Protocol, TypeVar


class Ask(Protocol):
    def alone(self) -> Any:
        """Run as a decode of its own: what the coroutine that asked is sent back."""
        ...


Result = TypeVar("Result")


def drive(steps: Generator[Ask, Any, Result]) -> Result:
    """`steps` run to its end, each decode it asks for run alone; what it returns."""
    try:
        ask = next(steps)
        while True:
            ask = steps.send(ask.alone())
    except StopIteration as done:
        return done.value
    finally:
        steps.close()
