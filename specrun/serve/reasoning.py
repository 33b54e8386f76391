"""A reasoning model's thinking, told apart from its answer as it streams.

Models whose chat template writes `<think>...</think>` (Qwen3, DeepSeek-R1 and their kin) reason
there before they answer. As llama-server does by default, the chat routes hand that text out
apart from the answer: OpenAI's `reasoning_content`, Anthropic's thinking blocks, the Responses
API's reasoning items. A template whose generation cue opens the block (`<think>\\n`) starts the
reply inside it.
"""

from __future__ import annotations

from dataclasses import dataclass

OPEN, CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class Thought:
    """A piece of the reply's reasoning (the other pieces are its answer, as plain strings)."""

    text: str


def thinks(template: str | None) -> bool:
    """Whether a chat template writes reasoning blocks."""
    return template is not None and OPEN in template and CLOSE in template


def opens_thinking(prompt: str) -> bool:
    """Whether a rendered prompt ends inside an open reasoning block (its cue opened it)."""
    head, opened, tail = prompt.rpartition(OPEN)
    return bool(opened) and CLOSE not in tail and not tail.strip()


class ReasoningReader:
    """Fed a reply's text as it comes, hands out its reasoning (`Thought`s) and its answer (strs).
    A block opens only at the reply's start (or was opened by the prompt); text that could still
    be the start of a marker is held back until it is known, and the whitespace between the block
    and the answer is dropped."""

    def __init__(self, thinking: bool = False):
        self.state = "thinking" if thinking else "start"  # then "answer"
        self.held = ""
        self.reasoning = ""  # all of it so far
        self.answer = ""
        self._after_block = False  # the answer has not begun since a block closed

    def feed(self, text: str) -> list[str | Thought]:
        self.held += text
        pieces: list[str | Thought] = []
        if self.state == "start":
            opening = self.held.lstrip()
            if opening.startswith(OPEN):
                self.state, self.held = "thinking", opening[len(OPEN) :]
            elif OPEN.startswith(opening):
                return pieces  # it may still open a block
            else:
                self.state = "answer"
        if self.state == "thinking":
            found = self.held.find(CLOSE)
            if found < 0:
                return self._out(len(self.held) - _partial(self.held, CLOSE))
            pieces = self._out(found)
            self.state, self.held, self._after_block = "answer", self.held[len(CLOSE) :], True
        if self._after_block:
            self.held = self.held.lstrip()
            self._after_block = not self.held
        return pieces + self._out(len(self.held))

    def finish(self) -> list[str | Thought]:
        """What was held back, once the reply is over."""
        if self.state == "start":
            self.state = "answer"
        return self._out(len(self.held))

    def _out(self, end: int) -> list[str | Thought]:
        """The held text up to `end`, handed out as what the state says it is."""
        text, self.held = self.held[:end], self.held[end:]
        if not text:
            return []
        if self.state == "thinking":
            self.reasoning += text
            return [Thought(text)]
        self.answer += text
        return [text]


def _partial(text: str, marker: str) -> int:
    """How many characters at the end of `text` could be the start of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
