"""Ctrl-C as a request to stop, checked between steps, instead of an exception thrown into
whatever code happens to run when it arrives.

A KeyboardInterrupt can land anywhere: inside Rich while it draws (a Console left buffering
prints nothing more, so the reply's final frame never appears), or between two llama.cpp
calls. While a `CtrlC` is active the first Ctrl-C only sets a flag, which the generation
reads after every event and ends on, within the step in flight; the second raises
KeyboardInterrupt as usual, for work that does not come back to read the flag.
"""

from __future__ import annotations

import signal
from types import FrameType


class CtrlC:
    """`with CtrlC() as ctrl_c:` ... `ctrl_c.pressed()` says whether Ctrl-C was pressed meanwhile."""

    def __init__(self) -> None:
        self._pressed = False
        self._previous: signal.Handlers | object = signal.default_int_handler

    def __enter__(self) -> "CtrlC":
        self._previous = signal.signal(signal.SIGINT, self._first)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, self._previous)  # type: ignore[arg-type]

    def _first(self, signum: int, frame: FrameType | None) -> None:
        self._pressed = True
        signal.signal(signal.SIGINT, self._previous)  # type: ignore[arg-type]  # the next one interrupts

    def pressed(self) -> bool:
        return self._pressed
