"""Auto's verify costs, measured so that the server is ready at once: on a first start with
`--k auto` (no table kept from an earlier run on this machine), what measuring takes beyond
BEFORE_READY_S runs a width at a time while no request runs, a fixed k standing in for auto until the
table is complete."""

from __future__ import annotations

import sys
import time

from specrun.errors import SpecrunError
from specrun.session import Session
from specrun.session.policies import STAND_IN_K

BEFORE_READY_S = (
    0.25  # measuring before the server says it is ready (a GPU or a small model needs no more); the rest runs between requests
)


class Calibration:
    """The measuring, on the worker's thread; `running` until the table is complete."""

    def __init__(self) -> None:
        self.running = False
        self.seconds = 0.0  # spent measuring so far

    def start(self, session: Session) -> None:
        """Under auto with no table kept from an earlier run that a spot check accepts, measure
        for up to BEFORE_READY_S; what is left runs by `step`, between requests."""
        if session.drafter is None or session.config.k != "auto" or not session.policies.calibrate_later():
            return
        self.running = True
        while self.running and self.seconds < BEFORE_READY_S:
            self.step(session)
        if self.running:
            _say(f"measuring verify costs for --k auto between requests (k {STAND_IN_K} until then)")

    def step(self, session: Session) -> None:
        """Time one more width (nothing runs: no request waits on it)."""
        started = time.perf_counter()
        try:
            self.running = session.policies.calibrate_step()
        except SpecrunError as exc:  # slot 0 too full for a wide decode: the fixed k keeps standing in
            self.running = False
            _say(f"verify costs not measured ({exc}); k {STAND_IN_K} stands in for auto")
            return
        self.seconds += time.perf_counter() - started
        if not self.running and self.seconds >= BEFORE_READY_S:
            _say(f"verify costs measured in {self.seconds:.1f} s; --k auto sizes drafts by them now")


def _say(line: str) -> None:
    print(f"specrun serve: {line}", file=sys.stderr, flush=True)
