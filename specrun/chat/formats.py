"""Chat formats: a GGUF's own template or a llama-cpp-python format turned into prompt text.

The formatting itself is llama-cpp-python's (`Jinja2ChatFormatter` for
`tokenizer.chat_template`, the registered formats for --chat-format); models without a
template get a plain "User:/Assistant:" transcript.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Literal

from llama_cpp import llama_chat_format as lcf

from specrun.backend import Model, llama_cpp_version
from specrun.errors import SpecrunError

Message = dict[str, str]  # {"role": "system" | "user" | "assistant", "content": ...}
Formatter = Callable[..., lcf.ChatFormatterResponse]

PLAIN = "plain"  # our name for the template-less transcript
TEMPLATE = "gguf template"  # our name for the model's own tokenizer.chat_template
# How a rendered conversation ends: with the cue for the assistant's reply, with nothing after the
# last message, or inside the assistant's last message, which the reply continues (a prefill).
Ending = Literal["reply", "none", "continue"]
# Marks where a continued message's text ends in the rendered conversation (as llama.cpp's needle does).
CONTINUE_MARK = "\u2063specrun-continue\u2063"


@dataclass(frozen=True)
class Rendered:
    text: str  # the whole conversation, ending with the assistant's cue
    stops: tuple[str, ...]  # strings that end a reply when they appear in its text


class ChatFormat:
    """Renders a conversation as a prompt: for the next reply, or continuing the last message."""

    def __init__(self, name: str, formatter: Formatter, source: str, bare: Formatter | None = None):
        """`bare`: the same format without the reply's cue, where the format can leave it out (a template's)."""
        self.name = name
        self.source = source  # where the format came from, for the user
        self._formatter = formatter
        self._bare = bare

    def render(self, messages: list[Message], tools: list[dict] | None = None, ending: Ending = "reply") -> Rendered:
        """`tools`: OpenAI's tool objects, for a template that lists them (Qwen's do); others ignore them.
        `ending` "continue": the prompt ends where the last message's text does, cut there in the
        whole rendering (the template's end of turn after it goes)."""
        if ending == "none" and self._bare is None:
            raise SpecrunError(f"the {self.name} chat format always ends with the reply's cue: leave add_generation_prompt true")
        formatter = self._bare if ending == "none" and self._bare is not None else self._formatter
        if ending == "continue":
            messages = [*messages[:-1], {**messages[-1], "content": (messages[-1].get("content") or "") + CONTINUE_MARK}]
        try:
            result = formatter(messages=messages, tools=tools)
        except Exception as exc:  # jinja2 errors and templates' raise_exception(...)
            raise SpecrunError(f"the {self.name} chat format refused the conversation: {exc}") from None
        stops = result.stop if isinstance(result.stop, list) else [result.stop] if result.stop else []
        text = result.prompt
        if ending == "continue":
            if CONTINUE_MARK not in text:
                raise SpecrunError(f"the {self.name} chat format leaves the last message's text out: it cannot be continued")
            text = text[: text.rindex(CONTINUE_MARK)]
        return Rendered(text, tuple(s for s in stops if s))


# A base model continues the transcript with whichever turn it guesses comes next, its own
# included: a reply that went on to a new "Assistant:" line would answer itself until
# --max-tokens. Either marker at the start of a line ends the reply.
PLAIN_STOPS = ("\nUser:", "\nAssistant:")


def plain_transcript(messages: list[Message], cue: bool = True, **_: object) -> lcf.ChatFormatterResponse:
    """A completion-style transcript any base model can continue; a turn marker starting a line ends a reply.
    `cue`: a user's turn ends with the assistant's marker."""
    parts = []
    for message in messages:
        role, content = message["role"], message["content"]
        if role == "system":
            parts.append(f"{content}\n\n")
        elif role == "user":
            parts.append(f"User: {content}\n" + ("Assistant:" if cue else ""))
        else:
            parts.append(f"{content}\n")
    return lcf.ChatFormatterResponse(prompt="".join(parts), stop=list(PLAIN_STOPS))


def registered_formats() -> dict[str, Formatter]:
    """llama-cpp-python's registered formats that produce plain prompt text.

    The registry holds completion handlers that need a `Llama`; each wraps the formatter
    we need in its closure (`chat_formatter_to_chat_completion_handler`). Function-calling
    handlers have none and are left out. Neither the list of names nor a handler's
    formatter is public in llama-cpp-python 0.3.x, so both are read here alone, an
    unexpected shape is one line, and tests/test_pinned_apis.py pins what 0.3.36 holds.
    """
    handlers = getattr(lcf.LlamaChatCompletionHandlerRegistry(), "_chat_handlers", None)
    formats = {}
    for name, handler in (handlers or {}).items():
        code = getattr(handler, "__code__", None)
        if code is not None and "chat_formatter" in code.co_freevars:
            formats[name] = handler.__closure__[code.co_freevars.index("chat_formatter")].cell_contents
    if not formats:
        raise SpecrunError(
            f"llama-cpp-python {llama_cpp_version()} keeps its chat formats "
            "in a way specrun does not know: leave out --chat-format to use the model's template, "
            "or run `pip install 'llama-cpp-python>=0.3.36,<0.4'`"
        )
    return formats


def check_format_name(name: str) -> Formatter:
    """The registered formatter called `name`, or a one-line error listing the choices."""
    formats = registered_formats()
    if name not in formats:
        choices = ", ".join(sorted([PLAIN, *formats]))
        raise SpecrunError(f"unknown --chat-format {name!r}: choose one of {choices}")
    return formats[name]


def choose_format(model: Model, name: str | None) -> ChatFormat:
    """--chat-format NAME if given, else the GGUF's template, else the plain transcript."""
    if name == PLAIN:
        return ChatFormat(PLAIN, plain_transcript, "--chat-format", functools.partial(plain_transcript, cue=False))
    if name is not None:
        return ChatFormat(name, check_format_name(name), "--chat-format")
    template = model.chat_template
    if template:
        bos = model.render([model.bos]) if model.bos >= 0 else ""
        eos = model.render([model.eos]) if model.eos >= 0 else ""
        try:
            formatter = lcf.Jinja2ChatFormatter(template, eos_token=eos, bos_token=bos)
            bare = lcf.Jinja2ChatFormatter(template, eos_token=eos, bos_token=bos, add_generation_prompt=False)
        except Exception as exc:  # a template jinja2 cannot parse
            raise SpecrunError(f"the model's chat template does not parse ({exc}): pick one with --chat-format") from None
        return ChatFormat(TEMPLATE, formatter, "the model's tokenizer.chat_template", bare)
    return ChatFormat(PLAIN, plain_transcript, "no chat template in the model", functools.partial(plain_transcript, cue=False))
