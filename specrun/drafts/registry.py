"""Draft sources by name: how a session builds the ones its settings name (`SessionConfig.sources`).

A source of one's own is its module and one `register` call in it; nothing in the core changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from specrun.errors import SpecrunError

if TYPE_CHECKING:
    from specrun.drafts.base import DraftSource
    from specrun.session import Session

Builder = Callable[["Session", int], "DraftSource"]
"""Builds a fresh source for a session's stream `slot` (0 .. parallel - 1): the session's target
model, settings and store are there to read, and the stream's sequence is `session.target.sequence(slot)`."""

_BUILDERS: dict[str, Builder] = {}


def register(name: str, build: Builder) -> None:
    """Make `name` a draft source sessions can be asked for (`specrun.load(..., sources=[name])`)."""
    _BUILDERS[name] = build


def names() -> list[str]:
    return sorted(_BUILDERS)


def build(name: str, session: Session, slot: int = 0) -> DraftSource:
    """A fresh source `name` for stream `slot` of `session`, or one line naming the sources there are."""
    builder = _BUILDERS.get(name)
    if builder is None:
        raise SpecrunError(f"unknown draft source {name!r}: choose one of {', '.join(names())}")
    return builder(session, slot)
