"""A GBNF grammar as a pushdown automaton over characters, to say what text it forces next.

llama.cpp's grammar sampler masks what a grammar forbids; it cannot say what the grammar
forces. This reads the same GBNF (the rules, literals, character classes, groups and
repetitions that llama.cpp's parser and llama-cpp-python's JSON schema converter write),
keeps the set of parse stacks llama.cpp would keep, and walks forward while exactly one
character can follow: after `{"name":"` a schema's grammar forces nothing, but after a
string value `","age":` it forces every character. Drafting from it needs no model. It is
only a guesser: llama.cpp's sampler still decides what is allowed, so a grammar this
reading gets wrong costs a rejected draft, never a wrong output.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_STACKS = 256  # more parse stacks than this: the grammar is too ambiguous to guess from
ANY = ((0, 0x10FFFF),)

Char = tuple[tuple[tuple[int, int], ...], bool]  # (ranges, negated)
Symbol = tuple[str, object]  # ("char", Char) or ("ref", rule name)
Frame = tuple[str, int, int]  # rule, alternative, position in it
Stack = tuple[Frame, ...]


class GrammarSyntaxError(ValueError):
    """GBNF this reader does not follow (llama.cpp's parser may still take it)."""


class Parser:
    """GBNF text into rules: each a list of alternatives, each a tuple of symbols."""

    NAME = re.compile(r"[A-Za-z0-9_-]+")

    def __init__(self, text: str):
        self.text, self.at = text, 0
        self.rules: dict[str, list[tuple[Symbol, ...]]] = {}
        self._fresh = 0

    def parse(self) -> dict[str, list[tuple[Symbol, ...]]]:
        while self._skip(newlines=True) < len(self.text):
            name = self._name()
            self._skip()
            if not self.text.startswith("::=", self.at):
                raise GrammarSyntaxError(f"expected ::= after {name!r}")
            self.at += 3
            self.rules[name] = self._alternatives(nested=False)
        if "root" not in self.rules:
            raise GrammarSyntaxError("no root rule")
        return self.rules

    def _skip(self, newlines: bool = False) -> int:
        while self.at < len(self.text):
            c = self.text[self.at]
            if c == "#":
                while self.at < len(self.text) and self.text[self.at] != "\n":
                    self.at += 1
            elif c in " \t" or (newlines and c in "\r\n"):
                self.at += 1
            else:
                break
        return self.at

    def _name(self) -> str:
        match = self.NAME.match(self.text, self.at)
        if not match:
            raise GrammarSyntaxError(f"expected a rule name at {self.text[self.at : self.at + 20]!r}")
        self.at = match.end()
        return match.group()

    def _alternatives(self, nested: bool) -> list[tuple[Symbol, ...]]:
        alternatives = [self._sequence(nested)]
        while self._skip(newlines=nested) < len(self.text) and self.text[self.at] == "|":
            self.at += 1
            self._skip(newlines=True)
            alternatives.append(self._sequence(nested))
        return alternatives

    def _sequence(self, nested: bool) -> tuple[Symbol, ...]:
        symbols: list[Symbol] = []
        while self._skip(newlines=nested) < len(self.text) and self.text[self.at] not in "|)\r\n":
            symbols += self._repeated(self._item())
        return tuple(symbols)

    def _item(self) -> list[Symbol]:
        c = self.text[self.at]
        if c == '"':
            return [("char", (((cp, cp),), False)) for cp in self._literal()]
        if c == "[":
            return [("char", self._class())]
        if c == ".":
            self.at += 1
            return [("char", (ANY, False))]
        if c == "(":
            self.at += 1
            alternatives = self._alternatives(nested=True)
            if self.at >= len(self.text) or self.text[self.at] != ")":
                raise GrammarSyntaxError("unclosed (")
            self.at += 1
            return [("ref", self._rule(alternatives))]
        return [("ref", self._name())]

    def _repeated(self, item: list[Symbol]) -> list[Symbol]:
        """The item, as llama.cpp rewrites its repetitions: into rules of their own."""
        if self.at >= len(self.text) or self.text[self.at] not in "*+?{":
            return item
        low, high = self._bounds()
        one = tuple(item)
        required = list(one) * low
        if high is None:  # any more: R ::= item R | ""
            name = self._fresh_name()
            self.rules[name] = [one + (("ref", name),), ()]
            return required + [("ref", name)]
        optional: list[Symbol] = []
        for _ in range(high - low):  # nested optionals: (item (item ...)?)?
            optional = [("ref", self._rule([one + tuple(optional), ()]))]
        return required + optional

    def _bounds(self) -> tuple[int, int | None]:
        c = self.text[self.at]
        self.at += 1
        if c != "{":
            return {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        match = re.compile(r"\s*(\d+)\s*(,\s*(\d*)\s*)?}").match(self.text, self.at)
        if not match:
            raise GrammarSyntaxError("bad {m,n} repetition")
        self.at = match.end()
        low = int(match.group(1))
        if match.group(2) is None:
            return low, low
        return low, int(match.group(3)) if match.group(3) else None

    def _rule(self, alternatives: list[tuple[Symbol, ...]]) -> str:
        name = self._fresh_name()
        self.rules[name] = alternatives
        return name

    def _fresh_name(self) -> str:
        self._fresh += 1
        return f"\0{self._fresh}"  # cannot clash with a GBNF name

    def _literal(self) -> list[int]:
        self.at += 1
        codepoints = []
        while self.at < len(self.text) and self.text[self.at] != '"':
            codepoints.append(self._char())
        self.at += 1
        return codepoints

    def _class(self) -> Char:
        self.at += 1
        negated = self.text.startswith("^", self.at)
        self.at += negated
        ranges = []
        while self.at < len(self.text) and self.text[self.at] != "]":
            low = self._char()
            high = low
            if self.text.startswith("-", self.at) and not self.text.startswith("-]", self.at):
                self.at += 1
                high = self._char()
            ranges.append((low, high))
        self.at += 1
        return tuple(ranges), negated

    def _char(self) -> int:
        c = self.text[self.at]
        if c != "\\":
            self.at += 1
            return ord(c)
        kind = self.text[self.at + 1]
        hexes = {"x": 2, "u": 4, "U": 8}.get(kind)
        if hexes:
            value = int(self.text[self.at + 2 : self.at + 2 + hexes], 16)
            self.at += 2 + hexes
            return value
        self.at += 2
        return ord({"n": "\n", "t": "\t", "r": "\r"}.get(kind, kind))


@dataclass(frozen=True)
class Walk:
    """What a grammar state forces next: text, and whether the end comes right after it."""

    text: str
    ends: bool


class GbnfState:
    """The parse stacks after some text: which characters may follow, and what is forced."""

    def __init__(self, rules: dict[str, list[tuple[Symbol, ...]]], stacks: frozenset[Stack]):
        self.rules, self.stacks = rules, stacks

    @classmethod
    def start(cls, gbnf: str) -> "GbnfState":
        rules = Parser(gbnf).parse()
        return cls(rules, _expand(rules, [(("root", i, 0),) for i in range(len(rules["root"]))]))

    def feed(self, text: str) -> "GbnfState | None":
        """The state after `text`, or None when the grammar does not take it."""
        stacks = self.stacks
        for c in map(ord, text):
            stacks = _expand(self.rules, [_advanced(s) for s in stacks if s and _matches(self._char_at(s), c)])
            if not stacks or len(stacks) > MAX_STACKS:
                return None
        return GbnfState(self.rules, stacks)

    def forced(self, limit: int) -> Walk:
        """The text (up to `limit` characters) the grammar allows alone from here."""
        stacks, text = self.stacks, list[str]()
        while len(text) < limit:
            complete = any(not s for s in stacks)
            chars = {self._char_at(s) for s in stacks if s}
            if complete and not chars:
                return Walk("".join(text), True)
            only = next(iter(chars)) if len(chars) == 1 and not complete else None
            if only is None or only[1] or len(only[0]) != 1 or only[0][0][0] != only[0][0][1]:
                break
            c = only[0][0][0]
            text.append(chr(c))
            stacks = _expand(self.rules, [_advanced(s) for s in stacks])
        return Walk("".join(text), False)

    def _char_at(self, stack: Stack) -> Char:
        rule, alternative, position = stack[-1]
        return self.rules[rule][alternative][position][1]  # type: ignore[return-value]


def _advanced(stack: Stack) -> Stack:
    rule, alternative, position = stack[-1]
    return stack[:-1] + ((rule, alternative, position + 1),)


def _expand(rules: dict[str, list[tuple[Symbol, ...]]], pending: list[Stack]) -> frozenset[Stack]:
    """Each stack moved on until a character is next on top (or it is empty: the text may end there)."""
    done: set[Stack] = set()
    seen: set[Stack] = set()
    while pending:
        stack = pending.pop()
        if stack in seen:
            continue
        seen.add(stack)
        if not stack:
            done.add(stack)
            continue
        rule, alternative, position = stack[-1]
        symbols = rules[rule][alternative]
        if position == len(symbols):  # through: back to the rule that referred to it (moved on when it did)
            pending.append(stack[:-1])
        elif symbols[position][0] == "char":
            done.add(stack)
        else:
            name = str(symbols[position][1])
            pending += [_advanced(stack) + ((name, i, 0),) for i in range(len(rules[name]))]
        if len(seen) > 16 * MAX_STACKS:
            break
    return frozenset(done)


def _matches(char: Char, c: int) -> bool:
    ranges, negated = char
    return any(low <= c <= high for low, high in ranges) != negated
