"""Benchmark prompts: .txt / .jsonl files and the built-in sets shipped in specrun/prompts/.

.txt: one prompt per line; when some line is exactly `---`, prompts are instead the
blocks between such lines (multi-line prompts). .jsonl: one object per line with
`prompt` (text to continue) or `messages` (a chat, rendered as `specrun chat` would), and
optionally `schema`, a JSON schema every method's output is held to.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from specrun.errors import SpecrunError
from specrun.files import read_text
from specrun.grammar.schemas import grammar_from_json_schema

if TYPE_CHECKING:
    from specrun.chat.formats import ChatFormat

SEPARATOR = "---"
DEFAULT_SETS = ("code", "extraction", "chat", "writing")  # files specrun/prompts/NAME.txt, run by default
BUILTIN_SETS = (*DEFAULT_SETS, "structured")  # structured.jsonl: extractions held to a JSON schema each


@dataclass(frozen=True)
class Prompt:
    text: str | None  # raw text to continue, or None for a chat
    messages: tuple[tuple[str, str], ...] = ()  # (role, content) pairs when text is None
    source: str = ""  # "file:line", for error messages and reports
    group: str = ""  # built-in set name, or the file name
    schema: dict | bool | None = None  # a JSON schema the output is held to


def load_prompt_file(path: Path) -> list[Prompt]:
    if not path.exists():
        raise SpecrunError(f"prompts file not found: {path}")
    if path.suffix not in (".txt", ".jsonl"):
        raise SpecrunError(f"prompts file {path} has to end in .txt (one prompt per line) or .jsonl")
    text = read_text(path, "prompts file").replace("\r\n", "\n")
    prompts = _parse_jsonl(text, path.name) if path.suffix == ".jsonl" else parse_txt(text, path.name)
    if not prompts:
        raise SpecrunError(f"prompts file {path} holds no prompts")
    return prompts


def load_builtin(names: Sequence[str] = DEFAULT_SETS) -> list[Prompt]:
    prompts: list[Prompt] = []
    for name in names:
        if name not in BUILTIN_SETS:
            raise SpecrunError(f"--set: unknown prompt set {name!r} (built-in: {', '.join(BUILTIN_SETS)})")
        suffix = ".jsonl" if name == "structured" else ".txt"
        text = resources.files("specrun").joinpath("prompts").joinpath(name + suffix).read_text(encoding="utf-8")
        parsed = _parse_jsonl(text, name + suffix) if suffix == ".jsonl" else parse_txt(text, name + suffix)
        prompts += [replace(p, group=name) for p in parsed]
    return prompts


def parse_txt(text: str, name: str, group: str | None = None) -> list[Prompt]:
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()  # the final newline ends the last line; it does not start a new one
    group = group or name
    if SEPARATOR in (line.rstrip() for line in lines):
        return _parse_blocks(lines, name, group)
    return [Prompt(line, source=f"{name}:{i}", group=group) for i, line in enumerate(lines, 1) if line.strip()]


def _parse_blocks(lines: list[str], name: str, group: str) -> list[Prompt]:
    """Prompts are the text between `---` lines; the newline before a separator belongs to it."""
    prompts: list[Prompt] = []
    start = 1  # line number where the current block begins
    block: list[str] = []
    for number, line in enumerate(lines + [SEPARATOR], 1):
        if line.rstrip() != SEPARATOR:
            block.append(line)
            continue
        text = "\n".join(block)
        if text.strip():
            prompts.append(Prompt(text, source=f"{name}:{start}", group=group))
        elif start != 1 and number != len(lines) + 1:  # a leading or trailing `---` is fine
            raise SpecrunError(f"{name} line {number}: no prompt between this `---` and the one at line {start - 1}")
        start, block = number + 1, []
    return prompts


def _parse_jsonl(text: str, name: str) -> list[Prompt]:
    prompts = []
    for number, line in enumerate(text.split("\n"), 1):
        if line.strip():
            prompts.append(_parse_json_line(line, f"{name} line {number}", Prompt(None, source=f"{name}:{number}", group=name)))
    return prompts


def _parse_json_line(line: str, where: str, blank: Prompt) -> Prompt:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise SpecrunError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(record, dict) or ("prompt" in record) == ("messages" in record):
        raise SpecrunError(f'{where}: expected an object with either "prompt" or "messages"')
    schema = record.get("schema")
    if schema is not None:
        try:
            grammar_from_json_schema(schema)  # an unsupported feature is named here, before anything loads
        except SpecrunError as exc:
            raise SpecrunError(f'{where}: "schema": {exc}') from None
    if "prompt" in record:
        prompt = record["prompt"]
        if not isinstance(prompt, str) or not prompt.strip():
            raise SpecrunError(f'{where}: "prompt" has to be a non-empty string')
        return Prompt(prompt, source=blank.source, group=blank.group, schema=schema)
    return Prompt(None, _parse_messages(record["messages"], where), blank.source, blank.group, schema)


def _parse_messages(messages: object, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(messages, list) or not messages:
        raise SpecrunError(f'{where}: "messages" has to be a non-empty list of {{"role", "content"}} objects')
    pairs = []
    for i, message in enumerate(messages):
        if not (isinstance(message, dict) and isinstance(message.get("role"), str) and isinstance(message.get("content"), str)):
            raise SpecrunError(f'{where}: message {i + 1} needs string "role" and "content"')
        pairs.append((message["role"], message["content"]))
    return tuple(pairs)


def render(prompt: Prompt, chat_format: "ChatFormat") -> str:
    """The text the target continues; chats go through the same formats `specrun chat` uses."""
    if prompt.text is not None:
        return prompt.text
    return chat_format.render([{"role": role, "content": content} for role, content in prompt.messages]).text
