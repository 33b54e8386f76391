"""End to end at temperature > 0: speculative output follows the target's own distribution.

Over thousands of seeds, the first two tokens emitted while drafting (the first comes
undrafted from the prefill, the second from a verified draft) with a model (the
p/q rule), by prompt lookup, or both are tested with chi-square against the exact
distribution, computed from fresh contexts; drafters that never sample (lookup, a greedy
draft model) must give plain decoding's very tokens for the same seed.

The tiny rig decodes one row at a time inside each batch (n_ubatch 1): batched
verification then gives bit for bit the logits of one-token decoding, so these tests
see the speculative rule, not floating-point luck. (With bigger micro-batches a logit
moving by 0.002 can move a token across the top-p cut and change the sample for a few
seeds in a hundred; scripts/batched_exactness.py measures that.) One test runs a plain
Session as users do, without filters, where such rounding cannot change the support.
The tiny draft is the target's first layer alone (same embeddings and head), accepted
about 1 time in 4. On Gemma 3 270M the draft is the target without layer 16, run as
users run it, so its samples are compared with plain decoding's.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from reference import FreshContexts, chi_square_p, chi_square_two_sample_p
from tinymodels import write_tiny_llama

from specrun.backend import Context, ContextOptions, Model
from specrun.config import SessionConfig
from specrun.core.engine import Generator
from specrun.core.events import TokenEvent
from specrun.core.policy import FixedK
from specrun.core.sampling import Adjustments, Sampler, SamplerSettings, filtered
from specrun.drafts.base import Chain
from specrun.drafts.bridge import VocabBridge
from specrun.drafts.feeding import Picker
from specrun.drafts.lookup import PromptLookup
from specrun.drafts.model import DraftModel
from specrun.drafts.translated import TranslatingDraft
from specrun.session import Session

SETTINGS = SamplerSettings(temperature=1.0)  # llama.cpp's default filters: top-k 40, top-p 0.95, min-p 0.05
UNFILTERED = SamplerSettings(temperature=0.7, top_k=0, top_p=1.0, min_p=0.0)
# Strong enough that a penalty left out of a row (a drafted token missing from its window) shows.
PENALIZED = replace(SETTINGS, repeat_penalty=1.5, frequency_penalty=0.5, presence_penalty=1.0)
XTC = replace(SETTINGS, xtc_probability=0.5, xtc_threshold=0.05)
MIN_P = 1e-4  # a correct sampler fails a check this strict once in 10,000
SEEDS = 2000
TINY_TEXT = "when the water was long after"
DRAFTINGS = ("lookup", "draft", "hybrid", "translated", "translated-tokens")


@pytest.fixture(scope="module")
def first_layer_draft(tmp_path_factory):
    """The tiny target's first layer alone: its drafts are accepted part of the time."""
    return write_tiny_llama(tmp_path_factory.mktemp("exact") / "first-layer.gguf", seed=0, n_layer=1)


class Rig:
    """Target and draft contexts that decode batches one row at a time (n_ubatch 1); the other
    draft is the same first layer under other token ids, and drafts translated."""

    def __init__(self, target, draft, other):
        self.models = [Model(target), Model(draft, role="draft"), Model(other, role="draft")]
        options = ContextOptions(n_ctx=128, n_batch=8, n_ubatch=1, n_threads=1)
        self.target, self.draft, self.other = (Context(model, options) for model in self.models)
        self.bridge = VocabBridge(self.models[0], self.models[2])

    def generator(self, drafting: str, settings: SamplerSettings, seed: int, draft_sampling: bool = True) -> Generator:
        model = DraftModel(self.draft, sample=draft_sampling)
        drafter = {"plain": None, "lookup": PromptLookup(), "draft": model, "hybrid": Chain(PromptLookup(), model)}
        if drafting.startswith("translated"):
            self.other.truncate(0)  # a fresh drafter per generation: its cache starts empty
            mode = "tokens" if drafting == "translated-tokens" else "text"
            drafter[drafting] = TranslatingDraft(self.other, self.bridge, sample=draft_sampling, mode=mode)
        return Generator(self.target, drafter[drafting], Sampler.seeded(replace(settings, seed=seed)), FixedK(2))

    def close(self):
        for model in self.models:
            model.close()


@pytest.fixture(scope="module")
def rig(tiny, first_layer_draft):
    rig = Rig(tiny["target"], first_layer_draft, tiny["relabelled"])
    yield rig
    rig.close()


@pytest.fixture(scope="module")
def tiny_prompt(rig):
    """TEXT, the target's greedy continuation of it, and TEXT again: prompt lookup then
    proposes that continuation, which the target accepts about half the time."""
    text = rig.models[0].tokenize(TINY_TEXT)
    events = rig.generator("plain", SamplerSettings(), 0).generate(text, 4)
    return text + [e.token for e in events if isinstance(e, TokenEvent)] + text[1:]  # no second start token


def seeded(session: Session, plain: bool = False):
    """A generator per seed over the session, as its sampler with that seed."""
    return lambda seed: session.generator(plain=plain, sampler=replace(session.config.sampler, seed=seed))


def first_tokens(make_generator, prompt: list[int], seeds: range, n: int = 2):
    """The first `n` tokens of one generation per seed, and the drafted and accepted totals.

    Each generation may emit one token more, so that even the n-th token's step drafts."""
    outcomes, drafted, accepted = {}, 0, 0
    for seed in seeds:
        generator = make_generator(seed)
        max_tokens = n + (generator.drafter is not None)
        tokens = [e.token for e in generator.generate(prompt, max_tokens) if isinstance(e, TokenEvent)]
        outcomes[seed] = tuple(tokens[:n])
        drafted, accepted = drafted + generator.stats.drafted, accepted + generator.stats.accepted
    return outcomes, drafted, accepted


def exact_pairs(model, prompt: list[int], settings: SamplerSettings, n_ctx: int) -> dict[tuple[int, int], float]:
    """P(first token, second token) from fresh contexts and the sampler's own chain (its bias and
    penalties checked against llama.cpp's in test_sampling.py)."""
    adjustments = Adjustments.of(settings)

    def dist(text: list[int]):
        row = fresh.logits(text)
        return filtered(adjustments.adjusted(row, text) if adjustments else row, settings)

    with FreshContexts(model, n_ctx) as fresh:
        first = dist(prompt)
        fresh.prefetch([prompt + [t] for t in first.ids.tolist()])
        pairs = {}
        for t1, p1 in zip(first.ids.tolist(), first.probs.tolist()):
            second = dist(prompt + [t1])
            pairs.update({(t1, t2): p1 * p2 for t2, p2 in zip(second.ids.tolist(), second.probs.tolist())})
    return pairs


@pytest.fixture(scope="module")
def exact(tiny, tiny_prompt):
    return exact_pairs(tiny["target"], tiny_prompt, SETTINGS, 128)


@pytest.mark.parametrize("drafting", ["plain", *DRAFTINGS])
def test_tiny_first_two_tokens_follow_the_targets_distribution(rig, tiny_prompt, exact, drafting):
    sampled, drafted, accepted = first_tokens(lambda seed: rig.generator(drafting, SETTINGS, seed), tiny_prompt, range(SEEDS))
    if drafting != "plain":  # plain checks the test itself
        assert 0.05 < accepted / drafted < 0.95, (accepted, drafted)  # both accept and reject are taken
    assert chi_square_p(Counter(sampled.values()), exact) > MIN_P


@pytest.mark.parametrize("drafting", DRAFTINGS)
def test_tiny_deterministic_drafters_give_plain_decodings_tokens_per_seed(rig, tiny_prompt, drafting):
    """Sample-and-match draws one number per emitted token, as plain decoding does."""
    seeds = range(300)
    plain, _, _ = first_tokens(lambda seed: rig.generator("plain", SETTINGS, seed), tiny_prompt, seeds, n=6)
    matched, drafted, accepted = first_tokens(
        lambda seed: rig.generator(drafting, SETTINGS, seed, draft_sampling=False), tiny_prompt, seeds, n=6
    )
    assert drafted > 0 and accepted > 0
    assert matched == plain


@pytest.fixture(scope="module")
def biased(exact) -> SamplerSettings:
    """A logit bias that bans the likeliest first token and lifts the next."""
    first: Counter = Counter()
    for (t1, _), p in exact.items():
        first[t1] += p
    (top, _), (second, _) = first.most_common(2)
    return replace(SETTINGS, logit_bias={top: -np.inf, second: 1.0})


@pytest.mark.parametrize("drafting", ["plain", "draft", "translated", "translated-tokens"])
@pytest.mark.parametrize("adjusting", ["penalized", "biased", "xtc", "greedy-xtc", "typical-sigma", "dynatemp"])
def test_tiny_drafts_under_bias_penalties_and_xtc_follow_the_chains_distribution(
    rig, tiny, tiny_prompt, exact, biased, adjusting, drafting
):
    """Each verified row is biased, and penalized for the text before it, the draft's tokens
    included; the drafts are adjusted too (biased only in the target's vocabulary), over their
    own view of the text, which changes q and not p. XTC fires at random, so a row's p is the
    mixture of its firing and not (greedy too: two points). (Prompt lookup copies the repeats
    these penalties push the target away from: none is kept.)"""
    settings = {
        "penalized": PENALIZED,
        "biased": biased,
        "xtc": XTC,
        "greedy-xtc": replace(XTC, temperature=0.0),
        "typical-sigma": replace(SETTINGS, typical_p=0.5, top_n_sigma=1.0),
        "dynatemp": replace(SETTINGS, temperature=0.4, dynatemp_range=0.3, dynatemp_exponent=0.5),
    }[adjusting]
    adjusted = exact_pairs(tiny["target"], tiny_prompt, settings, 128)
    sampled, drafted, accepted = first_tokens(lambda seed: rig.generator(drafting, settings, seed), tiny_prompt, range(SEEDS))
    if drafting != "plain":
        assert 0.05 < accepted / drafted < 0.95, (accepted, drafted)
    assert chi_square_p(Counter(sampled.values()), adjusted) > MIN_P
    assert chi_square_p(Counter(sampled.values()), exact) < MIN_P  # the settings did change it


def test_the_chi_square_check_sees_a_small_distortion(rig, tiny_prompt, exact):
    """The same number of seeds sampled at temperature 0.8 instead of 1 must fail the check."""
    sharpened, _, _ = first_tokens(
        lambda seed: rig.generator("plain", replace(SETTINGS, temperature=0.8), seed), tiny_prompt, range(SEEDS)
    )
    assert chi_square_p(Counter(sharpened.values()), exact) < MIN_P


def test_a_session_as_users_run_it_samples_like_its_target(tiny, first_layer_draft, tiny_prompt):
    config = SessionConfig(
        target=tiny["target"], draft=first_layer_draft, lookup=True, k=2, n_ctx=128, threads=1, sampler=UNFILTERED
    )
    with Session(config) as session:
        sampled, drafted, accepted = first_tokens(seeded(session), tiny_prompt, range(SEEDS))
    assert 0.05 < accepted / drafted < 0.95, (accepted, drafted)
    assert chi_square_p(Counter(sampled.values()), exact_pairs(tiny["target"], tiny_prompt, UNFILTERED, 128)) > MIN_P


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
