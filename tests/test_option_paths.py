"""How far a reader follows an option from the CLI down to the engine: the calls that take it as
an argument, module by module in the order they run. Each module on the way is entered at most
twice; a check repeated at every layer, or a module passed through back and forth, enters more."""

from __future__ import annotations

import sys
from collections import Counter
from itertools import groupby

import pytest

from specrun.cli.commands import run_app
from specrun.core.engine import Engine

PROMPT = "the cat sat on the mat and the cat sat on the"
MOST_ENTRIES = 2


def _modules_passing(argument: str, values: tuple, argv: list[str]) -> list[str]:
    """The specrun modules, in call order, of the calls that take the option: a parameter named
    `argument`, one whose value is among `values` (as typed, as parsed), or `options`, a dict
    of settings that holds it; up to the engine's first step."""
    seen: list[str] = []
    reached = False

    def trace(frame, event, arg):
        nonlocal reached
        code = frame.f_code
        if event != "call" or reached:
            return None
        if code is Engine.steps.__code__:
            reached = True
            return None
        module = frame.f_globals.get("__name__", "")
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        given = [frame.f_locals.get(name) for name in names]
        options = frame.f_locals.get("options") if "options" in names else None
        carried = (
            argument in names
            or any(type(value) in (int, str) and value in values for value in given)
            or (isinstance(options, dict) and argument in options)
        )
        if module.startswith("specrun.") and carried:
            seen.append(module)
        return None

    sys.setprofile(trace)
    try:
        assert run_app(argv) == 0
    finally:
        sys.setprofile(None)
    assert reached, "the engine never ran"
    return [module for module, _ in groupby(seen)]


@pytest.mark.parametrize(("option", "argument", "values"), [(["--k", "7"], "k", ("7", 7)), (["--lookup"], "lookup", ())])
def test_an_option_enters_each_module_at_most_twice_on_its_way_to_the_engine(tiny, capsys, option, argument, values):
    argv = ["generate", PROMPT, "--target", str(tiny["target"]), "-n", "4", "-c", "256", "--lookup", *option]
    path = _modules_passing(argument, values, argv)
    entries = Counter(path)
    assert path and max(entries.values()) <= MOST_ENTRIES, " -> ".join(path)
