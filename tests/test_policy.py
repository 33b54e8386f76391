"""Draft-length policies: the cost model's choices, the plain fallback, and exactness with auto."""

import pytest
from reference import CONFIDENT_ATOL
from test_engine import PROMPT, assert_greedy_exact

from specrun.config import SessionConfig
from specrun.core.auto import AutoK, SourceTrack, rows_to_verify
from specrun.core.costs import measure_verify_costs, time_decodes
from specrun.core.events import TokenEvent
from specrun.core.policy import PRIOR, Budget, FixedK, PMinPolicy, StepRecord
from specrun.errors import SpecrunError
from specrun.session import Session
from specrun.settings import parse_k

FLAT = [0.0] + [0.010] * 18  # a GPU-like target: verifying 17 rows costs what 1 does
STEEP = [0.0] + [0.010 * w for w in range(1, 19)]  # every row costs a full decode


def step(budget, drafted, accepted, confidences=None, draft_s=0.0, verify_s=0.0, catch_up_s=0.0):
    """The record of a step offered `budget`: its draft verified, or plain where the policy declined."""
    granted = budget.k > 0
    return StepRecord(
        budget if granted else None, () if granted else (budget,), drafted, accepted, confidences, draft_s, verify_s, catch_up_s
    )


def learn(policy, source, drafted, accepted, times=30, draft_s=0.0, verify_s=None, confidences=None):
    """Report `times` identical steps of `drafted` tokens, whatever k was offered; the verify time
    defaults to what the policy expects."""
    for _ in range(times):
        budget = policy.offer(source, 16)
        seconds = policy.costs[drafted + 1] if verify_s is None else verify_s
        policy.observe(StepRecord(budget, (), drafted, accepted, confidences, draft_s, seconds))


def granted(policy, source, steps, record, limit=16, prior=PRIOR):
    """Run `steps` steps of `source`, each reported as `record(budget)`: the k each was granted."""
    ks = []
    for _ in range(steps):
        budget = policy.offer(source, limit, prior)
        ks.append(budget.k)
        policy.observe(record(budget))
    return ks


def test_flat_costs_and_high_acceptance_draft_long():
    policy = AutoK(FLAT)
    learn(policy, "lookup", 16, 16)
    assert policy.offer("lookup", 16).k == 16
    assert policy.offer("lookup", 5).k == 5  # never past the step's limit


def test_steep_costs_never_pay_so_k_is_zero():
    policy = AutoK(STEEP)
    learn(policy, "lookup", 4, 2, verify_s=0.05)
    assert policy.best_k(policy.sources["lookup"], 16) == 0


def test_low_acceptance_shortens_the_draft():
    costs = [0.0] + [0.010 + 0.002 * w for w in range(1, 19)]
    policy = AutoK(costs)
    # The first guess is always right, the second always wrong.
    caps = granted(policy, "lookup", 60, lambda b: step(b, b.k, min(b.k, 1), None, 0.0, costs[b.k + 1]))
    assert caps[0] >= 3  # the prior expects 70% acceptance
    # Mostly one token; as the second position's misses age, it is tried again now and then.
    assert max(caps[-20:]) <= 2 and caps[-20:].count(1) >= 10


def test_slow_source_falls_back_to_plain_and_probes_with_backoff():
    policy = AutoK(FLAT)
    # Each step drafts 4 tokens at 50 ms and gets 1 token: far below plain's 100 tok/s.
    learn(policy, "draft", 4, 0, times=10, draft_s=0.050)
    # Probes that cost little more than a plain step: spaced by the backed-off interval alone.
    caps = granted(policy, "draft", 40, lambda b: step(b, 2 if b.k else 0, 0, None, 0.001 if b.k else 0.0, 0.010))
    probes = [i for i, cap in enumerate(caps) if cap]
    assert len(probes) >= 2 and caps.count(0) > 30
    assert probes[1] - probes[0] > probes[0]  # the interval doubles while probes fail


def test_a_costly_probe_waits_until_probes_would_take_a_hundredth_of_the_time():
    policy = AutoK(FLAT)
    learn(policy, "draft", 4, 0, times=10, draft_s=0.050)
    # Each probe's draft first catches its cache up (200 ms) and then keeps no token.
    caps = granted(policy, "draft", 2100, lambda b: step(b, 0, 0, None, 0.2 if b.k else 0.0, 0.010, 0.2 if b.k else 0.0))
    probes = [i for i, cap in enumerate(caps) if cap]
    # 200 ms lost against 10 ms plain steps: at most 1% of the time is 2,000 steps apart.
    assert len(probes) == 2 and 2000 <= probes[1] - probes[0] <= 2002


def test_a_useful_probe_brings_speculation_back_at_once():
    policy = AutoK(FLAT)
    learn(policy, "draft", 4, 0, times=10, draft_s=0.050)  # slow and useless: plain from now on
    # The text turns predictable and the draft cheap.
    caps = granted(policy, "draft", 40, lambda b: step(b, b.k, b.k, None, 0.0001 * b.k, 0.010))
    probe = next(i for i, cap in enumerate(caps) if cap)
    assert caps[probe] == 1  # with drafting at 12.5 ms a token, the shortest probe costs least per token
    assert all(cap > 1 for cap in caps[probe + 1 :])


# Widths 1..17 as measured on a 2-core AVX2 CPU: odd widths cost more than the even one above.
CPU = [0.0] + [x / 1000 for x in (25, 58, 97, 65, 94, 66, 108, 86, 123, 104, 137, 116, 150, 133, 167, 145, 186)]


def test_a_probe_drafts_the_cheapest_width_per_token():
    new, slow_draft = SourceTrack(), SourceTrack(draft_token_s=0.100)
    assert AutoK(FLAT).probe_k(new, 16) == 4
    assert AutoK(CPU).probe_k(new, 16) == 3  # 4 rows cost 65 ms, 3 rows 97
    assert AutoK(CPU).probe_k(new, 2) == 1
    assert AutoK(CPU).probe_k(slow_draft, 16) == 1  # 2 tokens for 158 ms beat 4 for 365


@pytest.mark.parametrize("acceptance", [0.3, 0.6, 0.9, 0.95, 0.99])
@pytest.mark.parametrize("draft_token_s", [0.0, 0.0002])
def test_the_search_for_k_on_a_batch_wide_table_picks_what_weighing_every_length_would(acceptance, draft_token_s):
    """Where 512 rows verify for about four one-row decodes (a GPU), the search stops at positions a
    draft is unlikely to reach, and still picks the k that weighing every length picks."""
    costs = [0.0] + [0.0017 + 0.00001 * width for width in range(1, 513)]
    track = SourceTrack(hits=[acceptance * 8] * 3, tries=[8.0] * 3, draft_token_s=draft_token_s, prior=acceptance)
    rates, expected, alive = [1 / costs[1]], 1.0, 1.0
    for k, chance in enumerate(track.acceptances(510), start=1):
        alive *= chance
        expected += alive
        rates.append(expected / (costs[k + 1] + k * draft_token_s))
    assert AutoK(costs).best_k(track, 510) == rates.index(max(rates))


def test_a_block_drafter_pays_one_decode_a_step_whatever_it_drafts():
    """A block drafter (DFlash) decodes its whole draft at once: auto learns that decode's seconds
    as the step's, not per token, so it grants it a longer draft than a drafter that pays as much
    per token, and keeps each token of the block for what verifying it costs alone."""
    policy = AutoK(FLAT)
    block = policy.offer("dflash", 16, block=True)
    policy.observe(step(block, block.k, block.k, None, draft_s=0.002, verify_s=0.010))
    track = policy.sources["dflash"]
    assert track.block and track.block_s == pytest.approx(0.002) and track.draft_token_s == 0
    acceptance = dict(hits=[6.0] * 3, tries=[8.0] * 3, prior=0.75)
    by_block, by_token = SourceTrack(block=True, block_s=0.002, **acceptance), SourceTrack(draft_token_s=0.002, **acceptance)
    assert policy.best_k(by_block, 16) > policy.best_k(by_token, 16) >= 1
    budget = policy.offer("dflash", 16, block=True)
    kept = policy.extend(budget, 0.99)
    assert kept is not None and policy.extend(kept, 0.99) is not None  # the decode is paid: only verifying counts


def test_a_first_draft_that_caught_up_a_whole_prompt_is_charged_like_a_probe():
    policy = AutoK(FLAT)
    first = policy.offer("draft", 16)
    assert first.k > 0  # unmeasured: drafts on the prior
    policy.observe(step(first, 4, 0, None, 0.208, 0.010, catch_up_s=0.2))  # fed the prompt first (200 ms)
    assert policy.sources["draft"].draft_token_s == pytest.approx(0.002)  # drafting, without the catch-up
    second = policy.offer("draft", 16)
    assert second.k > 0
    policy.observe(step(second, 2, 0, None, 0.004, 0.011))  # measured slow: plain from here
    assert not any(granted(policy, "draft", 1990, lambda b: step(b, 0, 0, None, 0.0, 0.010)))


def test_a_model_draft_whose_every_guess_is_dropped_is_set_aside_for_what_its_decodes_cost():
    """Each step the model decodes (10 ms) to guess a first token that `keep` then finds too
    unsure to verify: nothing is drafted, but the decode cost the step's time all the same."""
    policy = AutoK(FLAT)
    caps = granted(policy, "draft", 40, lambda b: step(b, 0, 0, None, 0.010 if b.k else 0.0, 0.010))
    assert caps[0] and sum(1 for cap in caps if cap) <= 3  # tried, then plain with a probe now and then


def test_an_unmeasured_source_is_probed_once_before_plain():
    policy = AutoK(CPU)
    # A prior of 0.4 makes plain look faster, but nothing of this source was measured yet.
    probe = policy.offer("lookup", 16, prior=0.4)
    assert probe.k == 3
    policy.observe(step(probe, 3, 0, None, 0.0, CPU[4]))
    assert granted(policy, "lookup", 10, lambda b: step(b, 0, 0, None, 0.0, CPU[1]), prior=0.4) == [0] * 10


def test_confidence_stop_learns_which_confidences_pay():
    policy = AutoK([0.0] + [0.010 + 0.004 * w for w in range(1, 19)])
    policy.observe(step(policy.offer("draft", 16), 1, 1, [0.95], 0.001, 0.014))
    # Tokens drafted at 0.3 confidence were never accepted; at 0.95 always.
    for _ in range(200):
        policy.observe(StepRecord(Budget("draft", 2), (), 2, 1, [0.95, 0.3], 0.002, 0.018))
    first = policy.extend(policy.offer("draft", 16), 0.95)
    assert first is not None and first.kept == 1
    assert policy.extend(first, 0.3) is None


def test_a_steps_budget_is_a_value_another_step_cannot_disturb():
    policy = AutoK([0.0] + [0.010 + 0.001 * w for w in range(1, 19)])
    budget = policy.offer("draft", 16)
    kept = policy.extend(budget, 0.9)
    policy.observe(step(policy.offer("store", 16), 3, 3, None, 0.0, 0.013))  # another source's step in between
    assert policy.extend(kept, 0.9) == policy.extend(policy.extend(budget, 0.9), 0.9)  # the same budget, the same answer
    assert kept.gain > budget.gain and kept.alive < budget.alive


def test_llama_cpp_rule_stops_below_p_min():
    policy = PMinPolicy()
    budget = policy.offer("draft", 40)
    assert budget.k == 16
    third = Budget("draft", 16, kept=3)
    assert policy.extend(third, 0.75) == third and policy.extend(third, 0.74) is None


@pytest.mark.parametrize("text, value", [("4", 4), ("auto", "auto"), ("llama.cpp", "llama.cpp")])
def test_parse_k(text, value):
    assert parse_k(text) == value


@pytest.mark.parametrize("text", ["0", "-3", "fast", "2.5"])
def test_parse_k_rejects_with_the_value(text):
    with pytest.raises(SpecrunError, match=f"but is '{text}'"):
        parse_k(text)
    if text.lstrip("-").isdigit():
        with pytest.raises(SpecrunError):
            FixedK(int(text))


@pytest.mark.parametrize("drafting", ["draft", "lookup", "hybrid"])
@pytest.mark.parametrize("k", ["auto", "llama.cpp"])
def test_policies_keep_greedy_output_exact(tiny, drafting, k, monkeypatch):
    """On a confident model (the top token usually over 75%), so llama.cpp's p-min rule drafts too.

    The prompt repeats the model's own text, so prompt lookup has copies the model follows.
    Auto sees a target whose decodes cost a second at any width, as a big model verifying on a
    GPU looks beside its small draft: drafting pays whatever this machine's real costs (here
    the draft is the target itself, which a one-row decode's measured cost would rightly bench
    after its first probe, or before it where two rows measured twice one). The draft reads the
    whole prompt under auto too: a tiny model's batch is hardly cheaper per token than one
    token, so its catch-up window would be the least one, without the copy 90 tokens back.
    """
    monkeypatch.setattr("specrun.drafts.drafting_loop.MIN_WINDOW", 256)
    monkeypatch.setattr("specrun.core.costs.time_decodes", lambda context, widths, repeats: dict.fromkeys(widths, 1.0))
    config = SessionConfig(
        target=tiny["confident"],
        draft=tiny["confident"] if drafting != "lookup" else None,
        lookup=drafting != "draft",
        k=k,
        n_ctx=256,
    )
    with Session(config) as session:
        session.policies.verify_costs()  # measured before the logits recorder is attached
        own = session.target_model.detokenize(
            [e.token for e in session.stream(PROMPT, 40, plain=True) if isinstance(e, TokenEvent)]
        )
        prompt = PROMPT + own + PROMPT + own[: len(own) // 4]
        tokens, sources, stats = assert_greedy_exact(session, prompt, max_tokens=48, atol=CONFIDENT_ATOL)
    assert len(tokens) == 48
    assert stats.drafted > 0 and stats.accepted > 0


class FakeTarget:
    """A context whose decode of w rows costs `cost(w)` seconds, without a model."""

    def __init__(self, cost, n_batch=512, free_slots=4096):
        self.cost, self.n_batch, self.free_slots = cost, n_batch, free_slots


@pytest.fixture
def fake_timing(monkeypatch):
    timed = []

    def time_decodes(context, widths, repeats):
        timed.extend(widths)
        return {width: context.cost(width) for width in widths}

    monkeypatch.setattr("specrun.core.costs.time_decodes", time_decodes)
    return timed


@pytest.mark.parametrize(
    "cost, widest",
    [
        (lambda w: 0.010 + 0.0001 * w, 512),  # GPU-like: a row costs little, drafts may fill the batch
        (lambda w: 0.010 + 0.004 * w, 128),  # a row gets 2% cheaper from 64 to 128 rows: kept, then stop
        (lambda w: 0.010 + 0.004 * w + 0.00002 * w * w, 64),  # rows cost more past 64: never wider
    ],
)
def test_the_widest_verify_width_follows_the_cost_curve(fake_timing, cost, widest):
    costs = measure_verify_costs(FakeTarget(cost))
    assert len(costs) == widest + 1
    assert fake_timing[:21] == [*range(1, 18), 24, 32, 48, 64]  # every width to 17, then a few
    assert costs[40] == pytest.approx((cost(32) + cost(48)) / 2)  # interpolated between timed widths
    assert AutoK(costs).max_k == widest - 1


class RecordingContext:
    """Records each decode's width and logits rows; the cache grows and shrinks as a real one."""

    def __init__(self):
        self.tokens, self.free_slots, self.decodes = [7], 100, []
        self.model = type("Model", (), {"bos": 2})()

    def eval(self, tokens, logits_rows):
        self.decodes.append((len(tokens), logits_rows))
        self.tokens += tokens

    def truncate(self, n_keep):
        del self.tokens[n_keep:]


@pytest.mark.parametrize("every_row, rows", [(True, [4, 9]), (False, [1, 1])])
def test_timed_decodes_ask_logits_for_every_row_or_the_last(every_row, rows):
    context = RecordingContext()
    assert set(time_decodes(context, [4, 9], repeats=1, every_row=every_row)) == {4, 9}
    assert context.decodes[1:] == list(zip([4, 9], rows))  # after the one-row warm-up
    assert context.tokens == [7]  # the cache is left as it was


def test_a_small_batch_or_context_caps_the_widths(fake_timing):
    assert len(measure_verify_costs(FakeTarget(lambda w: 0.01, n_batch=32))) == 33
    assert len(measure_verify_costs(FakeTarget(lambda w: 0.01, free_slots=21))) == 18


def test_a_long_copy_accepted_in_full_earns_a_long_draft_and_a_rejection_shortens_it():
    costs = [0.0] + [0.010 + 0.004 * w for w in range(1, 129)]  # this CPU's shape: 14 ms at 1, 4.1 a row at 64
    policy = AutoK(costs)
    # Every copied token accepted.
    caps = granted(policy, "lookup-copy", 12, lambda b: step(b, b.k, b.k, None, 0.0, costs[b.k + 1]), 127, 0.97)
    assert caps[0] < 64 and caps[-1] >= 64
    # Now every copy breaks after 8 tokens.
    granted(policy, "lookup-copy", 12, lambda b: step(b, b.k, min(b.k, 8), None, 0.0, costs[b.k + 1]), 127, 0.97)
    assert policy.offer("lookup-copy", 127, prior=0.97).k <= 16


def test_one_old_rejection_deep_in_a_copy_does_not_cap_later_drafts_below_it():
    costs = [0.0] + [0.010 + 0.004 * w for w in range(1, 129)]
    policy = AutoK(costs)
    copy = policy.offer("lookup-copy", 127, prior=0.99)
    policy.observe(StepRecord(copy, (), 63, 17, None, 0.0, costs[64]))  # one copy broke at its 18th token
    # Then every copy goes through: shorter drafts must be able to grow past 18 again.
    caps = granted(policy, "lookup-copy", 30, lambda b: step(b, b.k, b.k, None, 0.0, costs[b.k + 1]), 127, 0.99)
    assert caps[0] <= 24 and caps[-1] >= 64


def test_a_free_source_is_not_benched_by_one_long_copy_that_broke_early():
    costs = [0.0] + [0.010 + 0.004 * w for w in range(1, 129)]
    policy = AutoK(costs)
    for drafted, accepted in ((26, 3), (3, 3)):  # a long copy broke at its 4th token, then a short one held
        copy = policy.offer("lookup-copy", 127, prior=0.99)
        policy.observe(StepRecord(copy, (), drafted, accepted, None, 1e-5, costs[drafted + 1]))
    assert policy.sources["lookup-copy"].rate < policy.plain_rate  # its steps so far were slower than plain
    assert policy.offer("lookup-copy", 127, prior=0.99).k >= 2  # but short drafts still pay: keep drafting


# Widths 1..16 of Gemma 3 270M on 2 cores of an AVX-512 Xeon: its output head computes rows four at a time.
FOURS = [0.0] + [
    x / 1000 for x in (27.6, 29.3, 35.8, 38.4, 55.3, 59.3, 64.3, 58.5, 74.1, 79.7, 81.7, 66.6, 84.0, 90.4, 94.1, 78.4)
]


def test_a_batch_verifies_its_likeliest_draft_rows_at_the_width_that_pays_best():
    # Four streams' last tokens, and three of them drafted: the four likeliest rows fill width 8.
    assert rows_to_verify(FOURS, 4, [(0.9, 0.8, 0.7), (0.6, 0.4), (0.5,), ()]) == [3, 1, 0, 0]
    assert rows_to_verify(FOURS, 4, [(0.3,), (0.2, 0.1), (), ()]) == [0, 0, 0, 0]  # no row pays past width 4
    assert rows_to_verify(FOURS, 1, [(0.9, 0.8, 0.7, 0.6)]) == [3]  # alone: widths 2 to 4 cost little more than 1, 5 much more
    assert rows_to_verify(FLAT, 4, [(0.9,) * 8, (0.2,) * 8]) == [8, 6]  # as wide as the curve goes, where rows are free
    assert rows_to_verify(FOURS, 17, [(0.9, 0.9)]) == [2]  # wider than the curve: verified as asked


def test_a_draft_rows_chances_fall_along_it():
    policy = AutoK(FOURS)
    learn(policy, "lookup", 2, 1)  # the first guess always right, the second always wrong
    chances = policy.chances(policy.offer("lookup", 3), 3, None)
    assert chances[0] > 0.8 and chances[1] < 0.2 * chances[0] and chances[2] <= chances[1]
    sure, unsure = policy.chances(Budget("draft", 2), 2, [0.99, 0.2])
    assert sure > 0.9 and unsure < 0.3 * sure  # from the drafter's own confidence, as `extend` judges a token
    assert FixedK(4).chances(Budget("lookup", 4), 4, None) == ()  # a fixed k is verified whole


def test_other_streams_rows_size_a_model_draft_but_not_a_free_copy():
    policy = AutoK(FOURS)
    learn(policy, "lookup", 3, 1)  # the first guess always right, the second always wrong
    learn(policy, "draft", 3, 1, draft_s=0.003)  # 1 ms a token: drafting costs time
    assert policy.offer("lookup", 8, rows=3).k == policy.offer("lookup", 8).k > 0  # the batch cuts a copy
    assert policy.offer("draft", 8, rows=3).k == 0 < policy.offer("draft", 8).k


def test_a_decode_that_held_a_prompts_rows_teaches_nothing_of_verify_costs():
    policy = AutoK(FOURS)
    budget = policy.offer("lookup", 3)
    policy.observe(StepRecord(budget, (), 3, 1, None, 0.0, 0.2, rows=None))
    assert policy.costs == FOURS
    policy.observe(StepRecord(budget, (), 3, 1, None, 0.0, 0.2, rows=8))
    assert policy.costs[8] > FOURS[8]
