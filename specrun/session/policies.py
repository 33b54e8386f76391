"""A session's draft-length policies, one per k for its life, and the verify costs auto prices
drafts by: kept across sessions with one set-up (cost_cache.py), measured where none holds,
at once or (a server) a width at a time while a fixed k stands in for auto."""

from __future__ import annotations

from typing import Generator

from specrun.backend import Context
from specrun.config import SessionConfig
from specrun.core.auto import AutoK
from specrun.core.costs import measure_verify_costs, measuring_verify_costs, verify_costs_hold
from specrun.core.drafting import CatchUp
from specrun.core.policy import DraftPolicy, FixedK, PMinPolicy
from specrun.session import cost_cache

STAND_IN_K = 4  # drafts auto's generations make while its verify costs are being measured


class Policies:
    """What `k="auto"` learns (verify costs, acceptance per draft source) carries over from one
    generation to the next; the verify costs it refined are kept for the next session (`save`)."""

    def __init__(self, target: Context, config: SessionConfig):
        self.target, self.config = target, config
        self.costs_key = self._costs_key()  # taken now: the file may change or go while we run
        self._verify_costs: list[float] | None = None
        self._policies: dict[int | str, FixedK | PMinPolicy | AutoK] = {}
        self._calibration: Generator[None, None, list[float]] | None = None

    def policy(self, k: int | str) -> FixedK | PMinPolicy | AutoK:
        """One policy per k for the session's life: what auto has learned (costs, acceptance,
        that a draft is too slow) carries over to the next generation, chat turn or bench prompt.
        `k` is a checked one (`parse_k`). While auto's verify costs are being measured in steps,
        a fixed k stands in for it."""
        if k == "auto" and self._calibration is not None:
            return self.policy(STAND_IN_K)
        if k not in self._policies:
            if k == "auto":
                self._policies[k] = AutoK(self.verify_costs())
            elif k == "llama.cpp":
                self._policies[k] = PMinPolicy()
            else:
                self._policies[k] = FixedK(int(k))
        return self._policies[k]

    @staticmethod
    def catch_up(policy: DraftPolicy) -> CatchUp:
        """Under auto, a draft's cache that fell far behind catches up on a window of the text, sized
        by what feeding costs; under a fixed k or llama.cpp's rule, on all of it, as llama.cpp does."""
        return "window" if isinstance(policy, AutoK) else "all"

    def verify_costs(self) -> list[float]:
        """The target's decode time per batch width: as an earlier run with this set-up left it
        (if a spot check agrees), or measured now."""
        if self._verify_costs is None:
            self._verify_costs = self._kept_costs() or self._keep(measure_verify_costs(self.target))
        return self._verify_costs

    def calibrate_later(self) -> bool:
        """Unless verify costs kept from an earlier run hold here, measure them in steps
        (`calibrate_step`, between a server's requests) while a fixed k stands in for auto, so
        that the server answers at once. Whether there is something to measure."""
        if self._verify_costs is None:
            self._verify_costs = self._kept_costs()
        if self._verify_costs is None:
            self._calibration = measuring_verify_costs(self.target)
        return self._calibration is not None

    def calibrate_step(self) -> bool:
        """Time the next width of the calibration; False once it is done (auto then sizes drafts
        by the table, kept for the next run)."""
        assert self._calibration is not None
        try:
            next(self._calibration)
        except StopIteration as done:
            self._verify_costs, self._calibration = self._keep(done.value), None
            return False
        return True

    def _kept_costs(self) -> list[float] | None:
        kept = cost_cache.load(self.costs_key)
        return kept if kept and verify_costs_hold(self.target, kept) else None

    def _keep(self, costs: list[float]) -> list[float]:
        cost_cache.save(self.costs_key, self.config.target, costs)
        return costs

    def auto_costs(self) -> list[float]:
        """The verify costs as auto keeps refining them (a batch prices a draft's rows by them)."""
        auto = self.policy("auto")
        assert isinstance(auto, AutoK)
        return auto.costs

    def save(self) -> None:
        """Keep the verify costs auto refined while running for the next session with this set-up."""
        auto = self._policies.get("auto")
        if isinstance(auto, AutoK):
            cost_cache.save(self.costs_key, self.config.target, auto.costs)

    def _costs_key(self) -> str:
        c = self.config
        # Layers on other machines or split another way decode at other costs; a local set-up keeps its old key.
        placement: dict[str, str | int] = {"rpc": ",".join(c.rpc)} if c.rpc else {}
        placement |= {"tensor_split": ",".join(map(str, c.tensor_split))} if c.tensor_split else {}
        placement |= {"n_ubatch": c.n_ubatch} if c.n_ubatch else {}  # smaller micro-batches verify at other costs
        return cost_cache.setup_key(
            c.target,
            threads=self.target.n_threads,
            n_gpu_layers=c.n_gpu_layers,
            flash_attn=c.flash_attn,
            repack=c.repack,
            n_batch=self.target.n_batch,
            n_ctx=self.target.n_ctx,
            **placement,
        )  # a small context caps the widths measured
