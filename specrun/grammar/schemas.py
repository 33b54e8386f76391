"""Structured output: the grammars a generation can be held to.

A `Grammar` is GBNF text (llama.cpp's grammar format). JSON schemas become GBNF through
llama-cpp-python's converter (`llama_cpp.llama_grammar`), after a check that names any
schema feature it would not enforce: an unsupported keyword is an error, never silently
dropped. The JSON is written in one fixed style, Python's `json.dumps` (`{"a": 1, "b": [2, 3]}`:
a space after each colon and comma, none elsewhere), the style most JSON in prompts and
training text has, so keys, quotes, colons and commas are what the grammar forces, and a
grammar draft can propose them for free.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any, Callable

from llama_cpp.llama_grammar import json_schema_to_gbnf

from specrun.errors import SpecrunError

# Keywords llama-cpp-python's converter enforces; annotations that do not constrain the value.
ENFORCED = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "prefixItems",
        "minItems",
        "maxItems",
        "enum",
        "const",
        "anyOf",
        "oneOf",
        "allOf",
        "$ref",
        "pattern",
        "minLength",
        "maxLength",
        "format",
    }
)
ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$schema",
        "$id",
        "$comment",
        "$defs",
        "definitions",
        "deprecated",
        "readOnly",
        "writeOnly",
        "strict",
        "name",
    }
)
FORMATS = frozenset({"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5"})
TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
SCHEMA_MAPS = ("properties", "$defs", "definitions")  # keyword -> {name: schema}
SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")  # keyword -> [schema, ...]
# Keywords that narrow a value in ways the grammar cannot write (number ranges, key names, set
# sizes). A tool's arguments are not held to them (`tool_arguments`): agents' tool schemas are full
# of them (Claude Code's Read tool bounds its offset), a refusal would block every request, and
# the arguments keep their structure and types, as llama-server's converter leaves them. Output
# held to a response format or a schema the user gives is still refused them.
# llama-cpp-python's converter writes "at most n" as n nested optional groups, which llama.cpp's
# grammar parser reads recursively: a maxLength of 524288 (one of Claude Code's tools has it)
# overflowed the model thread's stack and killed the server. Bounds up to this many nest safely.
MOST_REPEATS = 2000
NARROWING = frozenset(
    {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "propertyNames", "minProperties"}
    | {"maxProperties", "uniqueItems"}
)


class SchemaError(SpecrunError):
    """A JSON schema feature the grammar would not enforce, or a schema that is not one."""

    def __init__(self, message: str, path: str):
        super().__init__(message)
        self.path = path


@dataclass(frozen=True)
class Grammar:
    """GBNF a generation is held to (its start rule is `root`)."""

    gbnf: str
    what: str = "grammar"  # how messages name it: "grammar", "JSON schema", "JSON object"


def grammar_from_gbnf(text: str) -> Grammar:
    """A grammar given as GBNF text (llama.cpp parses it when a generation first uses it)."""
    if not isinstance(text, str) or "root" not in text:
        raise SpecrunError("the grammar has no `root ::= ...` rule: GBNF starts from root")
    return Grammar(text)


def grammar_from_json_schema(schema: Any, tool_arguments: bool = False) -> Grammar:
    """Compact JSON that validates against `schema`; SchemaError names a feature it cannot enforce.
    `tool_arguments`: a tool's arguments, not held to NARROWING keywords nor to formats it does not know."""
    check_schema(schema, "$", tool_arguments)
    try:
        text = json_schema_to_gbnf(json.dumps(_enforced(schema, tool_arguments)))
    except Exception as exc:  # the converter's own refusals: a $ref it cannot follow, a bad pattern
        raise SchemaError(f"the JSON schema cannot be turned into a grammar: {exc}", "$") from None
    return Grammar(compact(text), "JSON schema")


def _enforced(schema: Any, tool_arguments: bool) -> Any:
    """What the converter is given: the schema without annotations (one of only annotations allows
    any value, which the converter reads from an empty schema) and, for a tool's arguments, without
    what they are not held to."""
    if not isinstance(schema, dict):
        return schema
    kept = {}
    for key, value in schema.items():
        loose = tool_arguments and (key in NARROWING or (key == "format" and value not in FORMATS) or _beyond(key, value))
        if key in ANNOTATIONS - {"$defs", "definitions"} or loose:
            continue
        kept[key] = _with_children(key, value, lambda child, _: _enforced(child, tool_arguments))
    return kept


def json_object_grammar() -> Grammar:
    """Any JSON object (OpenAI's JSON mode)."""
    return Grammar(compact(json_schema_to_gbnf(json.dumps({"type": "object"}))), "JSON object")


def compact(gbnf: str) -> str:
    """The converter's grammar with one space after each colon and comma and none elsewhere,
    instead of optional whitespace between JSON tokens; and without raw control characters in
    strings, which JSON forbids (this converter's `char` rule lets them through)."""
    gbnf = re.sub(r'"([:,])" space', r'"\1 "', gbnf)
    gbnf = gbnf.replace(r'char ::= [^"\\]', r'char ::= [^"\\\x7F\x00-\x1F]')
    return re.sub(r"^space ::= .*$", 'space ::= ""', gbnf, flags=re.MULTILINE)


def _beyond(key: str, value: Any) -> bool:
    """A most-repeats bound beyond what a grammar holds: a tool's arguments go unbounded there."""
    return key in ("maxLength", "maxItems") and isinstance(value, int) and value > MOST_REPEATS


def check_schema(schema: Any, path: str, tool_arguments: bool = False) -> None:
    """Raise SchemaError for the first keyword (or value) under `schema` that the grammar would not
    enforce (for a tool's arguments, leaving out what they are not held to)."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise SchemaError(f"the JSON schema at {path} is not an object or a boolean", path)
    for key, value in schema.items():
        where = f"{path}.{key}"
        if tool_arguments and (key in NARROWING or key == "format"):
            continue
        if key not in ENFORCED and key not in ANNOTATIONS:
            raise SchemaError(f"unsupported JSON schema feature '{key}' at {path}: the output could not be held to it", where)
        if _beyond(key, value) and not tool_arguments:
            raise SchemaError(
                f"{key} {value} at {path} is more than the {MOST_REPEATS} repeats a grammar can hold: lower it or leave it out",
                where,
            )
        if key == "format" and value not in FORMATS:
            raise SchemaError(
                f"unsupported JSON schema format '{value}' at {path} (supported: {', '.join(sorted(FORMATS))})", where
            )
        if key == "type":
            for kind in value if isinstance(value, list) else [value]:
                if kind not in TYPES:
                    raise SchemaError(f"unknown JSON schema type {kind!r} at {path}", where)
        _with_children(key, value, functools.partial(_check_child, where=where, tool_arguments=tool_arguments))


def _check_child(child: Any, suffix: str, where: str, tool_arguments: bool) -> None:
    check_schema(child, where + suffix, tool_arguments)


def _with_children(key: str, value: Any, visit: Callable[[Any, str], Any]) -> Any:
    """The value of keyword `key` with each schema in it replaced by visit(schema, its path from the
    keyword): the one walk of a schema's children, for the check and for what the converter is given."""
    if key in SCHEMA_MAPS and isinstance(value, dict):
        return {name: visit(child, f".{name}") for name, child in value.items()}
    if key in SCHEMA_LISTS and isinstance(value, list):
        return [visit(child, f"[{i}]") for i, child in enumerate(value)]
    if key in ("items", "additionalProperties") and isinstance(value, (dict, bool)):
        return visit(value, "")
    return value
