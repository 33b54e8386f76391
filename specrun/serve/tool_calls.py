"""Reading a reply held to a tool grammar as it streams: its text, then its calls.

The grammar (`specrun.serve.tools`) fixes how calls are written, so the reader needs no
lenience: it finds the form's trigger, then reads each call's head (`{"name": "NAME",
"arguments": `), its arguments up to where their JSON object closes, and the separator to
the next call. What it hands out is what a stream sends: text, the first piece
of each call (its index, id and name) and the pieces of its arguments.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, replace

from specrun.serve.tools import ToolForm

CALL_HEAD = re.compile(r'\{"name": ?"([^"]*)", ?"arguments": ?(?=\{)')  # tool names are [a-zA-Z0-9_-]: no escapes


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text


@dataclass(frozen=True)
class CallPiece:
    """Part of a call as a stream sends it: the first piece carries the call's id and name."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None


class JsonEnd:
    """Finds where a JSON object or array ends, read a piece at a time."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = self.escaped = self.done = False

    def scan(self, text: str, start: int) -> int:
        """Reads text from `start`; returns the index just past the value, or len(text) while it goes on."""
        for i in range(start, len(text)):
            c = text[i]
            if self.in_string:
                self.escaped, self.in_string = (False, True) if self.escaped else (c == "\\", c != '"')
            elif c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.done = True
                    return i + 1
        return len(text)


class CallReader:
    """Fed a reply's text as it comes, hands out text pieces (str) and CallPieces.

    Text is held back while it could still be the start of the trigger, and trailing
    whitespace while calls could follow, so the streamed text is the `content` a whole
    response reports.
    """

    def __init__(self, form: ToolForm):
        self.form = form
        self.text = ""
        self.released = 0  # characters of text handed out
        self.calls_at: int | None = None  # where the calls begin
        self.read = 0  # how far the calls are read
        self.calls: list[ToolCall] = []
        self._arguments: JsonEnd | None = None  # the arguments being read, or None between calls

    def feed(self, piece: str) -> list[str | CallPiece]:
        self.text += piece
        if self.calls_at is None:
            found = self.text.find(self.form.trigger)
            if found < 0:
                return self._release(self._settled())
            self.calls_at, self.read = found, found + len(self.form.opening)
            return self._release(len(self.text[:found].rstrip())) + self._read_calls()
        return self._read_calls()

    def finish(self) -> list[str | CallPiece]:
        """The text held back, when no calls came."""
        return self._release(len(self.text)) if self.calls_at is None else []

    @property
    def content(self) -> str | None:
        """The reply's text before its calls (None when there is none), or all of it."""
        if self.calls_at is None:
            return self.text
        return self.text[: self.calls_at].rstrip() or None

    def _settled(self) -> int:
        """The end of the text that is surely not the start of calls."""
        end = len(self.text)
        for n in range(min(len(self.form.trigger) - 1, end), 0, -1):
            if self.form.trigger.startswith(self.text[-n:]):
                end -= n
                break
        return len(self.text[:end].rstrip())

    def _release(self, end: int) -> list[str | CallPiece]:
        if end <= self.released:
            return []
        piece, self.released = self.text[self.released : end], end
        return [piece]

    def _read_calls(self) -> list[str | CallPiece]:
        pieces: list[str | CallPiece] = []
        while self.read < len(self.text):
            if self._arguments is not None:
                pieces.append(self._read_arguments(self._arguments))
            elif self.calls:  # past a call's arguments: its "}", the separator, then the next call's head
                after = "}" + self.form.separator
                if not self.text.startswith(after, self.read) or not self._read_head(self.read + len(after), pieces):
                    break
            elif not self._read_head(self.read, pieces):
                break
        return pieces

    def _read_head(self, at: int, pieces: list[str | CallPiece]) -> bool:
        head = CALL_HEAD.match(self.text, at)
        if head is None:
            return False
        call = ToolCall(f"call_{uuid.uuid4().hex[:24]}", head[1], "")
        self.calls.append(call)
        pieces.append(CallPiece(len(self.calls) - 1, "", call.id, call.name))
        self.read, self._arguments = head.end(), JsonEnd()
        return True

    def _read_arguments(self, arguments: JsonEnd) -> CallPiece:
        end = arguments.scan(self.text, self.read)
        piece, self.read = self.text[self.read : end], end
        self.calls[-1] = replace(self.calls[-1], arguments=self.calls[-1].arguments + piece)
        if arguments.done:
            self._arguments = None
        return CallPiece(len(self.calls) - 1, piece)


def merged(pieces: list[CallPiece]) -> list[CallPiece]:
    """Consecutive argument pieces of one call as one; a call's first piece stays apart, as OpenAI streams it."""
    out: list[CallPiece] = []
    for piece in pieces:
        if out and piece.id is None and out[-1].id is None and out[-1].index == piece.index:
            out[-1] = replace(out[-1], arguments=out[-1].arguments + piece.arguments)
        else:
            out.append(piece)
    return out
