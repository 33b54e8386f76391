"""Prompt lookup: drafts copied from the generation's own context (prompt and output so far)."""

from __future__ import annotations

from typing import Sequence

from specrun.core.drafting import Draft, DraftRequest, DraftSource, without_decodes
from specrun.core.policy import PRIOR
from specrun.drafts.registry import SourceSite, register
from specrun.errors import SpecrunError


class PromptLookup:
    """Copies what followed the most recent earlier occurrence of the longest matching n-gram.

    The index maps each n-gram to the end of its latest occurrence that has a follower,
    and grows with the history, so a step never rescans it: a step costs the same however
    long the history is. A copy stops where the history has seen its context go on in
    more than one way (one "return self." went on with "items.pop()", another with
    "items[-1]"): there it would only guess. A copy whose source has been in step with the
    text for TRUSTED_MATCH tokens goes on: the text is being copied, and a 4-token context
    is too short to tell table rows or repeated phrases apart.

    How far back the source agrees with the text predicts how much of the copy will be
    accepted, so matches are reported as three sources the policy learns and sizes apart:
    "lookup" (short matches), "lookup-long" (LONG_MATCH tokens or more) and "lookup-copy"
    (COPY_MATCH or more: the text has been copying for a while, so a long draft pays; one
    rejection drops the next match back to a short one).

    The end of a copied block (a function, a quote, a table row set) is where copies most
    often break: past it, the source goes on with text of its own. So a copy stops after a
    blank line of its source (`breaks`: the vocabulary's blank-line tokens) until copies
    have more often than not gone on past one, as they do where whole sections with blank
    lines inside are copied.
    """

    names: tuple[str, ...] = ("lookup", "lookup-long", "lookup-copy")
    counters: tuple[str, ...] = ()
    parts: tuple[DraftSource, ...] = ()
    runs_model = False  # copies from the history: no model of its own
    LONG_MATCH = 6
    COPY_MATCH = 32
    TRUSTED_MATCH = 12  # a copy this far in step with the text goes on past ambiguous contexts
    # Acceptance per position expected before any is measured, by how far back the match reaches.
    PRIORS = {"lookup": PRIOR, "lookup-long": 0.9, "lookup-copy": 0.99}

    def __init__(self, n_min: int = 2, n_max: int = 4, breaks: frozenset[int] = frozenset()):
        if not 1 <= n_min <= n_max:
            raise SpecrunError(f"lookup n-gram range has to satisfy 1 <= min <= max, but is {n_min}..{n_max}")
        self.n_min, self.n_max = n_min, n_max
        self._index: dict[tuple[int, ...], int] = {}
        self._ambiguous: set[tuple[int, ...]] = set()  # n-grams seen with more than one follower
        self._indexed: list[int] = []  # the history the index was built from
        self.breaks = breaks
        self._crossings = [0, 0]  # copies that went on past a blank line of their source, of those seen
        self._crossing: tuple[int, int] | None = None  # (position, token) the last copy expected past a blank line

    @without_decodes
    def propose(self, history: Sequence[int], request: DraftRequest) -> Draft:
        self._extend_index(history)
        self._learn_crossing(history)
        end = self._match_end(history)
        if end is None:
            return Draft()
        # The policy sizes what the copy can offer: a cost-aware one then sees the real choice.
        agreed = self._match_length(history, end)
        copy = self._unambiguous_prefix(history, history[end + 1 : end + 1 + request.limit], agreed)
        copy = self._to_block_end(len(history), copy)
        if not copy:
            return Draft()
        source = self._source(agreed)
        return Draft.under(request.offer(source, len(copy), self.PRIORS[source]), copy)

    def _source(self, agreed: int) -> str:
        short, long, copy = self.names
        return copy if agreed >= self.COPY_MATCH else long if agreed >= self.LONG_MATCH else short

    def _match_end(self, history: Sequence[int]) -> int | None:
        """Where the latest occurrence of the longest indexed suffix n-gram ends."""
        ngram = self._longest_ngram(history)
        return None if ngram is None else self._index[ngram]

    def _longest_ngram(self, tokens: Sequence[int]) -> tuple[int, ...] | None:
        for n in range(min(self.n_max, len(tokens)), self.n_min - 1, -1):
            ngram = tuple(tokens[-n:])
            if ngram in self._index:
                return ngram
        return None

    def _unambiguous_prefix(self, history: Sequence[int], copy: Sequence[int], agreed: int) -> list[int]:
        """The copy up to the first token whose context the history continued in several ways.

        `agreed`: how many tokens before the copy's source equal the history's end; each
        copied token extends that, and from TRUSTED_MATCH on, the copy is the context.
        """
        context = list(history[-self.n_max :])
        for i, token in enumerate(copy):
            if agreed + i < self.TRUSTED_MATCH and self._longest_ngram(context) in self._ambiguous:
                return list(copy[:i])
            context.append(token)
        return list(copy)

    def _match_length(self, history: Sequence[int], end: int) -> int:
        """How many tokens back (up to COPY_MATCH) the text before `end` equals the history's end."""
        length = 0
        while length < self.COPY_MATCH and end - length >= 0 and history[end - length] == history[-1 - length]:
            length += 1
        return length

    def _to_block_end(self, start: int, copy: list[int]) -> list[int]:
        """The copy up to its first blank line, unless copies have mostly gone on past one."""
        for i, token in enumerate(copy[:-1]):
            if token in self.breaks:
                self._crossing = (start + i + 1, copy[i + 1])
                hits, tries = self._crossings
                return copy if 2 * hits > tries else copy[: i + 1]  # gone on past one more often than not
        return copy

    def _learn_crossing(self, history: Sequence[int]) -> None:
        """Whether the text went on as the last copy's source did past its blank line (known
        once the text reaches past it; a copy rejected before it says nothing)."""
        if self._crossing is not None:
            position, token = self._crossing
            if len(history) > position:
                self._crossings[0] += history[position] == token
                self._crossings[1] += 1
            self._crossing = None

    def rollback(self, history: Sequence[int]) -> None:
        if not history:  # emptied (a bench run's start): what copies have learned goes too
            self._forget()
            self._crossings = [0, 0]
        # else: the index only ever holds n-grams of the history itself

    def _forget(self) -> None:
        self._index.clear()
        self._ambiguous.clear()
        self._indexed = []
        self._crossing = None

    def _extend_index(self, history: Sequence[int]) -> None:
        done = len(self._indexed)
        if done > len(history) or history[done - 1 : done] != self._indexed[done - 1 : done]:
            self._forget()  # a different conversation: start over
            done = 0
        self._indexed.extend(history[done:])
        # Positions that now have a follower: n-grams ending at done-1 .. len-2.
        for end in range(max(done - 1, 0), len(history) - 1):
            for n in range(self.n_min, min(self.n_max, end + 1) + 1):
                ngram = tuple(history[end - n + 1 : end + 1])
                earlier = self._index.get(ngram)
                if earlier is not None and history[earlier + 1] != history[end + 1]:
                    self._ambiguous.add(ngram)
                self._index[ngram] = end


def blank_lines(model) -> frozenset[int]:
    """The tokens of this model's vocabulary that are a blank line and nothing else ("\\n\\n", ...)."""
    spellings = (model.tokenize("\n" * n, add_special=False, parse_special=False) for n in range(2, 9))
    return frozenset(tokens[0] for tokens in spellings if len(tokens) == 1)


def _build(site: SourceSite) -> PromptLookup:
    """A prompt lookup for the session's n-gram sizes, knowing its target's blank-line tokens."""
    return PromptLookup(*site.config.lookup_ngram, breaks=blank_lines(site.target.model))


register("lookup", _build)
