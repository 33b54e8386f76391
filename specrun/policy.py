"""How many tokens to draft: fixed k, llama.cpp's rule, or `auto` (cost-aware, measured).

`DraftPolicy` is the whole contract: drafters ask `cap(source, limit)` for a step's
`Budget` before drafting and, for model drafts, hand it to `keep(budget, confidence)`
before adding each token; the engine reports each verified step to `observe` as a
`StepRecord`. Auto maximises expected tokens per second:
    E(k) = 1 + sum_{j<=k} prod_{i<=j} a_i     (a_i: acceptance at draft position i)
    T(k) = verify_cost[k + 1] + k * draft_cost
and falls back to plain decoding (k = 0) when speculation measures slower, probing now
and then so it comes back when the text turns predictable.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol, Sequence

import numpy as np

from specrun.errors import SpecrunError
from specrun.settings import SettingError, check

LLAMA_CPP_DRAFT_MAX = 16  # llama.cpp's --draft-max default, for --k llama.cpp
PRIOR = 0.7  # acceptance per position assumed of a draft source before any is measured
# Verify widths timed one by one (odd widths can cost more than the even width above, as
# on AVX2 CPUs), then a few wider ones; widths between are interpolated.
EVERY_WIDTH_TO = 17
WIDE_WIDTHS = (24, 32, 48, 64)
SPOT_CHECK_WIDTH = 64  # a kept table is checked at 1 row and this many (about 1 s on 2 CPU cores)
WIDER_ROW_GAIN = 0.05  # keep doubling the widest width while a row gets at least this much cheaper
FREE_DRAFT_SHARE = 0.01  # a draft token costing under 1% of a one-row decode counts as free
PROBE_SHARE = 0.01  # probes of a source measured slower take at most this share of the time


K_ALLOWED = "an integer >= 1, 'auto' or 'llama.cpp'"


def parse_k(value: int | str) -> int | str:
    """A k: a draft length >= 1, 'auto', or 'llama.cpp' (its draft-max/p-min rule), as a number or text."""
    if value in ("auto", "llama.cpp"):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise SettingError("k", K_ALLOWED, value)
    try:
        k = int(value)
    except ValueError:
        k = 0
    if k < 1:
        raise SettingError("k", K_ALLOWED, value)
    return k


Source = Literal["lookup", "lookup-long", "lookup-copy", "store", "store-long", "draft", "translated", "translated-tokens",
                 "grammar"]
"""The name a draft source reports its drafts under; a policy learns each apart."""


@dataclass(frozen=True)
class Budget:
    """One step's allowance for one source: what `cap` granted and what `keep` has kept of it.

    Drafters hand it back to `keep` with each model-drafted token; nothing about the step in
    flight lives in the policy.
    """

    source: Source
    k: int  # the most tokens the source may draft this step (0: a plain step)
    kept: int = 0  # model-drafted tokens kept so far
    gain: float = 1.0  # auto: tokens the step is expected to yield with the tokens kept so far
    alive: float = 1.0  # auto: the chance that every kept token is accepted
    drafted_s: float = 0.0  # auto: expected seconds spent drafting the tokens kept so far


@dataclass(frozen=True)
class StepRecord:
    """What one verified step did, as a policy learns from it."""

    source: Source | None  # None for a plain step (nothing was proposed)
    drafted: int
    accepted: int
    confidences: Sequence[float] | None  # the drafter's probability per drafted token, when it measured them
    draft_s: float  # seconds spent drafting
    verify_s: float  # seconds of the verify decode and the check of its rows
    catch_up_s: float = 0.0  # of draft_s, feeding a model draft's cache text it missed (see Draft.catch_up_s)


class DraftPolicy(Protocol):
    """How many tokens to draft, per step and source. Drafters call `cap` before drafting and,
    for model drafts, `keep` before adding each token; the engine reports each step to `observe`."""

    label: str  # how --k and the chat panel name it ("auto", "8", "llama.cpp")
    max_k: int  # the longest draft it ever grants: the verify batch needs max_k + 1 rows
    wants_confidence: bool  # whether `keep` reads a token's probability (drafters compute it only then)
    # Whether a model draft far behind the text (a new prompt) may catch up on its recent part only,
    # bounded by what that costs (auto); else it feeds all of it, as llama.cpp does.
    bounds_catch_up: bool

    def cap(self, source: Source, limit: int, prior: float = PRIOR) -> Budget:
        """This step's budget for `source`, at most `limit` tokens (k = 0: do not draft).

        `prior`: the acceptance the drafter expects from this source before any is measured.
        """
        ...

    def keep(self, budget: Budget, confidence: float) -> Budget | None:
        """The budget with one more model-drafted token (probability `confidence`) kept, or
        None when that token is not worth verifying: the draft ends before it."""
        ...

    def observe(self, step: StepRecord) -> None:
        """Learn from a verified step."""
        ...


class FixedK:
    """Draft k tokens whenever the drafter offers them (a lookup copy may offer fewer)."""

    wants_confidence = False
    bounds_catch_up = False

    def __init__(self, k: int):
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise SettingError("k", K_ALLOWED, k)
        self.k = self.max_k = k
        self.label = str(k)

    def cap(self, source: Source, limit: int, prior: float = PRIOR) -> Budget:
        return Budget(source, max(0, min(self.k, limit)))

    def keep(self, budget: Budget, confidence: float) -> Budget | None:
        return replace(budget, kept=budget.kept + 1)

    def observe(self, step: StepRecord) -> None:
        pass


class PMinPolicy(FixedK):
    """llama.cpp's speculative rule: up to --draft-max 16, stop below --draft-p-min 0.75."""

    wants_confidence = True

    def __init__(self, k: int = LLAMA_CPP_DRAFT_MAX, p_min: float = 0.75):
        super().__init__(k)
        self.p_min = p_min
        self.label = "llama.cpp"

    def keep(self, budget: Budget, confidence: float) -> Budget | None:
        return replace(budget, kept=budget.kept + 1) if confidence >= self.p_min else None


@dataclass(frozen=True)
class SpeculativeSettings:
    """llama-server's per-request `speculative` object, with its defaults."""

    n_max: int = LLAMA_CPP_DRAFT_MAX  # the most tokens drafted
    n_min: int = 0  # a copied draft shorter than this is not verified
    p_min: float = 0.75  # a model draft stops below this probability

    def __post_init__(self) -> None:
        check(n_max=self.n_max, n_min=self.n_min, p_min=self.p_min)
        if self.n_min > self.n_max:
            raise SettingError("n_min", f"<= n_max ({self.n_max})", self.n_min)


class SpeculativeRule(PMinPolicy):
    """llama-server's per-request `speculative`: at most n_max drafted, p_min for model drafts,
    and a copied draft shorter than n_min is not verified (a model draft's length is not
    known before it is drafted, so n_min does not apply to it)."""

    def __init__(self, settings: SpeculativeSettings):
        super().__init__(settings.n_max, settings.p_min)
        self.n_min = settings.n_min
        self.label = "speculative"

    def cap(self, source: Source, limit: int, prior: float = PRIOR) -> Budget:
        budget = super().cap(source, limit, prior)
        return budget if budget.k >= self.n_min else replace(budget, k=0)


def measure_verify_costs(context, repeats: int = 2) -> list[float]:
    """Seconds for one target decode of w rows with logits, for w = 1..W (index w).

    W follows the hardware: every width to EVERY_WIDTH_TO and WIDE_WIDTHS are timed, then
    twice the widest while a row still gets WIDER_ROW_GAIN cheaper, up to the batch size
    (where verifying is nearly free per row, as on a GPU, drafts may grow to n_batch - 1).
    """
    most = min(context.n_batch, context.free_slots - 1)
    widths = [w for w in (*range(1, EVERY_WIDTH_TO + 1), *WIDE_WIDTHS) if w <= most]
    timed = time_decodes(context, widths, repeats)
    width = widths[-1]
    while width * 2 <= most:
        wider = time_decodes(context, [width * 2], repeats)[width * 2]
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


@dataclass
class SourceTrack:
    """What auto has measured for one draft source (decayed, so it follows the text)."""

    hits: list[float] = field(default_factory=list)  # per draft position, grown as drafts reach it
    tries: list[float] = field(default_factory=list)
    draft_token_s: float = 0.0
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

    @property
    def rate(self) -> float:
        return self.tokens_per_step / self.seconds_per_step if self.seconds_per_step else 0.0

    def forget(self, decay: float) -> None:
        """Weigh all acceptance evidence so far down by one step of text."""
        self.hits = [h * decay for h in self.hits]
        self.tries = [t * decay for t in self.tries]


def ema(old: float, new: float, weight: float, first: bool) -> float:
    return new if first else (1 - weight) * old + weight * new


class AutoK:
    """Cost-aware k per step from measured verify costs and online acceptance estimates."""

    wants_confidence = True
    bounds_catch_up = True

    def __init__(self, verify_costs: list[float], decay: float = 0.9):
        """`verify_costs[w]`: seconds to verify w rows; the widest sets the longest draft."""
        self.costs = list(verify_costs)
        self.max_k = len(self.costs) - 2
        self.decay = decay
        self.label = "auto"
        self.sources: dict[Source, SourceTrack] = {}
        # Acceptance by draft confidence (10 bins); the prior trusts the confidence itself.
        self.conf_hits = [0.0] * 10
        self.conf_tries = [0.0] * 10

    # --- decisions ------------------------------------------------------------------
    def cap(self, source: Source, limit: int, prior: float = PRIOR) -> Budget:
        limit = min(limit, self.max_k)
        track = self.sources.setdefault(source, SourceTrack(prior=prior))
        return Budget(source, self._k(track, limit) if limit >= 1 else 0)

    def _k(self, track: SourceTrack, limit: int) -> int:
        # A source that costs time to draft (a model) is judged by the rate its steps measured.
        # A free one (lookup) is left to best_k: its past rate reflects past draft lengths, and
        # one long copy that broke early would otherwise bench it while it still copies.
        drafting_costs = track.draft_token_s > FREE_DRAFT_SHARE * self.costs[1]
        measured_slow = drafting_costs and track.steps >= 2 and track.rate < self.plain_rate
        k = 0 if measured_slow else self.best_k(track, limit)
        if k:
            track.skipped = 0
            if not track.probed:  # a first draft measures what catching the drafter up costs, as a probe does
                track.probing = track.probed = True
            return k
        # Plain is faster for now. Old evidence fades with the text that passes, and a probe
        # now and then lets acceptance be seen to rise. A source never probed gets one at
        # once: a prior near the break-even point should not rule it out unmeasured.
        track.forget(self.decay)
        track.skipped += 1
        unmeasured = track.steps == 0 and not track.probed
        if track.skipped < self.probe_spacing(track) and not unmeasured:
            return 0
        if not unmeasured:
            track.probe_interval = min(track.probe_interval * 2, 512)  # back off while probes fail
        track.skipped = 0
        track.probing = track.probed = True
        return self.probe_k(track, limit)

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
        return self.costs[k + 1] + k * track.draft_token_s

    def best_k(self, track: SourceTrack, limit: int) -> int:
        best_k, best_rate, expected, alive = 0, 1.0 / self.costs[1], 1.0, 1.0
        for k, acceptance in enumerate(track.acceptances(limit), start=1):
            alive *= acceptance
            expected += alive
            rate = expected / self.step_s(track, k)
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k

    def keep(self, budget: Budget, confidence: float) -> Budget | None:
        """Keep this model-drafted token only if it raises the step's expected tokens/s."""
        track = self.sources[budget.source]
        alive = budget.alive * self.confidence_acceptance(confidence)
        width = budget.kept + 1  # rows verified before this token: last token + earlier drafts
        before = budget.gain / (self.costs[width] + budget.drafted_s)
        drafted_s = budget.drafted_s + track.draft_token_s
        after = (budget.gain + alive) / (self.costs[width + 1] + drafted_s)
        if after <= before:
            return None
        return replace(budget, kept=budget.kept + 1, gain=budget.gain + alive, alive=alive, drafted_s=drafted_s)

    def confidence_acceptance(self, confidence: float) -> float:
        b = min(int(confidence * 10), 9)
        return (self.conf_hits[b] + 2.0 * confidence) / (self.conf_tries[b] + 2.0)

    @property
    def plain_rate(self) -> float:
        return 1.0 / self.costs[1]

    # --- learning -------------------------------------------------------------------
    def observe(self, step: StepRecord) -> None:
        width = step.drafted + 1
        if width < len(self.costs):
            self.costs[width] = ema(self.costs[width], step.verify_s, 0.1, False)
        if step.source not in self.sources or (not step.drafted and step.draft_s < 0.1 * step.verify_s):
            return  # a plain step, or a lookup miss that cost nothing: only the verify cost was news
        track = self.sources[step.source]
        self._learn_rate(track, step)
        self._learn_acceptance(track, step)

    def _learn_rate(self, track: SourceTrack, step: StepRecord) -> None:
        probe, track.probing = track.probing, False
        if probe and step.accepted:
            track.steps = 0  # a useful probe: judge the source afresh, from this step on
        first = track.steps == 0
        track.steps += 1
        if step.drafted or step.draft_s > step.catch_up_s:
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
