"""What a target decode of w rows costs on this machine: measured, spot-checked, interpolated.

`--k auto` sizes drafts by this table (verify_cost[w], seconds for a decode of w rows with
logits). Measuring runs decodes on the target's cache and leaves it as it was; the table a
run refined is kept across runs outside the core (specrun/session/cost_cache.py).
"""

from __future__ import annotations

import time
from typing import Generator, Sequence

import numpy as np

from specrun.errors import SpecrunError

# Verify widths timed one by one (odd widths can cost more than the even width above, as
# on AVX2 CPUs), then a few wider ones; widths between are interpolated.
EVERY_WIDTH_TO = 17
WIDE_WIDTHS = (24, 32, 48, 64)
# A kept table is checked at 1 row and this many (timed one by one when it was made): a few decodes,
# not a new table: a wider one computes every row's logits, which on a 262k vocabulary is much of start-up.
SPOT_CHECK_WIDTH = 16
WIDER_ROW_GAIN = 0.05  # keep doubling the widest width while a row gets at least this much cheaper


def measure_verify_costs(context, repeats: int = 2) -> list[float]:
    """Seconds for one target decode of w rows with logits, for w = 1..W (index w).

    W follows the hardware: every width to EVERY_WIDTH_TO and WIDE_WIDTHS are timed, then
    twice the widest while a row still gets WIDER_ROW_GAIN cheaper, up to the batch size
    (where verifying is nearly free per row, as on a GPU, drafts may grow to n_batch - 1).
    """
    steps = measuring_verify_costs(context, repeats, all_at_once=True)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def measuring_verify_costs(context, repeats: int = 2, all_at_once: bool = False) -> Generator[None, None, list[float]]:
    """`measure_verify_costs` as a coroutine that yields after each width it timed (unless
    `all_at_once`), so that a server answers requests between them, and returns the table."""
    most = min(context.n_batch, context.free_slots - 1)
    widths = [w for w in (*range(1, EVERY_WIDTH_TO + 1), *WIDE_WIDTHS) if w <= most]
    timed: dict[int, float] = {}
    for group in [widths] if all_at_once else [[width] for width in widths]:
        timed |= time_decodes(context, group, repeats)
        yield
    width = widths[-1]
    while width * 2 <= most:
        wider = time_decodes(context, [width * 2], repeats)[width * 2]
        yield
        gain = 1 - (wider / (width * 2)) / (timed[width] / width)
        if gain <= 0:
            break  # a row costs more at the wider width: drafts stay within the narrower one
        timed[width * 2] = wider
        width *= 2
        if gain < WIDER_ROW_GAIN:
            break
    return interpolated(timed)


def interpolated(timed: dict[int, float]) -> list[float]:
    """A cost for every width 1..max(timed) (index = width), linear between timed widths."""
    widths = sorted(timed)
    costs = np.interp(range(1, widths[-1] + 1), widths, [timed[w] for w in widths])
    return [0.0, *map(float, costs)]


def verify_costs_hold(context, costs: list[float], tolerance: float = 0.35, repeats: int = 2) -> bool:
    """Whether decodes of 1 row and of a wide batch (up to SPOT_CHECK_WIDTH rows) still take
    about what `costs` says.

    A few decodes check a table kept from an earlier run: one measured while the machine
    was busy, or before the GPU or the llama.cpp build changed, must not stick.
    """
    widest = len(costs) - 1
    if widest > min(context.n_batch, context.free_slots - 1):
        return False  # kept for a bigger batch or emptier context than this one has
    widths = sorted({1, min(widest, SPOT_CHECK_WIDTH)})
    timed = time_decodes(context, widths, repeats)
    return all(abs(timed[width] / costs[width] - 1) <= tolerance for width in widths)


def time_decodes(context, widths: Sequence[int], repeats: int, every_row: bool = True) -> dict[int, float]:
    """Best of `repeats` seconds for a decode of each width, leaving the cache as it was.

    `every_row`: logits for every row, as a verify needs; without, for the last row only
    (what the output head adds to a verify is the difference).
    """
    keep = len(context.tokens)
    if context.free_slots < max(widths) + 1:
        raise SpecrunError("the context is too full to measure verify costs: raise --ctx-size")
    filler = [context.model.bos if context.model.bos >= 0 else 0]
    best = {width: float("inf") for width in widths}
    context.eval(filler, 1)  # warm-up: first decode allocates buffers
    context.truncate(keep)
    for _ in range(repeats):
        for width in widths:
            started = time.perf_counter()
            context.eval(filler * width, width if every_row else 1)
            best[width] = min(best[width], time.perf_counter() - started)
            context.truncate(keep)
    return best
