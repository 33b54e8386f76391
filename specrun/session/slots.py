"""The one scheduler of a session's streams, for the library's `generate_many` and for serve.

A session has `parallel` streams (slots), each a sequence of the target's cache. A generation
takes the free slot that throws away least of what it holds (`slot_for`), runs in one `Batch`
with those on the other slots, one target decode per step, and frees its slot when it ends.
"""

from __future__ import annotations

from typing import Callable, Generic, Sequence, TypeVar

from specrun.backend import Context
from specrun.core.batch import Batch, OnDone
from specrun.core.engine import Engine
from specrun.core.events import Generation, OnStep, OnToken
from specrun.sequences import common_prefix

Owner = TypeVar("Owner")


class Slots(Generic[Owner]):
    """The streams of `target`'s context, each running one generation for its owner (a prompt's
    index, a server's job) at a time."""

    def __init__(self, target: Context, make_batch: Callable[[], Batch]):
        self.target = target
        self._make_batch = make_batch
        self.batch = make_batch()
        self.busy: dict[int, Owner] = {}  # slot -> whose generation runs on it

    @property
    def free(self) -> list[int]:
        return [slot for slot in range(self.target.n_seq) if slot not in self.busy]

    def slot_for(self, tokens: Sequence[int]) -> int:
        """Of the free slots, the one to run `tokens` on. Where streams lend one another the cells
        of a prefix they share (a system prompt), that prefix costs nothing on any of them: the one
        that throws away least of what it holds (another conversation's turns) is taken, the longest
        shared prefix breaking ties. Otherwise the one sharing the longest prefix, as llama-server
        picks a slot."""
        free = self.free
        held = {slot: self.target.sequence(slot).tokens for slot in free}
        shared = {slot: common_prefix(held[slot], tokens) for slot in free}
        if self.target.shares_prefixes:
            return min(free, key=lambda slot: (len(held[slot]) - shared[slot], -shared[slot]))
        return max(free, key=lambda slot: (shared[slot], shared[slot] - len(held[slot])))

    def start(
        self,
        slot: int,
        owner: Owner,
        engine: Engine,
        prompt: Sequence[int],
        max_tokens: int,
        on_token: OnToken | None = None,
        on_step: OnStep | None = None,
        on_done: OnDone | None = None,
    ) -> None:
        """Run `engine` (made on `slot`'s sequence) after `prompt` for `owner`; the slot is free
        again when `on_done` is called with the result. It joins the next decode."""
        self.busy[slot] = owner

        def done(result: Generation) -> None:
            del self.busy[slot]
            if on_done is not None:
                on_done(result)

        self.batch.add(engine, prompt, max_tokens, on_token, on_step, done)

    def step(self) -> None:
        """One decode for every running generation."""
        self.batch.step()

    def reset(self) -> None:
        """Drop every running generation (a decode failed under them): all slots are free."""
        self.busy.clear()
        self.batch = self._make_batch()
