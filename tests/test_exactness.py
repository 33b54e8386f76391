"""End to end at temperature > 0: speculative output follows the target's own distribution,
at every row a step verifies.

A step that drafts k tokens verifies k + 1 rows; row i follows the first i drafted tokens, which
it keeps only while the target agrees. The rows after accepted drafted tokens are where most can
go wrong: the penalties' window takes in the drafted tokens, XTC draws again, dynamic temperature
reads the row's own entropy. So each generation here runs five tokens, the prefill's and then a
step that drafts three, and every token at every row is checked: grouped by the tokens before it,
each group's counts against the distribution a fresh context (no drafting, no rollback) and the
sampler's chain give for that very history (chi-square, the groups' statistics and degrees added).
Each test counts how deep the step that drafted reached (`Runs.depths`, shown when it fails) and
holds it to it: row 2 is sampled in at least a third of the seeds under every drafter
and rule, row 3 (the bonus token after three kept drafts) in at least a fifth. Deliberate errors
at rows 1-3, one per rule, fail the same check.

Rules: the p/q rule where the drafter samples (a draft model, a translated draft in token mode);
sample-and-match where it guesses (prompt lookup, lookup + a greedy draft model, text translated
from a greedy draft), which also gives plain decoding's very tokens for each seed: one draw per
emitted token.

The rig decodes one row at a time inside each batch (n_ubatch 1), and so do the fresh contexts:
batched verification then gives bit for bit the logits of one-token decoding, so these tests see
the speculative rule, not floating-point luck (a logit moving by 0.001 moves a token across a
top-p cut; scripts/batched_exactness.py measures that). One test runs a plain Session as users
do, without filters, where such rounding cannot change the support.

The rig's target is a tiny model with peaked rows (logits of std 4.5), and the prompt is a text,
the target's greedy continuation of that text in this very prompt, and the text again: prompt
lookup then proposes what the target most likely writes (here two tokens in turn, so a drafted
token is likely again two rows on, where the penalties' window must hold it). The draft model is
the same weights a little sharper (logit std 5.4): the p/q rule keeps most of its drafts and
rejects some. Seeds: 1,000 a check; at that size every deliberate error failed at p < 1e-4 in
each run made while the rules were tuned. On Gemma 3 270M the draft is the target without
layer 16, run as users run it, so its samples are compared with plain decoding's.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np
import pytest
from reference import FreshContexts, chi_square_sf, chi_square_statistic, chi_square_two_sample_p
from tinymodels import write_tiny_llama

from specrun.backend import Context, ContextOptions, Model
from specrun.config import SessionConfig
from specrun.core.engine import Engine
from specrun.core.events import StepEvent, TokenEvent
from specrun.core.policy import FixedK
from specrun.core.sampling import Adjustments, Distribution, Sampler, SamplerSettings, filtered
from specrun.drafts.chain import Chain
from specrun.drafts.drafting_loop import Picker
from specrun.drafts.lookup import PromptLookup
from specrun.drafts.model import DraftModel
from specrun.drafts.translated import TranslatingDraft
from specrun.drafts.vocab_bridge import VocabBridge
from specrun.session import Session

SETTINGS = SamplerSettings(temperature=1.0)  # llama.cpp's default filters: top-k 40, top-p 0.95, min-p 0.05
UNFILTERED = SamplerSettings(temperature=0.7, top_k=0, top_p=1.0, min_p=0.0)
MIN_P = 1e-4  # a correct sampler fails a check this strict once in 10,000
K = 3  # each generation's step that drafts verifies rows 0-3
TOKENS = K + 2  # the prefill's token, then that step's
TEXT = "water be who was"
SEEDS = 1000
RULES = ("filters", "bias", "penalties", "xtc", "greedy-xtc", "typical", "top-n-sigma", "dynatemp")
DRAFTINGS = ("draft", "translated-tokens", "lookup", "lookup+greedy-draft", "translated")
GUESSING = ("lookup", "lookup+greedy-draft", "translated")  # sample-and-match: no draws of their own


@pytest.fixture(scope="module")
def first_layer_draft(tmp_path_factory):
    """The tiny target's first layer alone: its drafts are accepted part of the time."""
    return write_tiny_llama(tmp_path_factory.mktemp("exact") / "first-layer.gguf", seed=0, n_layer=1)


@pytest.fixture(scope="module")
def peaked(tmp_path_factory):
    """Paths: a target with peaked rows, the same a little sharper (a draft), and that draft under
    other token ids (drafts only translated)."""
    root = tmp_path_factory.mktemp("peaked")
    return {
        "target": write_tiny_llama(root / "target.gguf", seed=0, logit_std=4.5),
        "draft": write_tiny_llama(root / "draft.gguf", seed=0, logit_std=5.4),
        "other": write_tiny_llama(root / "other.gguf", vocab="different", seed=0, relabelled=True, logit_std=5.4),
    }


class Rig:
    """Target and draft contexts that decode batches one row at a time (n_ubatch 1); the other
    draft has other token ids, and drafts translated."""

    def __init__(self, target, draft, other):
        self.models = [Model(target), Model(draft, role="draft"), Model(other, role="draft")]
        options = ContextOptions(n_ctx=128, n_batch=8, n_ubatch=1, n_threads=1)
        self.target, self.draft, self.other = (Context(model, options) for model in self.models)
        self.bridge = VocabBridge(self.models[0], self.models[2])

    def engine(self, drafting: str, settings: SamplerSettings, seed: int) -> Engine:
        sample = drafting not in GUESSING  # the models' drafts sampled (the p/q rule), or their argmax guessed
        model = DraftModel(self.draft, sample=sample)
        drafter = {"plain": None, "lookup": PromptLookup(), "draft": model, "lookup+greedy-draft": Chain(PromptLookup(), model)}
        if drafting.startswith("translated"):
            self.other.truncate(0)  # a fresh drafter per generation: its cache starts empty
            mode = "tokens" if drafting == "translated-tokens" else "text"
            drafter[drafting] = TranslatingDraft(self.other, self.bridge, sample=sample, mode=mode)
        return Engine(self.target, drafter[drafting], Sampler.seeded(replace(settings, seed=seed)), FixedK(K))

    def close(self):
        for model in self.models:
            model.close()


@pytest.fixture(scope="module")
def rig(peaked):
    rig = Rig(peaked["target"], peaked["draft"], peaked["other"])
    yield rig
    rig.close()


def greedy(rig: Rig, prompt: list[int], n: int) -> list[int]:
    return [e.token for e in rig.engine("plain", SamplerSettings(), 0).stream(prompt, n) if isinstance(e, TokenEvent)]


@pytest.fixture(scope="module")
def prompt(rig) -> list[int]:
    """TEXT, then what the target writes after TEXT, its continuation and TEXT again (found by
    iterating to a fixed point), then TEXT again: prompt lookup proposes that continuation."""
    text = rig.models[0].tokenize(TEXT)
    continuation = greedy(rig, text, TOKENS + 1)
    for _ in range(10):
        again = greedy(rig, text + continuation + text[1:], TOKENS + 1)
        if again == continuation:
            return text + continuation + text[1:]  # no second start token
        continuation = again
    raise AssertionError("the tiny target's continuation found no fixed point: pick another TEXT")


@dataclass
class Runs:
    """One generation of TOKENS tokens per seed."""

    tokens: dict[int, tuple[int, ...]] = field(default_factory=dict)
    depths: Counter = field(default_factory=Counter)  # the last row sampled in the first step that drafted, per seed
    drafted: int = 0
    accepted: int = 0

    def reached(self, row: int) -> float:
        """The share of the seeds whose first drafting step sampled `row` (after `row` kept drafts)."""
        return sum(n for depth, n in self.depths.items() if depth >= row) / len(self.tokens)


def sample(make_generator: Callable[[int], Engine], prompt: list[int], seeds: range, n: int = TOKENS) -> Runs:
    runs = Runs()
    for seed in seeds:
        generator = make_generator(seed)
        events = list(generator.stream(prompt, n))
        runs.tokens[seed] = tuple(e.token for e in events if isinstance(e, TokenEvent))
        steps = [e for e in events if isinstance(e, StepEvent) and e.drafted]
        runs.depths[steps[0].accepted if steps else -1] += 1
        runs.drafted, runs.accepted = runs.drafted + generator.stats.drafted, runs.accepted + generator.stats.accepted
    return runs


def assert_deep_and_exact(session, exact: Exact, settings: SamplerSettings) -> None:
    """A trained drafter's or MTP head's sampled drafts over SEEDS seeds: kept part of the time,
    reaching rows 2 and 3 of the step that drafts in at least a third and a fifth of the seeds,
    and every row distributed as the target's for its history."""
    runs = sample(lambda seed: session.engine(sampler=replace(settings, seed=seed)), exact.prompt, range(SEEDS))
    assert 0.05 < runs.accepted / runs.drafted < 0.95, (runs.accepted, runs.drafted)
    assert runs.reached(2) >= 1 / 3 and runs.reached(3) >= 1 / 5, runs.depths
    assert exact.p_value(runs, settings) > MIN_P


class Exact:
    """The distribution of each token after a prompt and the tokens before it, from fresh contexts
    (one row at a time, as the rig) and the sampler's own chain (checked against llama.cpp's in
    test_sampling.py)."""

    MIN_GROUP = 20  # seeds that share the tokens before a row, for their counts to be checked there

    def __init__(self, model, prompt: list[int], n_ctx: int = 128, n_ubatch: int = 1):
        self.fresh = FreshContexts(model, n_ctx, n_ubatch)
        self.prompt = prompt

    def dist(self, settings: SamplerSettings, before: tuple[int, ...] = ()) -> Distribution:
        text = self.prompt + list(before)
        row, adjustments = self.fresh.logits(text), Adjustments.of(settings)
        return filtered(adjustments.adjusted(row, text) if adjustments else row, settings)

    def p_value(self, runs: Runs, settings: SamplerSettings) -> float:
        """That every row's tokens follow the target's distribution after the tokens before them."""
        groups: dict[tuple[int, ...], Counter] = defaultdict(Counter)
        for tokens in runs.tokens.values():
            for i, token in enumerate(tokens):
                groups[tokens[:i]][token] += 1
        checked = {before: counts for before, counts in groups.items() if counts.total() >= self.MIN_GROUP}
        self.fresh.prefetch([self.prompt + list(before) for before in checked])
        statistic, degrees = 0.0, 0
        for before, counts in checked.items():
            dist = self.dist(settings, before)
            s, d = chi_square_statistic(counts, dict(zip(dist.ids.tolist(), dist.probs.tolist())))
            statistic, degrees = statistic + s, degrees + d
        return chi_square_sf(statistic, degrees)

    def close(self):
        self.fresh.close()


@pytest.fixture(scope="module")
def exact(peaked, prompt):
    exact = Exact(peaked["target"], prompt)
    yield exact
    exact.close()


@pytest.fixture(scope="module")
def rules(exact, prompt, rig) -> dict[str, SamplerSettings]:
    return sampler_rules(exact, greedy(rig, prompt, TOKENS))


def sampler_rules(exact: Exact, path: list[int]) -> dict[str, SamplerSettings]:
    """Each sampler alone, strong enough to change what is sampled at every row, mild enough that
    the likeliest path (`path`, the target's greedy tokens) stays likely. The bias lifts the
    runner-up of rows 1 and 3 along it."""
    runners_up = [int(np.argsort(-exact.fresh.logits(exact.prompt + path[:i]))[1]) for i in (1, 3)]
    xtc = replace(SETTINGS, xtc_probability=0.15, xtc_threshold=0.05)
    return {
        "filters": SETTINGS,
        "bias": replace(SETTINGS, logit_bias=dict.fromkeys(runners_up, 1.0)),
        # A short window: the row after two drafted tokens penalizes the first of them.
        "penalties": replace(SETTINGS, repeat_penalty=1.05, frequency_penalty=0.2, presence_penalty=0.3, repeat_last_n=3),
        "xtc": xtc,
        "greedy-xtc": replace(xtc, temperature=0.0),
        "typical": replace(SETTINGS, typical_p=0.5),
        "top-n-sigma": replace(SETTINGS, top_n_sigma=0.5),
        "dynatemp": replace(SETTINGS, dynatemp_range=0.9, dynatemp_exponent=1.0),
    }


# What each rule's deliberate error leaves out of the rows after row 0 (the penalties: the drafted tokens).
ERRORS = {
    "filters": {"top_p": 1.0, "min_p": 0.0},
    "bias": {"logit_bias": {}},
    "xtc": {"xtc_probability": 0.0},
    "greedy-xtc": {"xtc_probability": 0.0},
    "typical": {"typical_p": 1.0},
    "top-n-sigma": {"top_n_sigma": -1.0},
    "dynatemp": {"dynatemp_range": 0.0},
}


@pytest.fixture(scope="module")
def plain(rig, prompt, rules) -> Callable[[str], Runs]:
    """Plain decoding's runs under a rule, sampled once for the module."""
    runs: dict[str, Runs] = {}

    def under(rule: str) -> Runs:
        if rule not in runs:
            runs[rule] = sample(lambda seed: rig.engine("plain", rules[rule], seed), prompt, range(SEEDS))
        return runs[rule]

    return under


@pytest.mark.parametrize("rule", RULES)
def test_plain_decoding_follows_each_rules_distribution(plain, exact, rules, rule):
    """The check itself: plain decoding passes it, and the rule changes what it samples."""
    assert exact.p_value(plain(rule), rules[rule]) > MIN_P
    if rule != "filters":
        assert exact.p_value(plain(rule), SETTINGS) < MIN_P


@pytest.mark.parametrize("drafting", DRAFTINGS)
@pytest.mark.parametrize("rule", RULES)
def test_every_verified_row_follows_the_targets_distribution(rig, prompt, exact, plain, rules, rule, drafting):
    """Rows 0-3 of the step that drafts, each after the drafted tokens kept before it, and the
    steps after it: every token against the fresh context's distribution for its history. A
    drafter that guesses samples and matches: one draw per emitted token, as plain decoding, so
    each seed gives plain decoding's very tokens."""
    runs = sample(lambda seed: rig.engine(drafting, rules[rule], seed), prompt, range(SEEDS))
    assert 0.05 < runs.accepted / runs.drafted < 0.95, (runs.accepted, runs.drafted)  # both accept and reject are taken
    assert runs.reached(2) >= 1 / 3 and runs.reached(3) >= 1 / 5, runs.depths
    assert exact.p_value(runs, rules[rule]) > MIN_P
    if drafting in GUESSING:
        assert runs.tokens == plain(rule).tokens


@pytest.mark.parametrize("rule", RULES)
def test_an_error_in_the_rows_after_kept_drafts_fails_the_check(rig, prompt, exact, rules, rule, monkeypatch):
    """Each rule's check fails where the verified rows after row 0 get it wrong: the penalties'
    window without the drafted tokens, or the rule left out of those rows."""
    correct = Engine._target_dist

    def wrong(self, logits, history, drafted, i):
        if rule == "penalties":
            return correct(self, logits, history, (), i)
        if i == 0:
            return correct(self, logits, history, drafted, i)
        sampler = self.sampler
        self.sampler = replace(sampler, settings=replace(sampler.settings, **ERRORS[rule]))
        try:
            return correct(self, logits, history, drafted, i)
        finally:
            self.sampler = sampler

    monkeypatch.setattr(Engine, "_target_dist", wrong)
    runs = sample(lambda seed: rig.engine("draft", rules[rule], seed), prompt, range(SEEDS))
    assert exact.p_value(runs, rules[rule]) < MIN_P


def test_the_chi_square_check_sees_a_small_distortion(rig, prompt, exact):
    """The same number of seeds sampled at temperature 0.8 instead of 1 must fail the check."""
    sharpened = sample(lambda seed: rig.engine("plain", replace(SETTINGS, temperature=0.8), seed), prompt, range(SEEDS))
    assert exact.p_value(sharpened, SETTINGS) < MIN_P


def seeded(session: Session, plain: bool = False):
    """A generator per seed over the session, as its sampler with that seed."""
    return lambda seed: session.engine(plain=plain, sampler=replace(session.config.sampler, seed=seed))


def first_tokens(make_generator, prompt: list[int], seeds: range, n: int = 2):
    """The first `n` tokens of one generation per seed, and the drafted and accepted totals.

    Each generation may emit one token more, so that even the n-th token's step drafts."""
    outcomes, drafted, accepted = {}, 0, 0
    for seed in seeds:
        generator = make_generator(seed)
        max_tokens = n + (generator.drafter is not None)
        tokens = [e.token for e in generator.stream(prompt, max_tokens) if isinstance(e, TokenEvent)]
        outcomes[seed] = tuple(tokens[:n])
        drafted, accepted = drafted + generator.stats.drafted, accepted + generator.stats.accepted
    return outcomes, drafted, accepted


def exact_pairs(model, prompt: list[int], settings: SamplerSettings, n_ctx: int) -> dict[tuple[int, int], float]:
    """P(first token, second token) from fresh contexts that decode a history at once, and the
    sampler's own chain (`Exact.dist`)."""
    exact = Exact(model, prompt, n_ctx, n_ubatch=0)
    try:
        first = exact.dist(settings)
        exact.fresh.prefetch([prompt + [t] for t in first.ids.tolist()])
        pairs = {}
        for t1, p1 in zip(first.ids.tolist(), first.probs.tolist()):
            second = exact.dist(settings, (t1,))
            pairs.update({(t1, t2): p1 * p2 for t2, p2 in zip(second.ids.tolist(), second.probs.tolist())})
    finally:
        exact.close()
    return pairs


def test_a_session_as_users_run_it_samples_like_its_target(peaked, prompt, exact):
    config = SessionConfig(
        target=peaked["target"], draft=peaked["draft"], lookup=True, k=K, n_ctx=128, threads=1, sampler=UNFILTERED
    )
    with Session(config) as session:
        runs = sample(seeded(session), prompt, range(SEEDS))
    assert 0.05 < runs.accepted / runs.drafted < 0.95, (runs.accepted, runs.drafted)
    assert runs.reached(2) >= 1 / 3, runs.depths
    assert exact.p_value(runs, UNFILTERED) > MIN_P


@pytest.fixture(scope="module")
def gemma_without_layer_16(gemma, tmp_path_factory):
    from specrun.pair.derive import derive_draft

    return derive_draft(gemma, [*range(16), 17], tmp_path_factory.mktemp("gemma") / "draft.gguf").path


@pytest.mark.gemma
def test_gemma_with_a_derived_draft_samples_like_plain(gemma, gemma_without_layer_16):
    """Fewer seeds than on the tiny models (a Gemma step costs 25-100 ms on one thread): enough
    to catch a rule that is off by ten percent on a drafted token, in about 90 seconds. One
    thread: ggml's spinning thread pool slows tenfold when other processes share the cores.

    The first token comes from the prefill, undrafted (" is", nearly always); the second is
    drafted and verified, and is a colour, about 14 of them likely."""
    prompt_text = "My favourite colour is blue. Your favourite colour"
    config = SessionConfig(target=gemma, draft=gemma_without_layer_16, k=1, n_ctx=256, threads=1, sampler=SETTINGS)
    seeds = range(400)
    with Session(config) as session:
        prompt = session.tokenize(prompt_text)
        plain, _, _ = first_tokens(seeded(session, plain=True), prompt, seeds)
        drafted_run, drafted, accepted = first_tokens(seeded(session), prompt, seeds)
    assert 0.05 < accepted / drafted < 0.95, (accepted, drafted)
    assert chi_square_two_sample_p(second_tokens(plain), second_tokens(drafted_run)) > MIN_P
    # Deterministic drafters (lookup, and hybrid with a greedy draft model) sample and match.
    for name, drafting in (("lookup", {"lookup": True, "draft": None}), ("hybrid", {"lookup": True, "draft_sampling": False})):
        with Session(replace(config, **drafting)) as session:
            sampled, drafted, _ = first_tokens(seeded(session), prompt, range(150))
        assert drafted > 0, name
        assert chi_square_two_sample_p(second_tokens(plain), second_tokens(sampled)) > MIN_P, name
        # Sample-and-match: plain's tokens, up to batched rounding moving a token across top-p.
        assert sum(sampled[seed] == plain[seed] for seed in range(150)) >= 0.97 * 150, name


def second_tokens(outcomes: dict[int, tuple[int, ...]]) -> Counter:
    return Counter(tokens[1] for tokens in outcomes.values() if len(tokens) > 1)


@pytest.mark.gemma
@pytest.mark.smollm2
@pytest.mark.parametrize("translation", ["tokens", "text"])
def test_gemma_with_a_translated_smollm2_draft_samples_like_plain(gemma, smollm2, translation):
    """SmolLM2-135M (another vocabulary) drafting for Gemma at temperature 1: the second token,
    drafted and verified (p/q with the intersection's q; sample-and-match for re-encoded text),
    is distributed as plain decoding's."""
    prompt_text = "My favourite colour is blue. Your favourite colour"
    config = SessionConfig(target=gemma, draft=smollm2, k=1, n_ctx=256, threads=1, sampler=SETTINGS, translation=translation)
    seeds = range(300)
    with Session(config) as session:
        prompt = session.tokenize(prompt_text)
        plain, _, _ = first_tokens(seeded(session, plain=True), prompt, seeds)
        drafted_run, drafted, accepted = first_tokens(seeded(session), prompt, seeds)
    assert drafted > 50 and 0.05 < accepted / drafted < 0.95, (accepted, drafted)
    assert chi_square_two_sample_p(second_tokens(plain), second_tokens(drafted_run)) > MIN_P


def test_a_sampled_draft_tokens_confidence_does_not_depend_on_which_token_was_drawn():
    """Stops and a batch's cut read the confidence: had it been the drawn token's probability,
    whether a token is verified would depend on the token, and the p/q rule would be biased."""
    row = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    picker, settings = Picker(4), SamplerSettings(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    picks = [picker.pick(row, Sampler.seeded(replace(settings, seed=seed)), True, True) for seed in range(40)]
    assert len({token for token, _, _ in picks}) > 1  # several tokens were drawn
    assert {round(confidence, 6) for _, _, confidence in picks} == {0.5}
    assert picker.pick(row, Sampler.seeded(settings), False, True)[2] == pytest.approx(0.5)  # greedy: the argmax's
