"""Log probabilities for a reply, as OpenAI's `logprobs` reports them: each token the client got
text for, with its log-probability and the likeliest tokens of its row (`TokenLogprobs`).

A token is reported with the chunk that completes its text: the stop-string scanner may hold
text back, and a token whose text a stop string cut is not reported, as it is not kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from specrun.core.events import OnToken, StopReason, TokenEvent


@dataclass(frozen=True)
class Alternative:
    id: int  # the token's id, which llama-server reports
    text: str  # the token's piece, decoded (a partial UTF-8 sequence shows as U+FFFD)
    raw: bytes  # the piece's bytes, which OpenAI reports as `bytes`
    logprob: float


@dataclass(frozen=True)
class Scored:
    """A reply's token as `logprobs` reports it."""

    token: Alternative
    top: tuple[Alternative, ...]  # its row's likeliest tokens, likeliest first
    offset: int  # where its text starts in the reply's text


class LogprobWatch:
    """Watches a reply's tokens (`watching`) and hands out those whose text the client has
    been sent (`release`); end-of-generation tokens, which have no text, are left out."""

    def __init__(self, piece: Callable[[int], bytes], eog: frozenset[int]):
        self.piece, self.eog = piece, eog
        self.pending: list[tuple[int, Scored]] = []  # (where its text ends, the token), in order
        self.released: list[Scored] = []
        self.written = 0  # characters of the tokens' text so far
        self.sent = 0  # characters handed out

    def watching(self, on_token: OnToken) -> OnToken:
        def scored(event: TokenEvent) -> StopReason | None:
            if event.token not in self.eog and event.logprobs is not None:
                start, self.written = self.written, self.written + len(event.text)
                top = tuple(self._alternative(token, logprob) for token, logprob in event.logprobs.top)
                self.pending.append((self.written, Scored(self._alternative(event.token, event.logprobs.logprob), top, start)))
            return on_token(event)

        return scored

    def release(self, characters: int) -> tuple[Scored, ...]:
        """The tokens whose text the next `characters` characters sent complete."""
        self.sent += characters
        done = 0
        while done < len(self.pending) and self.pending[done][0] <= self.sent:
            done += 1
        out = tuple(scored for _, scored in self.pending[:done])
        del self.pending[:done]
        self.released += out
        return out

    def _alternative(self, token: int, logprob: float) -> Alternative:
        raw = self.piece(token)
        return Alternative(token, raw.decode("utf-8", "replace"), raw, logprob)
