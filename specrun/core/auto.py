"""`--k auto`: k per step and source from measured verify costs and online acceptance estimates.

It maximises expected tokens per second:
    E(k) = 1 + sum_{j<=k} prod_{i<=j} a_i     (a_i: acceptance at draft position i)
    T(k) = verify_cost[k + 1] + k * draft_cost   (a block drafter's: + block_cost, one decode whatever k)
and falls back to plain decoding (k = 0) when speculation measures slower, probing now and
then so it comes back when the text turns predictable. `offer` decides from what is known
and changes nothing; `observe` applies the decision behind the verified draft (and the
declines before it), then learns from the step.
"""

from __future__ import annotations

import itertools
import math
import operator
from dataclasses import dataclass, field
from typing import Sequence

from specrun.core.policy import PRIOR, Budget, Decision, StepRecord, ema

FREE_DRAFT_SHARE = 0.01  # a draft token costing under 1% of a one-row decode counts as free
PROBE_SHARE = 0.01  # probes of a source measured slower take at most this share of the time
UNREACHED = 1e-4  # a draft position reached with less chance adds under 1/10,000 of a token


@dataclass
class SourceTrack:
    """What auto has measured for one draft source (decayed, so it follows the text)."""

    hits: list[float] = field(default_factory=list)  # per draft position, grown as drafts reach it
    tries: list[float] = field(default_factory=list)
    draft_token_s: float = 0.0
    block: bool = False  # it drafts a block in one decode: block_s per step, not draft_token_s per token
    block_s: float = 0.0
    tokens_per_step: float = 0.0
    seconds_per_step: float = 0.0
    steps: int = 0
    skipped: int = 0  # plain steps since this source was last tried
    probe_interval: int = 16
    catch_up_s: float = 0.0  # what the last probe spent catching the drafter up
    probing: bool = False  # the step in flight is a probe
    probed: bool = False  # ever probed: one declined before anything was measured is probed at once
    prior: float = PRIOR

    def acceptances(self, n: int, strength: float = 2.0) -> list[float]:
        """Acceptance at positions 0..n-1 given the earlier ones were accepted.

        Each position's prior is the estimate of the one before: positions a short draft
        never reached look like the deepest measured one, so auto can grow k again.
        """
        estimates, prior = [], self.prior
        for hits, tries in zip(self.hits[:n], self.tries[:n]):
            prior = (hits + prior * strength) / (tries + strength)
            estimates.append(prior)
        return estimates + [prior] * (n - len(estimates))

    def drafting_s(self, k: int) -> float:
        """Expected seconds to draft k tokens: k decodes of a token, or a block drafter's one."""
        return (self.block_s if k else 0.0) if self.block else k * self.draft_token_s

    @property
    def rate(self) -> float:
        return self.tokens_per_step / self.seconds_per_step if self.seconds_per_step else 0.0

    def forget(self, decay: float) -> None:
        """Weigh all acceptance evidence so far down by one step of text."""
        self.hits = [h * decay for h in self.hits]
        self.tries = [t * decay for t in self.tries]


class AutoK:
    """Cost-aware k per step from measured verify costs and online acceptance estimates."""

    wants_confidence = True
    learns = True

    def __init__(self, verify_costs: list[float], decay: float = 0.9):
        """`verify_costs[w]`: seconds to verify w rows; the widest sets the longest draft."""
        self.costs = list(verify_costs)
        self.max_k = len(self.costs) - 2
        self.decay = decay
        self.label = "auto"
        self.sources: dict[str, SourceTrack] = {}
        # Acceptance by draft confidence (10 bins); the prior trusts the confidence itself.
        self.conf_hits = [0.0] * 10
        self.conf_tries = [0.0] * 10

    # --- decisions (queries: nothing changes until `observe`) ------------------------
    def offer(self, source: str, limit: int, prior: float = PRIOR, rows: int = 0, block: bool = False) -> Budget:
        """Other streams' `rows` in the same decode count in where drafting costs time (a model):
        each is taken to yield one token, and the draft's rows cost what they add to the decode
        at that width, so a batch wide enough that more rows no longer pay gets no model drafts.
        A free draft (a copy) is sized as if alone: a batch verifies, of all its streams' drafts,
        the rows that pay (`rows_to_verify`). With one stream, rows is 0."""
        track = self._track(source, prior, block)
        rows = rows if self.costs_time(track) else 0
        limit = min(limit, self.max_k - rows)
        if limit < 1:
            return Budget(source, 0, "none", prior, rows, block)
        k, decision = self._k(track, limit, rows)
        return Budget(source, k, decision, prior, rows, block)

    def _track(self, source: str, prior: float, block: bool = False) -> SourceTrack:
        """What was measured of `source`, or a fresh track on its prior (a query: nothing is kept)."""
        return self.sources.get(source) or SourceTrack(prior=prior, block=block)

    def costs_time(self, track: SourceTrack) -> bool:
        """Whether the source's drafts cost time to make (a model's), not only to verify."""
        return track.drafting_s(1) > FREE_DRAFT_SHARE * self.costs[1]

    def _k(self, track: SourceTrack, limit: int, rows: int) -> tuple[int, Decision]:
        # A source that costs time to draft (a model) is judged by the rate its steps measured.
        # A free one (lookup) is left to best_k: its past rate reflects past draft lengths, and
        # one long copy that broke early would otherwise bench it while it still copies.
        measured_slow = self.costs_time(track) and track.steps >= 2 and track.rate < self.plain_rate
        k = 0 if measured_slow else self.best_k(track, limit, rows)
        if k:
            # A first draft measures what catching the drafter up costs, as a probe does.
            return k, "grant" if track.probed else "first"
        # Plain is faster for now. Old evidence fades with the text that passes, and a probe
        # now and then lets acceptance be seen to rise. A source never probed gets one at
        # once: a prior near the break-even point should not rule it out unmeasured.
        unmeasured = track.steps == 0 and not track.probed
        if track.skipped + 1 < self.probe_spacing(track) and not unmeasured:
            return 0, "decline"
        return self.probe_k(track, limit), "probe"

    def _apply(self, budget: Budget) -> SourceTrack:
        """What the decision behind `budget` does to its source's track, now that it counts."""
        track = self.sources.setdefault(budget.source, SourceTrack(prior=budget.prior, block=budget.block))
        if budget.decision in ("decline", "probe"):
            track.forget(self.decay)
            track.skipped += 1
        if budget.decision == "probe" and (track.steps or track.probed):
            track.probe_interval = min(track.probe_interval * 2, 512)  # back off while probes fail
        if budget.decision in ("grant", "first", "probe"):
            track.skipped = 0
        if budget.decision in ("first", "probe"):
            track.probing = track.probed = True
        return track

    def probe_spacing(self, track: SourceTrack) -> int:
        """Plain steps before the next probe: the backed-off interval, or more where a model
        draft's probe first catches its cache up on the text since it last drafted (a new
        prompt's whole length), so that catching up stays within PROBE_SHARE of the time."""
        return max(track.probe_interval, math.ceil(track.catch_up_s / (PROBE_SHARE * self.costs[1])))

    def probe_k(self, track: SourceTrack, limit: int) -> int:
        """The probe's length: of 1..4 drafts, the cheapest per token if all are accepted."""
        return max(range(1, min(limit, 4) + 1), key=lambda k: (k + 1) / self.step_s(track, k))

    def step_s(self, track: SourceTrack, k: int) -> float:
        """Expected seconds of a step that drafts k tokens from `track`'s source and verifies them."""
        return self.costs[k + 1] + track.drafting_s(k)

    def best_k(self, track: SourceTrack, limit: int, rows: int = 0) -> int:
        """The draft length with the most tokens per second for the decode it joins. The search
        ends where a draft is unlikely to reach: where verifying hundreds of rows costs about one
        (a GPU's batch), the limit is hundreds of positions, and most are out of reach."""
        best_k, best_rate, expected, alive = 0, (rows + 1) / self.costs[rows + 1], 1.0, 1.0
        for k, acceptance in enumerate(track.acceptances(limit), start=1):
            alive *= acceptance
            if alive < UNREACHED:
                break
            expected += alive
            rate = (rows + expected) / (self.costs[rows + k + 1] + track.drafting_s(k))
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k

    def extend(self, budget: Budget, confidence: float) -> Budget | None:
        """Keep this model-drafted token only if it raises the step's expected tokens/s."""
        track = self._track(budget.source, budget.prior, budget.block)
        alive = budget.alive * self.confidence_acceptance(confidence)
        width = budget.rows + budget.kept + 1  # rows verified before this token: others', last token, earlier drafts
        if width + 1 >= len(self.costs):
            return None
        before = (budget.rows + budget.gain) / (self.costs[width] + track.drafting_s(budget.kept))
        after = (budget.rows + budget.gain + alive) / (self.costs[width + 1] + track.drafting_s(budget.kept + 1))
        if after <= before:
            return None
        return budget._replace(kept=budget.kept + 1, gain=budget.gain + alive, alive=alive)

    def chances(self, budget: Budget, n: int, confidences: Sequence[float] | None) -> tuple[float, ...]:
        """Each row's expected tokens: from the drafter's confidence per token where it measured
        it (as `extend` judged them), else from the source's acceptance by position."""
        track = self._track(budget.source, budget.prior)
        each = [self.confidence_acceptance(c) for c in confidences[:n]] if confidences else track.acceptances(n)
        return tuple(itertools.accumulate(each, operator.mul))

    def confidence_acceptance(self, confidence: float) -> float:
        b = min(int(confidence * 10), 9)
        return (self.conf_hits[b] + 2.0 * confidence) / (self.conf_tries[b] + 2.0)

    @property
    def plain_rate(self) -> float:
        return 1.0 / self.costs[1]

    # --- learning -------------------------------------------------------------------
    def observe(self, step: StepRecord) -> None:
        width = step.rows or step.drafted + 1
        if step.rows is not None and width < len(self.costs):  # a decode that held a prompt's rows is off the curve
            self.costs[width] = ema(self.costs[width], step.verify_s, 0.1, False)
        for declined in step.declined:
            self._apply(declined)
        if step.budget is None or step.budget.decision == "none":
            return  # a plain step: only the verify cost was news
        track = self._apply(step.budget)
        if not step.drafted and step.draft_s < 0.1 * step.verify_s:
            return  # nothing drafted and nothing spent
        self._learn_rate(track, step)
        self._learn_acceptance(track, step)

    def _learn_rate(self, track: SourceTrack, step: StepRecord) -> None:
        probe, track.probing = track.probing, False
        if probe and step.accepted:
            track.steps = 0  # a useful probe: judge the source afresh, from this step on
        first = track.steps == 0
        track.steps += 1
        if track.block and step.draft_s > step.catch_up_s:
            track.block_s = ema(track.block_s, step.draft_s - step.catch_up_s, 0.2, first)
        elif step.drafted or step.draft_s > step.catch_up_s:
            # A model draft that kept no token still decoded once to guess the first: that is its cost.
            track.draft_token_s = ema(track.draft_token_s, (step.draft_s - step.catch_up_s) / max(step.drafted, 1), 0.2, first)
        if probe:
            track.catch_up_s = step.catch_up_s
        track.tokens_per_step = ema(track.tokens_per_step, step.accepted + 1, 0.1, first)
        track.seconds_per_step = ema(track.seconds_per_step, step.draft_s + step.verify_s, 0.1, first)
        if step.drafted and step.accepted:
            track.probe_interval, track.catch_up_s = 16, 0.0  # it paid: if it falls back to plain, probe again soon

    def _learn_acceptance(self, track: SourceTrack, step: StepRecord) -> None:
        reached = min(step.drafted, step.accepted + 1)  # positions reached by verification
        grow = reached - len(track.hits)
        if grow > 0:
            track.hits += [0.0] * grow
            track.tries += [0.0] * grow
        # Evidence at positions this draft did not reach ages too: the deepest position a draft
        # reached usually holds the rejection that ended it, and kept at full weight, that one
        # miss would cap every later draft below it, however well shorter ones since went.
        track.forget(self.decay)
        for i in range(reached):
            track.hits[i] += i < step.accepted
            track.tries[i] += 1
            if step.confidences is not None:
                b = min(int(step.confidences[i] * 10), 9)
                self.conf_hits[b] += i < step.accepted
                self.conf_tries[b] += 1


def rows_to_verify(costs: Sequence[float], fixed: int, chances: Sequence[Sequence[float]]) -> list[int]:
    """How many of each stream's draft rows one decode verifies, for the most expected tokens
    per second at `costs[width]`: rows go where they are likeliest to be accepted, at the width
    that pays best (on a CPU whose output head computes rows four at a time, a multiple of four).

    `fixed`: rows decoded whatever is chosen (each stream's last token, drafts verified whole),
    each counted as one token; `chances`: per stream, its draft rows' expected tokens, falling
    along the draft, so that the best rows of a stream are always a prefix of its draft.
    """
    if fixed >= len(costs):
        return [len(row_chances) for row_chances in chances]  # wider than the curve: nothing to price by
    ranked = sorted(
        ((chance, stream) for stream, row_chances in enumerate(chances) for chance in row_chances), key=lambda c: -c[0]
    )
    ranked = ranked[: len(costs) - 1 - fixed]  # rows past the curve's widest are not priced
    best, best_rate, expected = 0, fixed / costs[fixed], float(fixed)
    for n, (chance, _) in enumerate(ranked, start=1):
        expected += chance
        if expected / costs[fixed + n] > best_rate:
            best, best_rate = n, expected / costs[fixed + n]
    kept = [0] * len(chances)
    for _, stream in ranked[:best]:
        kept[stream] += 1
    return kept
