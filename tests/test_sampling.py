"""The sampler chain and the accept/reject rule, on small arrays: no model needed."""

import ctypes
from dataclasses import replace

import numpy as np
import pytest
from reference import chi_square_p

from specrun.backend.library import llama
from specrun.core.sampling import (
    Adjustments,
    Distribution,
    Penalties,
    SamplerSettings,
    filtered,
    greedy_verify,
    log_probs,
    top_k_ids,
    verify,
)
from specrun.errors import SpecrunError

DRAWS = 100_000

TARGET_LOGITS = np.array([2.0, 1.5, 1.0, 0.3, 0.0, -0.5, -1.0, -3.0], dtype=np.float32)
DRAFT_LOGITS = np.array([1.0, 2.0, 0.2, 0.9, -0.2, 0.4, -2.0, 0.0], dtype=np.float32)

SETTINGS = [
    SamplerSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
    SamplerSettings(temperature=0.7, top_k=0, top_p=1.0, min_p=0.0),
    SamplerSettings(temperature=1.5, top_k=5, top_p=1.0, min_p=0.0),
    SamplerSettings(temperature=0.8, top_k=0, top_p=0.8, min_p=0.0),
    SamplerSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.15),
    SamplerSettings(temperature=0.9, top_k=6, top_p=0.95, min_p=0.05),
]


def fits(counts: dict[int, int], expected: Distribution) -> bool:
    """Whether the counts pass a chi-square test against `expected` at p > 1e-4."""
    return chi_square_p(counts, dict(zip(expected.ids.tolist(), expected.probs.tolist()))) > 1e-4


def first_tokens(p: Distribution, q: Distribution, deterministic: bool, seed: int) -> dict[int, int]:
    """Emitted first token of a one-draft step, DRAWS times."""
    rng = np.random.default_rng(seed)
    counts: dict[int, int] = {}
    fixed_draft = int(q.ids[np.argmax(q.probs)])
    for _ in range(DRAWS):
        if deterministic:
            draft, dists = [fixed_draft], None
        else:
            draft, dists = [q.sample(rng)], [q]
        accepted, nxt = verify(draft, dists, lambda i: p, rng)
        token = draft[0] if accepted else nxt
        counts[token] = counts.get(token, 0) + 1
    return counts


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: f"T{s.temperature}-k{s.top_k}-p{s.top_p}-m{s.min_p}")
@pytest.mark.parametrize("deterministic", [False, True], ids=["p/q-rule", "sample-and-match"])
def test_emitted_token_follows_target_distribution(settings, deterministic):
    p = filtered(TARGET_LOGITS, settings)
    q = filtered(DRAFT_LOGITS, settings)
    counts = first_tokens(p, q, deterministic, seed=1234)
    assert fits(counts, p), counts


def test_chi_square_check_catches_a_biased_rule():
    # Emitting the draft's sample unchecked (the mlx-lm bug) must fail the same test.
    settings = SETTINGS[0]
    p, q = filtered(TARGET_LOGITS, settings), filtered(DRAFT_LOGITS, settings)
    rng = np.random.default_rng(0)
    counts: dict[int, int] = {}
    for _ in range(DRAWS):
        token = q.sample(rng)
        counts[token] = counts.get(token, 0) + 1
    assert not fits(counts, p)


def test_later_positions_and_bonus_follow_their_rows():
    # Three drafts from q, distinct target rows per position: each emitted position i
    # (reached when all earlier drafts were accepted) must follow p_i.
    settings = SETTINGS[2]
    rows = [filtered(np.roll(TARGET_LOGITS, shift), settings) for shift in range(4)]
    q = filtered(DRAFT_LOGITS, settings)
    rng = np.random.default_rng(7)
    per_position: list[dict[int, int]] = [{} for _ in range(4)]
    for _ in range(DRAWS):
        draft = [q.sample(rng) for _ in range(3)]
        accepted, nxt = verify(draft, [q, q, q], lambda i: rows[i], rng)
        emitted = draft[:accepted] + [nxt]
        for i, token in enumerate(emitted):
            per_position[i][token] = per_position[i].get(token, 0) + 1
    for i, counts in enumerate(per_position):
        assert sum(counts.values()) > 1000
        assert fits(counts, rows[i]), (i, counts)


def test_filter_chain_matches_llama_cpp_order():
    logits = np.log(np.array([0.5, 0.2, 0.15, 0.1, 0.05]))
    # top-p on the temperature-1 distribution keeps the prefix reaching 0.8: 3 tokens.
    dist = filtered(logits, SamplerSettings(temperature=2.0, top_k=0, top_p=0.8, min_p=0.0))
    assert dist.ids.tolist() == [0, 1, 2]
    # temperature applies after the cut: survivors' probabilities ~ p^(1/T).
    expected = np.array([0.5, 0.2, 0.15]) ** 0.5
    assert np.allclose(dist.probs, expected / expected.sum())
    # min-p keeps p >= 0.3 * 0.5.
    assert filtered(logits, SamplerSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.3)).ids.tolist() == [0, 1, 2]
    assert filtered(logits, SamplerSettings(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0)).ids.tolist() == [0, 1]
    assert filtered(logits, SamplerSettings(temperature=0.0)).ids.tolist() == [0]


def test_greedy_verification_keeps_drafts_while_they_equal_argmax():
    rows = [Distribution.point(t) for t in (5, 6, 9, 1)]
    rng = np.random.default_rng(0)
    assert verify([5, 6, 7], None, lambda i: rows[i], rng) == (2, 9)
    assert verify([5, 6, 9], None, lambda i: rows[i], rng) == (3, 1)  # bonus
    assert verify([4], None, lambda i: rows[i], rng) == (0, 5)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -1},
        {"top_k": -2},
        {"top_p": 0},
        {"top_p": 1.5},
        {"min_p": 2},
        {"temperature": float("nan")},
        {"seed": -1},
        {"repeat_penalty": 0},
        {"frequency_penalty": 2.5},
        {"presence_penalty": -3},
        {"repeat_last_n": -1},
        {"logit_bias": {-1: 1.0}},
        {"logit_bias": {"5": 1.0}},
        {"logit_bias": {5: 101.0}},
        {"logit_bias": {5: float("inf")}},
        {"logit_bias": {5: float("nan")}},
        {"logit_bias": {5: "1"}},
        {"ignore_eos": 1},
    ],
)
def test_bad_sampler_settings_name_the_value(kwargs):
    with pytest.raises(SpecrunError, match="but is"):
        SamplerSettings(**kwargs)


def test_top_k_band_selection_matches_a_full_sort():
    rng = np.random.default_rng(3)
    for case in range(300):
        logits = (rng.standard_normal(1000) * rng.uniform(0.05, 50)).astype(np.float32)
        if case % 3 == 0:
            logits[rng.integers(0, 1000, 980)] = -np.inf  # fewer finite logits than k, sometimes
        k = int(rng.integers(1, 60))
        ids = top_k_ids(logits, k)
        assert len(set(ids.tolist())) == k
        assert np.array_equal(np.sort(logits[ids]), np.sort(logits)[-k:])


def test_greedy_verify_answers_as_verify_does_at_temperature_0():
    rng = np.random.default_rng(7)
    greedy = SamplerSettings(temperature=0)
    for _ in range(200):
        logits = rng.normal(size=(5, 30)).astype(np.float32)
        best = logits.argmax(axis=1).tolist()
        draft = [t if rng.random() < 0.7 else (t + 1) % 30 for t in best[:4]]

        rows = [filtered(row, greedy) for row in logits]
        assert greedy_verify(draft, logits) == verify(draft, None, rows.__getitem__, rng)
    assert greedy_verify([], logits[:1]) == (0, best[0])


def llama_cpp_adjusted(row: np.ndarray, text: list[int], settings: SamplerSettings) -> np.ndarray:
    """The row after llama.cpp's own logit bias and penalties samplers, in its chain's order, the
    penalties having accepted `text` token by token."""
    L = llama()
    bias = (L.llama_logit_bias * len(settings.logit_bias))(*[L.llama_logit_bias(t, b) for t, b in settings.logit_bias.items()])
    samplers = [
        L.llama_sampler_init_logit_bias(row.size, len(settings.logit_bias), bias),
        L.llama_sampler_init_penalties(
            row.size, settings.repeat_last_n, settings.repeat_penalty, settings.frequency_penalty, settings.presence_penalty
        ),
    ]
    try:
        for token in text:
            L.llama_sampler_accept(samplers[1], token)
        data = (L.llama_token_data * row.size)(*[L.llama_token_data(i, float(v), 0.0) for i, v in enumerate(row)])
        array = L.llama_token_data_array(data=data, size=row.size, selected=-1, sorted=False)
        for sampler in samplers:
            L.llama_sampler_apply(sampler, ctypes.byref(array))
        out = np.empty(row.size, dtype=np.float32)
        for item in data:
            out[item.id] = item.logit
        return out
    finally:
        for sampler in samplers:
            L.llama_sampler_free(sampler)


@pytest.mark.parametrize("last_n", [64, 5, 1000])
def test_bias_and_penalties_give_llama_cpps_logits_bit_for_bit(last_n):
    rng = np.random.default_rng(11)
    for case in range(60):
        biased = rng.choice(40, int(rng.integers(0, 6)), replace=False).tolist() if case % 4 else []
        settings = SamplerSettings(
            repeat_penalty=float(rng.choice([1.0, 1.1, 1.5, 0.8])),
            frequency_penalty=float(rng.uniform(-2, 2)) if case % 2 else 0.0,
            presence_penalty=float(rng.uniform(-2, 2)) if case % 3 else 0.0,
            repeat_last_n=last_n,
            logit_bias={token: float(rng.choice([rng.uniform(-100, 100), -np.inf])) for token in biased},
        )
        row = (rng.standard_normal(40) * 3).astype(np.float32)
        text = rng.integers(0, 40, int(rng.integers(1, 120))).tolist()
        split = int(rng.integers(0, len(text) + 1))  # a row's window: the text, then draft tokens before it
        adjustments = Adjustments.of(settings)
        ours = adjustments.adjusted(row, text[:split], text[split:]) if adjustments else row
        assert np.array_equal(ours, llama_cpp_adjusted(row, text, settings)), (case, settings)


def test_penalties_pass_over_tokens_a_smaller_vocabulary_lacks():
    penalties = Penalties.of(SamplerSettings(presence_penalty=1.0))
    row = np.zeros(4, dtype=np.float32)
    assert penalties.penalized(row, [1, 7, 1]).tolist() == [0.0, -1.0, 0.0, 0.0]


def test_a_row_in_another_vocabulary_is_penalized_but_not_biased():
    adjustments = Adjustments.of(SamplerSettings(presence_penalty=1.0, logit_bias={2: 5.0, 9: -np.inf}))
    row = np.zeros(4, dtype=np.float32)
    assert adjustments.adjusted(row, [1]).tolist() == [0.0, -1.0, 5.0, 0.0]  # 9: past a smaller vocabulary's end
    assert adjustments.adjusted(row, [1], bias=False).tolist() == [0.0, -1.0, 0.0, 0.0]
    assert row.tolist() == [0.0] * 4


def test_penalties_that_change_nothing_are_skipped():
    assert Penalties.of(SamplerSettings()) is None
    assert Penalties.of(SamplerSettings(repeat_penalty=1.3, repeat_last_n=0)) is None
    assert Penalties.of(SamplerSettings(presence_penalty=0.5)) is not None
    assert Adjustments.of(SamplerSettings(repeat_penalty=1.3, repeat_last_n=0)) is None
    assert Adjustments.of(SamplerSettings(logit_bias={3: 0.5})).penalties is None


def test_log_probs_are_the_rows_log_softmax_with_the_likeliest_first():
    row = np.array([1.0, 3.0, -np.inf, 2.0, 3.0], dtype=np.float32)
    with np.errstate(divide="ignore"):
        exact = np.log(np.exp(row.astype(np.float64)) / np.exp(row.astype(np.float64)).sum())
    scored = log_probs(row, 3, 3)
    assert scored.logprob == pytest.approx(exact[3], abs=1e-6)
    assert [token for token, _ in scored.top] == [1, 4, 3]  # a tie keeps the lower id first
    assert [lp for _, lp in scored.top] == pytest.approx(exact[[1, 4, 3]].tolist(), abs=1e-6)
    assert log_probs(row, 2, 0) == (-np.inf, ())


def llama_cpp_draws(logits: np.ndarray, settings: SamplerSettings, draws: int, seed: int = 5) -> dict[int, int]:
    """Tokens llama.cpp's own chain (top-k, top-p, min-p, XTC, temperature, dist) draws from `logits`."""
    L = llama()
    chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    for sampler in (
        L.llama_sampler_init_top_k(settings.top_k),
        L.llama_sampler_init_top_p(settings.top_p, 0),
        L.llama_sampler_init_min_p(settings.min_p, 0),
        L.llama_sampler_init_xtc(settings.xtc_probability, settings.xtc_threshold, 0, seed),
        L.llama_sampler_init_temp(settings.temperature),
        L.llama_sampler_init_dist(seed + 1),
    ):
        L.llama_sampler_chain_add(chain, sampler)  # the chain owns it
    counts: dict[int, int] = {}
    try:
        for _ in range(draws):
            data = (L.llama_token_data * logits.size)(*[L.llama_token_data(i, float(v), 0.0) for i, v in enumerate(logits)])
            array = L.llama_token_data_array(data=data, size=logits.size, selected=-1, sorted=False)
            L.llama_sampler_apply(chain, ctypes.byref(array))
            token = array.data[array.selected].id  # XTC moves `data` past what it drops
            counts[token] = counts.get(token, 0) + 1
    finally:
        L.llama_sampler_free(chain)
    return counts


@pytest.mark.parametrize(
    "settings",
    [
        SamplerSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, xtc_probability=0.5, xtc_threshold=0.1),
        SamplerSettings(temperature=0.7, top_k=6, xtc_probability=0.3, xtc_threshold=0.05),
        SamplerSettings(temperature=0.0, xtc_probability=0.4, xtc_threshold=0.1),  # greedy: two points
    ],
    ids=["unfiltered", "filtered", "greedy"],
)
def test_xtc_is_the_mixture_llama_cpps_chain_draws_from(settings):
    dist = filtered(TARGET_LOGITS, settings)
    assert dist.probs.sum() == pytest.approx(1.0)
    assert dist.prob(0) < filtered(TARGET_LOGITS, replace(settings, xtc_probability=0.0)).prob(0)  # it drops the top
    assert fits(llama_cpp_draws(TARGET_LOGITS, settings, 20_000), dist)


def test_xtc_changes_nothing_where_fewer_than_two_tokens_reach_the_threshold():
    settings = SamplerSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, xtc_probability=1.0, xtc_threshold=0.5)
    assert (
        filtered(TARGET_LOGITS, settings).probs.tolist()
        == filtered(TARGET_LOGITS, replace(settings, xtc_probability=0)).probs.tolist()
    )
    assert not SamplerSettings(xtc_probability=0.5, xtc_threshold=0.6).xtc


def llama_cpp_survivors(logits: np.ndarray, settings: SamplerSettings) -> set[int]:
    """The tokens llama.cpp's own filters (top-n-sigma, top-k, typical, top-p, min-p) leave."""
    L = llama()
    samplers = [
        L.llama_sampler_init_top_n_sigma(settings.top_n_sigma),
        L.llama_sampler_init_top_k(settings.top_k),
        L.llama_sampler_init_typical(settings.typical_p, 0),
        L.llama_sampler_init_top_p(settings.top_p, 0),
        L.llama_sampler_init_min_p(settings.min_p, 0),
    ]
    try:
        data = (L.llama_token_data * logits.size)(*[L.llama_token_data(i, float(v), 0.0) for i, v in enumerate(logits)])
        array = L.llama_token_data_array(data=data, size=logits.size, selected=-1, sorted=False)
        for sampler in samplers:
            L.llama_sampler_apply(sampler, ctypes.byref(array))
        return {array.data[i].id for i in range(array.size) if array.data[i].logit != -np.inf}
    finally:
        for sampler in samplers:
            L.llama_sampler_free(sampler)


def test_top_n_sigma_and_typical_keep_what_llama_cpps_own_filters_keep():
    """Each with the other filters; not both at once: llama.cpp's typical then takes the tokens
    top-n-sigma masked (probability 0) into its entropy, which comes out NaN."""
    rng = np.random.default_rng(13)
    for case in range(200):
        sigma = case % 2 == 0
        settings = SamplerSettings(
            temperature=1.0,
            top_n_sigma=float(rng.choice([0.5, 1.0, 2.0])) if sigma else -1.0,
            top_k=int(rng.choice([0, 5, 40])),
            typical_p=1.0 if sigma else float(rng.choice([0.2, 0.6, 0.95])),
            top_p=float(rng.choice([1.0, 0.9])),
            min_p=float(rng.choice([0.0, 0.05])),
        )
        logits = (rng.standard_normal(60) * rng.uniform(0.5, 4)).astype(np.float32)
        assert set(filtered(logits, settings).ids.tolist()) == llama_cpp_survivors(logits, settings), (case, settings)


def test_dynamic_temperature_gives_llama_cpps_probabilities():
    L = llama()
    rng = np.random.default_rng(17)
    for case in range(100):
        settings = SamplerSettings(
            temperature=float(rng.choice([0.0, 0.5, 1.0])),
            dynatemp_range=float(rng.choice([0.3, 1.0])),
            dynatemp_exponent=float(rng.choice([0.5, 1.0, 2.0])),
            top_k=int(rng.choice([0, 8])),
        )
        logits = (rng.standard_normal(30) * rng.uniform(0.3, 3)).astype(np.float32)
        samplers = [
            L.llama_sampler_init_top_k(settings.top_k),
            L.llama_sampler_init_top_p(settings.top_p, 0),
            L.llama_sampler_init_min_p(settings.min_p, 0),
            L.llama_sampler_init_temp_ext(settings.temperature, settings.dynatemp_range, settings.dynatemp_exponent),
        ]
        data = (L.llama_token_data * logits.size)(*[L.llama_token_data(i, float(v), 0.0) for i, v in enumerate(logits)])
        array = L.llama_token_data_array(data=data, size=logits.size, selected=-1, sorted=False)
        for sampler in samplers:
            L.llama_sampler_apply(sampler, ctypes.byref(array))
            L.llama_sampler_free(sampler)
        theirs = {array.data[i].id: array.data[i].p for i in range(array.size) if array.data[i].p > 0}
        theirs = {token: p / sum(theirs.values()) for token, p in theirs.items()}  # one survivor keeps a stale p
        ours = filtered(logits, settings)
        assert dict(zip(ours.ids.tolist(), ours.probs.tolist())) == pytest.approx(theirs, abs=1e-5), (case, settings)
    assert not SamplerSettings(dynatemp_range=0.5).deterministic  # llama.cpp samples at temperature 0 with it
