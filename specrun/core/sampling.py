"""Sampling in plain numpy: llama.cpp's filter chain and the exact accept/reject rule.

Everything here works on small arrays, so it is tested without any model.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from specrun.core.events import TokenLogprobs
from specrun.settings import SettingError, check, check_logit_bias


@dataclass(frozen=True)
class SamplerSettings:
    temperature: float = 0.0  # 0 means greedy (argmax)
    top_k: int = 40  # keep the k most likely tokens; 0 disables
    top_p: float = 0.95  # keep the smallest set whose temperature-1 mass reaches p; 1 disables
    min_p: float = 0.05  # drop tokens below min_p x the top probability; 0 disables
    seed: int | None = None  # None draws a fresh seed
    # llama.cpp's repetition penalties, first in its chain (greedy too), over the last
    # repeat_last_n tokens of the text, the prompt's included (0 disables them)
    repeat_penalty: float = 1.0  # a logit of such a token divided by it (multiplied, if negative); 1 disables
    frequency_penalty: float = 0.0  # subtracted once per time the token occurs there
    presence_penalty: float = 0.0  # subtracted once if it occurs there at all
    repeat_last_n: int = 64
    # llama.cpp's logit bias, before everything else in its chain: token id -> what is added to
    # its logit (-inf bans it)
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    ignore_eos: bool = False  # the model's end-of-generation tokens banned (llama.cpp's: a bias of -inf on each)
    # llama.cpp's XTC, after min-p: with this probability, the likeliest survivors whose probability
    # reaches the threshold are dropped, all but the least likely of them (0 disables it)
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1  # above 0.5 disables it
    # llama.cpp's dynamic temperature: each row's temperature between temperature -/+ the range
    # (at least 0), higher the closer the survivors' entropy is to its most (0 disables it)
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    # llama.cpp's other filters, off by default (after the fields above, which keep their places):
    top_n_sigma: float = -1.0  # before top-k: logits within n standard deviations of the top one; <= 0 disables
    typical_p: float = 1.0  # after top-k: the most typical tokens (surprise nearest the entropy) to mass p; 1 disables

    def __post_init__(self) -> None:
        values = asdict(self)
        check_logit_bias(values.pop("logit_bias"))
        if not isinstance(values.pop("ignore_eos"), bool):
            raise SettingError("ignore_eos", "true or false", self.ignore_eos)
        check(**values)  # every other field is a setting, named as its rule

    def banning(self, tokens: Iterable[int]) -> "SamplerSettings":
        """These settings with `tokens` banned too (a bias of -inf on each)."""
        return replace(self, logit_bias={**self.logit_bias, **dict.fromkeys(tokens, -math.inf)})

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def xtc(self) -> bool:
        """Whether XTC may drop tokens."""
        return self.xtc_probability > 0 and self.xtc_threshold <= 0.5

    @property
    def deterministic(self) -> bool:
        """Whether each token is its row's argmax: greedy, with no XTC to draw at random and no
        dynamic temperature to raise it above 0 (as llama.cpp's chain, which then samples)."""
        return self.greedy and not self.xtc and self.dynatemp_range == 0


@dataclass(frozen=True)
class Sampler:
    """One generation's sampling: its settings and the random stream every draw takes from."""

    settings: SamplerSettings
    rng: np.random.Generator

    @classmethod
    def seeded(cls, settings: SamplerSettings) -> "Sampler":
        """A fresh stream from the settings' seed: the same seed gives the same draws."""
        return cls(settings, np.random.default_rng(settings.seed))

    @cached_property
    def adjustments(self) -> "Adjustments | None":
        """What the chain does to each row before it filters (the verified rows and the drafts' alike),
        made once a generation."""
        return Adjustments.of(self.settings)


@dataclass(frozen=True)
class Distribution:
    """A sparse distribution: token ids and their probabilities (summing to 1)."""

    ids: np.ndarray
    probs: np.ndarray

    @classmethod
    def point(cls, token: int) -> "Distribution":
        return cls(np.array([token]), np.array([1.0]))

    @cached_property
    def _by_token(self) -> dict[int, float]:
        return dict(zip(self.ids.tolist(), self.probs.tolist()))

    @cached_property
    def _cdf(self) -> np.ndarray:
        return np.cumsum(self.probs)

    def prob(self, token: int) -> float:
        return self._by_token.get(token, 0.0)

    def sample(self, rng: np.random.Generator) -> int:
        if self.ids.size == 1:
            return int(self.ids[0])
        index = int(np.searchsorted(self._cdf, rng.random() * self._cdf[-1], side="right"))
        return int(self.ids[min(index, self.ids.size - 1)])

    def mixed(self, other: "Distribution", weight: float) -> "Distribution":
        """(1 - weight) of this and `weight` of `other`, over the tokens either has."""
        ids, inverse = np.unique(np.concatenate([self.ids, other.ids]), return_inverse=True)
        probs = np.bincount(inverse, weights=np.concatenate([(1 - weight) * self.probs, weight * other.probs]))
        keep = probs > 0
        return Distribution(ids[keep], probs[keep])

    def residual(self, q: "Distribution") -> "Distribution":
        """norm(max(p - q, 0)): where a rejected draft's replacement is drawn from."""
        q_on_p = np.array([q.prob(t) for t in self.ids.tolist()])
        mass = np.maximum(self.probs - q_on_p, 0.0)
        total = mass.sum()
        if total <= 0:  # p == q up to rounding: rejection had probability ~0
            return self
        keep = mass > 0
        return Distribution(self.ids[keep], mass[keep] / total)


@dataclass(frozen=True)
class Penalties:
    """llama.cpp's `penalties` sampler: a row's logits for the tokens among the last `last_n` of
    the text, lowered by how often each occurs there, in float32 as llama.cpp computes."""

    last_n: int
    repeat: np.float32
    frequency: np.float32
    presence: np.float32

    @classmethod
    def of(cls, settings: SamplerSettings) -> "Penalties | None":
        """The settings' penalties; None where they change nothing, as llama.cpp skips them."""
        s = settings
        if s.repeat_last_n == 0 or (s.repeat_penalty == 1 and s.frequency_penalty == 0 and s.presence_penalty == 0):
            return None
        return cls(s.repeat_last_n, np.float32(s.repeat_penalty), np.float32(s.frequency_penalty), np.float32(s.presence_penalty))

    def window(self, text: Sequence[int], then: Sequence[int] = ()) -> list[int]:
        """The tokens penalized after `text` and then `then` (a row's draft tokens before it)."""
        return [*text[-self.last_n :], *then][-self.last_n :]

    def penalized(self, row: np.ndarray, text: Sequence[int], then: Sequence[int] = ()) -> np.ndarray:
        """A copy of `row` with the window's tokens after `text` and `then` penalized (those it has
        a logit for: a draft's vocabulary may end before the target's)."""
        ids, counts = np.unique(np.asarray(self.window(text, then), dtype=np.int64), return_counts=True)
        inside = ids < row.size
        ids, counts = ids[inside], counts[inside]
        out = row.astype(np.float32, copy=True)
        values = out[ids]
        values = np.where(values <= 0, values * self.repeat, values / self.repeat)
        out[ids] = values - (counts.astype(np.float32) * self.frequency + self.presence)
        return out


@dataclass(frozen=True)
class Adjustments:
    """What llama.cpp's chain does to a row's logits before it filters them: the logit bias, then
    the repetition penalties over the text before the row."""

    bias_ids: np.ndarray
    bias: np.ndarray
    penalties: Penalties | None

    @classmethod
    def of(cls, settings: SamplerSettings) -> "Adjustments | None":
        """The settings' adjustments; None where they change nothing."""
        penalties = Penalties.of(settings)
        if not (settings.logit_bias or penalties):
            return None
        ids = np.fromiter(settings.logit_bias.keys(), dtype=np.int64, count=len(settings.logit_bias))
        return cls(ids, np.fromiter(settings.logit_bias.values(), dtype=np.float32, count=ids.size), penalties)

    def window(self, text: Sequence[int]) -> list[int]:
        """What of `text` the penalties look at (all a row needs of it)."""
        return self.penalties.window(text) if self.penalties else []

    def adjusted(self, row: np.ndarray, text: Sequence[int], then: Sequence[int] = (), bias: bool = True) -> np.ndarray:
        """`row` (a copy where anything changes) after `text` and then `then`, biased unless `bias` is
        False (a row in another vocabulary than the one the bias names), then penalized."""
        if bias and self.bias_ids.size:
            inside = self.bias_ids < row.size  # a draft's vocabulary may end before the target's
            row = row.astype(np.float32, copy=True)
            row[self.bias_ids[inside]] += self.bias[inside]
        return self.penalties.penalized(row, text, then) if self.penalties else row


def filtered(logits: np.ndarray, settings: SamplerSettings, scratch: np.ndarray | None = None) -> Distribution:
    """The distribution llama.cpp's chain top_n_sigma -> top_k -> typical -> top_p -> min_p -> xtc ->
    temp -> dist samples from.

    `scratch` (bool, vocab-sized) spares an allocation per call in the decoding loop.
    """
    if settings.deterministic:
        return Distribution.point(int(logits.argmax()))
    n = logits.shape[-1]
    ids = top_k_ids(logits, settings.top_k, scratch) if 0 < settings.top_k < n else np.arange(n)
    if settings.top_n_sigma > 0:  # it masks the row before top-k, which cannot bring a masked token back
        ids = ids[logits[ids] >= _sigma_floor(logits, settings.top_n_sigma)]
    ids = ids[np.argsort(-logits[ids], kind="stable")]
    values = logits[ids].astype(np.float64)
    p1 = _softmax(values)  # typical-p, top-p and min-p look at the survivors' temperature-1 softmax
    if settings.typical_p < 1:
        typical = _typical(p1, settings.typical_p)
        ids, values, p1 = ids[typical], values[typical], p1[typical] / p1[typical].sum()
    if settings.top_p < 1:
        keep = int(np.searchsorted(np.cumsum(p1), settings.top_p, side="left")) + 1
        ids, values, p1 = ids[:keep], values[:keep], p1[:keep]
    if settings.min_p > 0:
        keep = int(np.count_nonzero(p1 >= settings.min_p * p1[0]))
        ids, values = ids[:keep], values[:keep]
    tempered = _tempered(ids, values, settings)
    dropped = _xtc_dropped(values, settings) if settings.xtc else 0
    if not dropped:
        return tempered
    # XTC fires at random: the row's distribution is the mixture of its firing and not.
    thinned = _tempered(ids[dropped:], values[dropped:], settings)
    return tempered.mixed(thinned, settings.xtc_probability)


def _softmax(values: np.ndarray) -> np.ndarray:
    """The temperature-1 probabilities of logits `values`, the largest first."""
    p = np.exp(values - values[0])
    return p / p.sum()


def _entropy(p: np.ndarray) -> float:
    return -float(np.sum(p[p > 0] * np.log(p[p > 0])))


def _sigma_floor(logits: np.ndarray, n: float) -> float:
    """top-n-sigma's: the top logit less n standard deviations of the row's finite logits."""
    finite = logits[np.isfinite(logits)]
    return float(finite.max() - n * finite.std(dtype=np.float64))


def _typical(p: np.ndarray, mass: float) -> np.ndarray:
    """Locally typical sampling's survivors of `p` (likeliest first), as a mask: the tokens whose
    surprise is closest to the entropy, until their mass passes `mass`."""
    with np.errstate(divide="ignore"):
        surprise = -np.log(p)
    order = np.argsort(np.abs(surprise - _entropy(p)), kind="stable")
    kept = int(np.searchsorted(np.cumsum(p[order]), mass, side="right")) + 1
    mask = np.zeros(p.size, dtype=bool)
    mask[order[:kept]] = True
    return mask


def _dynamic_temperature(values: np.ndarray, settings: SamplerSettings) -> float:
    """llama.cpp's temp_ext: from temperature - range (at least 0) to temperature + range, by the
    survivors' temperature-1 entropy over its most (all equally likely), to the exponent."""
    if values.size <= 1:
        return settings.temperature
    low = max(0.0, settings.temperature - settings.dynatemp_range)
    high = settings.temperature + settings.dynatemp_range
    return low + (high - low) * (_entropy(_softmax(values)) / np.log(values.size)) ** settings.dynatemp_exponent


def _xtc_dropped(values: np.ndarray, settings: SamplerSettings) -> int:
    """How many of the survivors (`values`, their logits, likeliest first) XTC drops when it fires:
    those whose temperature-1 probability among them reaches the threshold, all but the last;
    none when fewer than two reach it."""
    return max(int(np.count_nonzero(_softmax(values) >= settings.xtc_threshold)) - 1, 0)


def _tempered(ids: np.ndarray, values: np.ndarray, settings: SamplerSettings) -> Distribution:
    """The survivors' distribution at the settings' temperature (0: the likeliest alone), or the
    dynamic temperature their entropy gives."""
    temperature = _dynamic_temperature(values, settings) if settings.dynatemp_range > 0 else settings.temperature
    if temperature <= 0:
        return Distribution(ids[:1], np.ones(1))
    scaled = np.exp((values - values[0]) / temperature)
    return Distribution(ids, scaled / scaled.sum())


def log_probs(row: np.ndarray, token: int, top: int) -> TokenLogprobs:
    """The row's log-softmax at `token`, and its `top` likeliest tokens with theirs, likeliest first."""
    peak = float(row.max())
    normalizer = peak + float(np.log(np.exp(row - peak).sum(dtype=np.float64)))
    ids = np.sort(top_k_ids(row, top)) if top else np.empty(0, dtype=np.int64)
    ids = ids[np.argsort(-row[ids], kind="stable")]  # a tie: the lower id first
    return TokenLogprobs(float(row[token]) - normalizer, tuple((int(i), float(row[i]) - normalizer) for i in ids))


def top_k_ids(logits: np.ndarray, k: int, scratch: np.ndarray | None = None) -> np.ndarray:
    """Ids of the k largest logits, unordered.

    The top k of a large vocabulary sit within a few units of the maximum: select that
    band with one comparison, widening it until it holds k, and partition only the band:
    a full argpartition of a 262k vocabulary costs several times as much (docs/benchmarks.md,
    "Small costs behind the code").
    """
    if scratch is None:
        scratch = np.empty(logits.shape[-1], dtype=bool)
    top = float(logits.max())
    band = 4.0
    while True:
        np.greater_equal(logits, top - band, out=scratch)
        ids = np.flatnonzero(scratch)
        if ids.size >= k or band > 1e30:  # past float32 logits: every finite one is in the band
            break
        band *= 2
    if ids.size < k:  # fewer than k finite logits: whatever is largest
        ids = np.argpartition(logits, logits.size - k)[logits.size - k :]
    if ids.size > k:
        ids = ids[np.argpartition(logits[ids], ids.size - k)[ids.size - k :]]
    return ids


def greedy_verify(draft: Sequence[int], logits: np.ndarray) -> tuple[int, int]:
    """`verify` at temperature 0 of a deterministic draft, without a grammar: the target's argmax
    of every row (len(draft) + 1 of them) in one numpy call; the same answer, with less work per step."""
    choices = logits.argmax(axis=1).tolist()
    for i, token in enumerate(draft):
        if choices[i] != token:
            return i, choices[i]
    return len(draft), choices[len(draft)]


def verify(
    draft: Sequence[int],
    draft_dists: Sequence[Distribution] | None,
    target_dist: Callable[[int], Distribution],
    rng: np.random.Generator,
) -> tuple[int, int]:
    """Accept a prefix of the draft; return (accepted count, the target's next token).

    target_dist(i) is the target's filtered distribution p_i after the first i drafts;
    draft_dists[i] is q_i, the distribution draft[i] was sampled from (None when the
    drafter is deterministic). Either way each emitted token is distributed as p_i.
    """
    for i, token in enumerate(draft):
        p = target_dist(i)
        if draft_dists is None:
            # Deterministic draft: sample the target; keep the draft while they agree.
            sample = p.sample(rng)
            if sample != token:
                return i, sample
            continue
        q = draft_dists[i]
        # Leviathan/Chen: accept x ~ q with probability min(1, p(x) / q(x)) ...
        if rng.random() * q.prob(token) < p.prob(token):
            continue
        # ... else draw from norm(max(p - q, 0)), which makes the output exactly p.
        return i, p.residual(q).sample(rng)
    # Every draft accepted: the target's distribution after them gives a bonus token.
    return len(draft), target_dist(len(draft)).sample(rng)
