"""The conversation as messages (for the chat format) and as the exact tokens the model saw.

Each turn appends only the tokens of the new text to the tokens already in the KV cache,
so the engine finds the whole earlier conversation cached and prefills just the new turn.
Re-tokenizing the whole rendered transcript instead could split the boundaries
differently and silently throw the cache away.
"""

from __future__ import annotations

from dataclasses import dataclass

from specrun.backend import Model
from specrun.chat.formats import ChatFormat, Message
from specrun.errors import SpecrunError


@dataclass(frozen=True)
class Turn:
    """The prompt for one reply, not yet part of the conversation."""

    user_text: str
    tokens: list[int]  # the whole conversation, ending with the assistant's cue
    text: str  # the chat-format text those tokens stand for
    stops: tuple[str, ...]
    dropped: int = 0  # oldest exchanges dropped to make room
    new_tokens: int = 0  # tokens this turn appended to the previous conversation


class Transcript:
    """Chat-format text and exactly the tokens the model read and wrote for it.

    A prompt that continues the transcript (the last prompt, its reply, then new text)
    keeps those tokens and tokenizes only the new text; any other prompt is tokenized
    afresh (the engine still reuses whatever tokens it shares with the cache).
    """

    def __init__(self, model: Model):
        self.model = model
        self._space_prefix = model.render(model.tokenize("a", False, False)) == " a"
        self.clear()

    def clear(self) -> None:
        self.tokens: list[int] = []
        self.text = ""  # the chat-format text self.tokens stand for
        self._reply_start = 0  # where in text the last reply begins

    def prompt(self, rendered: str) -> tuple[list[int], str, int]:
        """Tokens for a rendered prompt, the text they stand for, and how many of them are new."""
        if self.tokens:
            extended = self._extend(rendered)
            if extended is not None:
                return extended
        tokens = self.tokenize(rendered)
        return tokens, rendered, len(tokens)

    def tokenize(self, rendered: str) -> list[int]:
        """Tokens of a whole rendered prompt, with the BOS formats leave to the tokenizer."""
        tokens = self.model.tokenize(rendered, add_special=False, parse_special=True)
        if self.model.add_bos and self.model.bos >= 0 and tokens[:1] != [self.model.bos]:
            tokens.insert(0, self.model.bos)
        return tokens

    def record(self, prompt_tokens: list[int], prompt_text: str, reply_tokens: list[int]) -> None:
        """The prompt and its kept reply are now what the model has read and written."""
        self.tokens = prompt_tokens + reply_tokens
        self._reply_start = len(prompt_text)
        self.text = prompt_text + self.model.render(reply_tokens)

    def _extend(self, rendered: str) -> tuple[list[int], str, int] | None:
        """Previous tokens plus the tokens of the newly rendered text only."""
        prompt, reply = self.text[: self._reply_start], self.text[self._reply_start :]
        # Templates often trim a reply's whitespace; the model did see it, so the tokens keep it.
        # The text is the rendering's, though: the next turn's rendering is matched against it.
        for shown in dict.fromkeys((reply, reply.rstrip(), reply.strip(), reply.lstrip())):
            if rendered.startswith(prompt + shown):
                new = self._continuation(rendered[len(prompt) + len(shown) :])
                return self.tokens + new, rendered, len(new)
        return None  # the format rewrote earlier turns

    def _continuation(self, text: str) -> list[int]:
        """Tokens for text that continues the conversation, without a start-of-text space.

        SentencePiece vocabularies with add_space_prefix put a space before text that starts
        a tokenization; mid-conversation it would be wrong. Tokenizing after a newline
        anchor and dropping the anchor's tokens avoids it.
        """
        tokens = self.model.tokenize(text, add_special=False, parse_special=True)
        if not tokens or not self._space_prefix or self._is_control(tokens[0]):
            return tokens
        anchor = self.model.tokenize("\n", add_special=False, parse_special=False)
        anchored = self.model.tokenize("\n" + text, add_special=False, parse_special=True)[len(anchor) :]
        plain = self.model.render(tokens)
        if plain.startswith(" ") and self.model.render(anchored) == plain[1:]:
            return anchored
        return tokens

    def _is_control(self, token: int) -> bool:
        return self.model.piece(token) == b"" and self.model.render([token]) != ""


class Conversation:
    def __init__(self, model: Model, chat_format: ChatFormat, n_ctx: int, system: str | None = None):
        self.model = model
        self.format = chat_format
        self.n_ctx = n_ctx
        self.system = system
        self.transcript = Transcript(model)
        self.reset()

    def reset(self) -> None:
        self.exchanges: list[tuple[Message, Message]] = []  # (user, assistant) pairs
        self.transcript.clear()

    @property
    def tokens(self) -> list[int]:
        """Exactly what the model has read and written, in order."""
        return self.transcript.tokens

    def messages(self, user_text: str | None = None, exchanges: list | None = None) -> list[Message]:
        """System message, the exchanges (default: all kept ones), then `user_text` if given."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        pairs = [m for pair in (self.exchanges if exchanges is None else exchanges) for m in pair]
        tail = [{"role": "user", "content": user_text}] if user_text is not None else []
        return head + pairs + tail

    def prompt(self, user_text: str, reserve: int) -> Turn:
        """The tokens to answer `user_text` with, leaving `reserve` tokens of context for the reply.

        While the conversation does not fit, the oldest exchanges are left out (the caller
        says so; they are dropped for good when the reply is added).
        """
        rendered = self.format.render(self.messages(user_text))
        tokens, text, new = self.transcript.prompt(rendered.text)
        turn = Turn(user_text, tokens, text, rendered.stops, 0, new)
        while len(turn.tokens) + reserve > self.n_ctx:
            if turn.dropped == len(self.exchanges):
                raise SpecrunError(
                    f"the message needs {len(turn.tokens)} tokens, but the {self.n_ctx}-token context keeps "
                    f"{reserve} for the reply: shorten the message, lower --max-tokens or raise --ctx-size"
                )
            turn = self._fresh(user_text, turn.dropped + 1)
        return turn

    def add_reply(self, turn: Turn, tokens: list[int], text: str) -> None:
        """Make the turn and its kept reply (`tokens` spelling `text`, or a prefix of it) part of the conversation."""
        del self.exchanges[: turn.dropped]
        self.exchanges.append(({"role": "user", "content": turn.user_text}, {"role": "assistant", "content": text}))
        self.transcript.record(turn.tokens, turn.text, tokens)

    def _fresh(self, user_text: str, dropped: int) -> Turn:
        """Tokenize the whole rendered conversation without its oldest `dropped` exchanges."""
        rendered = self.format.render(self.messages(user_text, self.exchanges[dropped:]))
        tokens = self.transcript.tokenize(rendered.text)
        return Turn(user_text, tokens, rendered.text, rendered.stops, dropped, len(tokens))
