"""Tool calls: how a request's tools reach the model, the grammar its calls are held to, and
how the calls and results of its history are written.

A reply calls tools in one of two forms (`ToolForm`):

- Hermes: `<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`, one block per call.
  Templates whose tool prompt asks for it (Qwen 2.5, Qwen 3, Hermes) take the tools and render
  calls and results themselves; ChatML templates with no tool syntax (SmolLM2) get the system
  prompt Qwen's template writes, and calls and results as Qwen's template writes them.
- JSON: `{"tool_calls": [{"name": ..., "arguments": ...}]}`, for every other template, with a
  generic system prompt listing the tools and that form; results are plain transcript lines.

A call's JSON is held to the tools' schemas (`specrun.grammar.schemas`, which writes it in
json.dumps' style, as templates render calls), so it always parses and its arguments validate. With `tool_choice: "auto"` the grammar lets the reply be
text in which the form's opening (`<tool_call>`, `{"tool_calls"`) never occurs, followed by
calls or by nothing; "required" and a named tool allow calls only.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from specrun.chat.formats import ChatFormat
from specrun.errors import SpecrunError
from specrun.grammar.schemas import Grammar, SchemaError, grammar_from_json_schema


@dataclass(frozen=True)
class ToolForm:
    """How a reply writes its calls: opening, the calls' JSON apart by separator, closing."""

    trigger: str  # begins the calls; the text before them never holds it
    opening: str
    separator: str
    closing: str
    result: str  # a tool's result in the history, from {name} and {content}

    def write(self, calls: list[tuple[str, str]]) -> str:
        """Calls, (name, arguments as JSON text), exactly as the grammar has the model write them."""
        return self.opening + self.separator.join(call_json(name, arguments) for name, arguments in calls) + self.closing


HERMES = ToolForm(
    "<tool_call>",
    "<tool_call>\n",
    "\n</tool_call>\n<tool_call>\n",
    "\n</tool_call>",
    "<tool_response>\n{content}\n</tool_response>",
)
JSON_FORM = ToolForm('{"tool_calls"', '{"tool_calls": [', ", ", "]}", "Result of {name}: {content}")


@dataclass(frozen=True)
class ToolStyle:
    form: ToolForm
    in_template: bool  # the chat template takes the tools and renders calls and results itself


@dataclass(frozen=True)
class ToolRequest:
    """The tools a reply may call, as the request offers them."""

    tools: tuple[dict, ...]  # OpenAI's tool objects, {"type": "function", "function": {...}}
    must_call: bool  # tool_choice "required" or a named tool; "auto" lets the reply be text
    named: str | None  # the one tool to call (tool_choice names it)
    parallel: bool  # more than one call in a reply
    call: Grammar  # one call's JSON, {"name": ..., "arguments": ...}, of a tool it may call


PROBE_TOOL = {
    "type": "function",
    "function": {"name": "probe", "description": "A probe.", "parameters": {"type": "object", "properties": {}}},
}
PROBE = [{"role": "user", "content": "hi"}]
HERMES_PROMPT = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""
JSON_PROMPT = """You can call these tools, each given with the JSON schema of its arguments:
{tools}

To call tools, reply with only a JSON object of this form:
{{"tool_calls": [{{"name": <tool name>, "arguments": <its arguments, a JSON object>}}]}}
{choice}"""


def tool_style(chat_format: ChatFormat) -> ToolStyle:
    """Hermes through the template if its tool prompt asks for `<tool_call>`; Hermes in a system
    prompt of ours for a ChatML template without tools; the JSON form otherwise."""
    try:
        plain = chat_format.render(PROBE).text
        offered = chat_format.render(PROBE, [PROBE_TOOL]).text
    except SpecrunError:  # a template that refuses the probe: ours is the safe way
        return ToolStyle(JSON_FORM, in_template=False)
    if offered != plain and HERMES.trigger in offered and '"arguments"' in offered:  # not Qwen3-Coder's XML calls
        return ToolStyle(HERMES, in_template=True)
    return ToolStyle(HERMES if "<|im_start|>" in plain else JSON_FORM, in_template=False)


def function_parameters(function: dict) -> dict:
    """A function's parameters schema: an object (no parameters: the empty object)."""
    parameters = function.get("parameters") or {"type": "object", "properties": {}}
    if parameters.get("type", "object") != "object":
        raise SchemaError(
            f"a function's parameters have to be the JSON schema of an object, not of {parameters['type']!r}", "$.type"
        )
    return {"type": "object", **parameters}


def call_grammar(functions: list[dict]) -> Grammar:
    """One call of any of `functions` (OpenAI's function objects), its arguments held to their parameters.
    Each function's schema moves under `$defs`, its own `$ref`s with it."""
    defs = {f"tool-{i}": _rehomed(function_parameters(function), f"#/$defs/tool-{i}") for i, function in enumerate(functions)}
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": function["name"]}, "arguments": {"$ref": f"#/$defs/tool-{i}"}},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for i, function in enumerate(functions)
    ]
    return grammar_from_json_schema({"anyOf": calls, "$defs": defs}, tool_arguments=True)


def _rehomed(schema: Any, home: str) -> Any:
    """`schema` with each local `$ref` ("#/...") pointing under `home` instead of the root."""
    if isinstance(schema, list):
        return [_rehomed(item, home) for item in schema]
    if not isinstance(schema, dict):
        return schema
    return {
        key: home + value[1:] if key == "$ref" and isinstance(value, str) and value.startswith("#") else _rehomed(value, home)
        for key, value in schema.items()
    }


def tool_grammar(form: ToolForm, offered: ToolRequest) -> Grammar:
    """The reply's grammar: calls only ("required", a named tool), or ("auto") text in which
    the form's trigger never occurs, then calls or nothing."""
    call = re.sub(r"^root ::=", "specrun-call ::=", offered.call.gbnf, flags=re.MULTILINE)
    more = f" ({_literal(form.separator)} specrun-call)*" if offered.parallel else ""
    calls = f"specrun-calls ::= {_literal(form.opening)} specrun-call{more} {_literal(form.closing)}"
    if offered.must_call:
        return Grammar(f"root ::= specrun-calls\n{calls}\n{call}", "tool calls")
    return Grammar(
        f"root ::= specrun-text-0 specrun-calls?\n{calls}\n{_text_without(form.trigger)}\n{call}", "tool calls or text"
    )


def _text_without(literal: str) -> str:
    """Rules specrun-text-0 ... : any text in which `literal` does not occur. specrun-text-j
    follows text that ends with literal[:j]; the literal's first character occurs nowhere else
    in it, so any other character starts the match afresh."""
    first, rules = literal[0], []
    for j in range(len(literal)):
        options = ['""', f"{_literal(first)} specrun-text-1"]
        if 0 < j < len(literal) - 1:
            options.append(f"{_literal(literal[j])} specrun-text-{j + 1}")  # the last character would complete it
        options.append(f"[^{_class(first + literal[j] if j else first)}] specrun-text-0")
        rules.append(f"specrun-text-{j} ::= " + " | ".join(options))
    return "\n".join(rules)


def _literal(text: str) -> str:
    return json.dumps(text)  # GBNF reads JSON's escapes


def _class(characters: str) -> str:
    return "".join(c if c.isalnum() else f"\\x{ord(c):02X}" for c in characters)


def prompt_messages(style: ToolStyle, messages: list[dict], offered: ToolRequest | None) -> tuple[list[dict], list[dict] | None]:
    """The messages to render and the tools to hand the template (None: the tools, if any, are
    in the system message). A conversation without tools is rendered as it is."""
    if style.in_template:
        return [_for_template(message) for message in messages], list(offered.tools) if offered else None
    written = _written(messages, style.form)
    if offered is None:
        return written, None
    return _with_system(written, _tools_prompt(style.form, offered)), None


def _for_template(message: dict) -> dict:
    """Templates write a call's arguments with tojson: they take them as an object, not JSON text."""
    if "tool_calls" not in message:
        return message
    calls = [
        {**call, "function": {**call["function"], "arguments": _parsed(call["function"]["arguments"])}}
        for call in message["tool_calls"]
    ]
    return {**message, "tool_calls": calls}


def _written(messages: list[dict], form: ToolForm) -> list[dict]:
    """Calls as the assistant's text in the form; results as user turns, consecutive ones in one."""
    names = {call["id"]: call["function"]["name"] for message in messages for call in message.get("tool_calls", ())}
    written: list[dict] = []
    for i, message in enumerate(messages):
        if message["role"] == "tool":
            line = form.result.format(name=names.get(message["tool_call_id"], "the tool"), content=message["content"])
            if i and messages[i - 1]["role"] == "tool":
                written[-1] = {"role": "user", "content": written[-1]["content"] + "\n" + line}
            else:
                written.append({"role": "user", "content": line})
        elif "tool_calls" in message:
            calls = form.write([(call["function"]["name"], call["function"]["arguments"]) for call in message["tool_calls"]])
            written.append({"role": "assistant", "content": "\n".join(filter(None, (message["content"], calls)))})
        else:
            written.append(message)
    return written


def _with_system(messages: list[dict], prompt: str) -> list[dict]:
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": messages[0]["content"] + "\n\n" + prompt}, *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]


def _tools_prompt(form: ToolForm, offered: ToolRequest) -> str:
    if form is HERMES:
        return HERMES_PROMPT.format(tools="\n".join(json.dumps(tool, ensure_ascii=False) for tool in offered.tools))
    listed = "\n".join(json.dumps(tool["function"], ensure_ascii=False) for tool in offered.tools)
    choice = (
        f"Reply with a call of {offered.named}."
        if offered.named
        else "Reply with a tool call."
        if offered.must_call
        else "If no tool is needed, answer in plain text instead."
    )
    return JSON_PROMPT.format(tools=listed, choice=choice + ("" if offered.parallel else " Make one call only."))


def call_json(name: str, arguments: str) -> str:
    """A call's JSON in the grammar's style (json.dumps'); arguments that are not JSON text stay a string."""
    return json.dumps({"name": name, "arguments": _parsed(arguments)}, ensure_ascii=False)


def _parsed(arguments: str) -> Any:
    """Arguments JSON text as a value, or the text itself when it is not JSON."""
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments
