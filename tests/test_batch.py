"""Several streams per decode: each stream's output is what it would be alone, greedy and sampled."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections import Counter
from dataclasses import replace

import pytest
from reference import chi_square_p
from test_exactness import MIN_P, exact_pairs, first_layer_draft  # noqa: F401  (a fixture)
from test_hybrid import hybrid  # noqa: F401  (the fixture)
from test_policy import FOURS

from specrun.backend import Context, ContextOptions, Model
from specrun.backend.mtp import _HeadContext
from specrun.config import SessionConfig
from specrun.core.auto import AutoK
from specrun.core.batch import Batch
from specrun.core.drafting import Draft, without_decodes
from specrun.core.engine import Engine, TargetDecode
from specrun.core.events import Stats
from specrun.core.policy import FixedK, StepRecord
from specrun.core.sampling import Sampler, SamplerSettings
from specrun.drafts.lookup import PromptLookup
from specrun.sequences import common_prefix
from specrun.session import Session

PROMPTS = [
    "the cat sat on the mat and the cat sat on the",
    "hello world and hello world",
    "I see the water",
    "what was it that the dog saw",
    "the cat was there",
    "and then the dog was",
]


def configs(tiny, hybrid):  # noqa: F811
    return {
        "lookup": SessionConfig(target=tiny["target"], lookup=True, k=4, n_ctx=1024),
        "draft": SessionConfig(target=tiny["target"], draft=tiny["draft"], k=3, n_ctx=1024),
        "translated draft": SessionConfig(target=tiny["target"], draft=tiny["gpt2"], k=3, n_ctx=1024),
        "hybrid target, lookup and draft": SessionConfig(
            target=hybrid["target"], draft=hybrid["draft"], lookup=True, k=3, n_ctx=1024
        ),
        "auto": SessionConfig(target=tiny["target"], lookup=True, k="auto", n_ctx=1024),
        "mtp": SessionConfig(target=hybrid["mtp"], sources=("mtp",), k=3, n_ctx=1024),
    }


@pytest.mark.parametrize("name", ["lookup", "draft", "translated draft", "hybrid target, lookup and draft", "auto", "mtp"])
def test_batched_greedy_output_is_each_streams_own(tiny, hybrid, name):  # noqa: F811
    config = configs(tiny, hybrid)[name]
    with Session(config) as session:
        alone = [session.generate(prompt, max_tokens=32).tokens for prompt in PROMPTS]
    with Session(replace(config, parallel=4, n_ctx=4 * config.n_ctx)) as session:
        together = session.generate_many(PROMPTS, max_tokens=32)
    assert [g.tokens for g in together] == alone
    assert sum(g.stats.drafted for g in together) > 0 or name == "auto"


def four_streams_stepped(config: SessionConfig) -> tuple[Batch, int]:
    """The first four prompts' generations run together on a session of `config`: the batch and its steps."""
    with Session(config) as session:
        batch, steps = session.batch(), 0
        for slot, prompt in enumerate(PROMPTS[:4]):
            batch.add(session.engine(slot=slot), session.tokenize(prompt), 24)
        while batch.streams:
            batch.step()
            steps += 1
    return batch, steps


@pytest.mark.parametrize("draft", ["draft", "gpt2"])
def test_the_streams_draft_models_decode_together(tiny, draft, monkeypatch):
    """Each draft decode holds every drafting stream's next position: four streams drafting three
    tokens a step take three draft decodes a step, not twelve."""
    widths: list[int] = []
    decode_many = Context.decode_many

    def recording(self, parts):
        if self.model.role == "draft":
            widths.append(len(parts))
        return decode_many(self, parts)

    monkeypatch.setattr(Context, "decode_many", recording)
    config = SessionConfig(target=tiny["target"], draft=tiny[draft], k=3, n_ctx=4 * 1024, parallel=4)
    batch, steps = four_streams_stepped(config)
    assert Counter(widths).most_common(1)[0][0] == 4  # most draft decodes: all four streams'
    assert batch.draft_decodes <= 4 * steps  # a catch-up and three guesses a step, at most


def test_the_streams_mtp_heads_decode_together(hybrid, monkeypatch):  # noqa: F811
    """Every stream's next drafting row goes in one decode of the heads' context, and the rows
    that follow the target's decode go with the first of them: four streams drafting three
    tokens a step take three head decodes a step, not sixteen."""
    decodes: list[tuple[int, int]] = []  # (rows following the target, drafting rows) of each head decode
    decode = _HeadContext._decode

    def recording(self, rows=None):
        n = len(self.waiting) if rows is None else rows
        decodes.append((len(self.waiting), int(self.wants[:n].sum())))  # drafting rows are those that give logits
        return decode(self, rows)

    monkeypatch.setattr(_HeadContext, "_decode", recording)
    config = SessionConfig(target=hybrid["mtp"], sources=("mtp",), k=3, n_ctx=4 * 1024, parallel=4)
    _, steps = four_streams_stepped(config)
    assert len(decodes) <= 3 * steps  # three decodes a step at most, each with every drafting stream's row
    assert max(drafting for _, drafting in decodes) == 4 and all(drafting for _, drafting in decodes)


def test_a_stream_cancelled_while_its_draft_model_drafts_leaves_the_others_and_its_slot_whole(tiny):
    """Between steps a stream drafting with a model waits on its draft's decode; cancelling it
    there (a client gone) ends it as interrupted, the others write what they would alone, and
    its slot's caches serve the next generation as if fresh."""
    config = SessionConfig(target=tiny["target"], draft=tiny["draft"], k=3, n_ctx=1024)
    with Session(config) as session:
        alone = [session.generate(prompt, max_tokens=24).tokens for prompt in PROMPTS[:3]]
    with Session(replace(config, parallel=3, n_ctx=3 * 1024)) as session:
        batch, results = session.batch(), {}
        generators = [session.engine(slot=slot) for slot in range(3)]
        for slot, prompt in enumerate(PROMPTS[:3]):
            batch.add(
                generators[slot], session.tokenize(prompt), 24, on_done=lambda run, slot=slot: results.__setitem__(slot, run)
            )
        for _ in range(3):
            batch.step()
        assert all(stream.draft_decode is not None for stream in batch.streams)  # each waits on its draft's decode
        batch.cancel(generators[1])
        while batch.streams:
            batch.step()
        again = session.engine(slot=1).run(session.tokenize(PROMPTS[1]), 24)
    assert results[1].stop_reason == "interrupted" and len(results[1].tokens) < 24
    assert [results[0].tokens, results[2].tokens] == [alone[0], alone[2]]
    assert again.tokens == alone[1]


def lookup_generator(context: Context, source: PromptLookup | None = None) -> Engine:
    return Engine(context, source or PromptLookup(), Sampler.seeded(SamplerSettings()), FixedK(4))


def alone(model: Model, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Each prompt's greedy output, generated on a context of its own."""
    outputs = []
    for prompt in prompts:
        context = Context(model, ContextOptions(n_ctx=512))
        outputs.append(lookup_generator(context).run(prompt, max_tokens).tokens)
        context.close()
    return outputs


def test_a_long_prompt_joins_in_chunks_while_the_others_run(tiny):
    """Its prompt goes in beside the running streams' rows, a chunk a step; nothing changes the outputs."""
    model = Model(tiny["target"])
    try:
        long_prompt = model.tokenize(" ".join(PROMPTS * 6))
        prompts = [model.tokenize(PROMPTS[0]), long_prompt, model.tokenize(PROMPTS[2])]
        outputs = alone(model, prompts, 24)
        context = Context(model, ContextOptions(n_ctx=3 * 512, sequences=3))
        batch, results, widths = Batch(context, prefill_chunk=16), {}, []
        for i in (0, 2):
            generator = lookup_generator(context.sequence(i))
            batch.add(generator, prompts[i], 24, on_done=lambda run, i=i: results.__setitem__(i, run.tokens))
        batch.step()
        generator = lookup_generator(context.sequence(1))
        batch.add(generator, prompts[1], 24, on_done=lambda run: results.__setitem__(1, run.tokens))
        while batch.streams:
            batch.step()
            widths.append(batch.rows)
    finally:
        model.close()
    assert [results[i] for i in range(3)] == outputs
    assert len(long_prompt) > 16 and max(widths) <= 16 + 2 * 5  # the prompt never took a decode to itself


def test_a_prompt_shares_the_cells_another_sequence_holds(tiny):
    """A stream whose prompt begins with what another sequence holds shares those cells instead of
    computing them, and writes what it would alone, also after the lender rolls back."""
    model = Model(tiny["target"])
    try:
        system = model.tokenize(" ".join(PROMPTS))
        prompts = [system + model.tokenize(end, add_special=False) for end in (" and so the cat", " hello water")]
        (output,) = alone(model, prompts[1:], 16)
        context = Context(model, ContextOptions(n_ctx=2 * 512, sequences=2))
        lookup_generator(context).run(prompts[0], 16)
        borrower, shared = context.sequence(1), common_prefix(*prompts)
        assert shared >= len(system) and borrower.prefix_held(prompts[1]) == shared
        generator = lookup_generator(borrower)
        steps = generator.steps(prompts[1], 16)
        assert len(next(steps).tokens) == len(prompts[1]) - shared  # its first decode: its own tokens only
        steps.close()
        context.truncate(0)  # the lender lets go of the shared cells
        again = generator.run(prompts[1], 16)
    finally:
        model.close()
    assert again.tokens == output and again.stats.prefilled_tokens == len(prompts[1]) - shared


def test_a_sequence_borrows_all_of_its_history_where_another_holds_it_and_more(tiny):
    """Of two other sequences longer than the history, the one that holds all of it lends it; the
    search stops there, before reading past the history's end for the other."""
    model = Model(tiny["target"])
    try:
        history = model.tokenize(" ".join(PROMPTS))
        context = Context(model, ContextOptions(n_ctx=3 * 512, sequences=3))
        context.sequence(1).eval([*history, 7, 8], 1)
        context.sequence(2).eval([*history[:-1], 9, 10], 1)  # parts from the history at its last token
        assert context.prefix_held(history) == len(history)
        assert context.reuse_prefix(history) == len(history) and context.tokens == history
    finally:
        model.close()


def test_prompts_arriving_together_prefill_what_they_share_once(tiny):
    """Three prompts with one long beginning, added in the same step: the first decode prefills the first
    alone; the others wait for it, then decode only what is their own. Each writes what it would alone."""
    model = Model(tiny["target"])
    try:
        system = model.tokenize(" ".join(PROMPTS * 2))
        prompts = [system + model.tokenize(end, add_special=False) for end in (" so the cat", " hello the dog", " I saw")]
        outputs = alone(model, prompts, 12)
        context = Context(model, ContextOptions(n_ctx=3 * 512, sequences=3))
        batch, results, widths = Batch(context), {}, []
        generators = [lookup_generator(context.sequence(i)) for i in range(3)]
        for i, generator in enumerate(generators):
            batch.add(generator, prompts[i], 12, on_done=lambda run, i=i: results.__setitem__(i, run))
        while batch.streams:
            batch.step()
            widths.append(batch.rows)
    finally:
        model.close()
    assert [results[i].tokens for i in range(3)] == outputs
    assert widths[0] == len(prompts[0])
    shared = [max(common_prefix(prompts[i], prompts[j]) for j in range(i)) for i in (1, 2)]
    assert min(shared) >= len(system)
    assert [results[i].stats.prefilled_tokens for i in (1, 2)] == [len(prompts[i]) - shared[i - 1] for i in (1, 2)]


def test_prompts_on_a_hybrid_target_do_not_wait_for_a_prefix_they_cannot_share(hybrid):  # noqa: F811
    """A recurrent state cannot take another sequence's prefix, so prompts with one beginning all go
    into the first decode rather than waiting for one that shares nothing with them."""
    model = Model(hybrid["target"])
    try:
        system = model.tokenize(" ".join(PROMPTS * 2))
        prompts = [system + model.tokenize(end, add_special=False) for end in (" so the cat", " hello the dog")]
        context = Context(model, ContextOptions(n_ctx=2 * 512, sequences=2))
        batch = Batch(context)
        for i, prompt in enumerate(prompts):
            batch.add(lookup_generator(context.sequence(i)), prompt, 4)
        batch.step()
        first_decode = batch.rows
        while batch.streams:
            batch.step()
    finally:
        model.close()
    assert first_decode == sum(len(prompt) for prompt in prompts)


class RecordingLookup(PromptLookup):
    """Prompt lookup that notes the rows of other streams each of its drafts was priced with."""

    def __init__(self):
        super().__init__()
        self.other_rows: list[int] = []

    def propose(self, history, request):
        self.other_rows.append(request.rows)
        return super().propose(history, request)


def test_each_stream_prices_its_draft_with_every_other_streams_rows(tiny):
    """The stream that drafts first in a step counts the rows the one after it verified last time;
    the one after counts what the first just asked for. One stream alone counts none."""
    model = Model(tiny["target"])
    try:
        prompts = [model.tokenize(PROMPTS[0]), model.tokenize(PROMPTS[1])]
        context = Context(model, ContextOptions(n_ctx=2 * 512, sequences=2))
        batch, sources = Batch(context), [RecordingLookup(), RecordingLookup()]
        for i, source in enumerate(sources):
            batch.add(lookup_generator(context.sequence(i), source), prompts[i], 8)
        while batch.streams:
            batch.step()
        single = RecordingLookup()
        lookup_generator(context.sequence(0), single).run(prompts[0], 8)
    finally:
        model.close()
    first, second = sources
    assert first.other_rows[:3] and min(first.other_rows[:3]) >= 1
    assert second.other_rows[:3] and min(second.other_rows[:3]) >= 1
    assert set(single.other_rows) == {0}


class OnCurve(AutoK):
    """Auto on a fixed verify-cost curve: the tiny model's real decode times do not move it."""

    def observe(self, step: StepRecord) -> None:
        super().observe(step._replace(rows=None))


TWO_FREE = [0.0] + [1.0] * 6 + [3.0] * 10  # up to 6 rows cost one decode, more cost three


def four_at_once(session: Session, tokens: list[int], policy: AutoK | None) -> list[tuple[list[int], Stats]]:
    """Four generations of three tokens in one batch: the session's own (its k), or under `policy`,
    drafts cut to the rows that pay on its curve."""
    if policy is None:
        return [(g.tokens, g.stats) for g in session.generate_many([tokens] * 4, max_tokens=3)]
    batch, done = Batch(session.target, lambda: policy.costs), []
    for slot in range(4):
        batch.add(session.engine(policy=policy, slot=slot), tokens, 3, on_done=lambda run: done.append((run.tokens, run.stats)))
    while batch.streams:
        batch.step()
    return done


@pytest.mark.parametrize("cut", [False, True], ids=["k 2", "auto, drafts cut to the rows that pay"])
def test_four_streams_sample_like_the_target(tiny, first_layer_draft, cut, monkeypatch):  # noqa: F811
    """At temperature 1, the first two tokens of 2,000 generations run four at a time (a draft model
    sampling, verified by the p/q rule) follow the target's own distribution, also where the batch
    verifies only part of each draft (two rows of the four streams' drafts, on TWO_FREE)."""
    settings = SamplerSettings(temperature=1.0)
    prompt = PROMPTS[0]
    # Under auto, the model drafts alone: prompt lookup would draft first, and on random weights its copies are cut.
    config = SessionConfig(
        target=tiny["target"],
        draft=first_layer_draft,
        lookup=not cut,
        k=2,
        n_ctx=4 * 256,
        parallel=4,
        threads=1,
        sampler=settings,
    )
    cuts = Counter()
    monkeypatch.setattr(TargetDecode, "cut", lambda self, drafted, cut=TargetDecode.cut: cuts.update([1]) or cut(self, drafted))
    sampled: Counter = Counter()
    drafted = accepted = 0
    with Session(config) as session:
        tokens, policy = session.tokenize(prompt), OnCurve(TWO_FREE) if cut else None
        for _ in range(500):
            for output, stats in four_at_once(session, tokens, policy):
                sampled[tuple(output[:2])] += 1
                drafted, accepted = drafted + stats.drafted, accepted + stats.accepted
    assert 0.05 < accepted / drafted < 0.95
    assert (cuts.total() > 100) == cut
    assert chi_square_p(sampled, exact_pairs(tiny["target"], tokens, settings, 256)) > MIN_P


def test_a_batch_verifies_the_draft_rows_that_pay_and_each_output_stays_its_own(tiny):
    """On a curve whose widths cost in steps of four, auto-sized drafts are cut to a width that
    the next multiple of four does not beat; each stream writes what it writes alone."""
    model = Model(tiny["target"])
    try:
        prompts = [model.tokenize(prompt) for prompt in PROMPTS[:4]]
        expected = alone(model, prompts, 24)
        context = Context(model, ContextOptions(n_ctx=4 * 512, sequences=4))
        batch, results, cut_widths, policy = Batch(context, lambda: FOURS), {}, [], OnCurve(FOURS)
        for i, prompt in enumerate(prompts):
            generator = Engine(context.sequence(i), PromptLookup(), Sampler.seeded(SamplerSettings()), policy)
            batch.add(generator, prompt, 24, on_done=lambda run, i=i: results.__setitem__(i, run.tokens))
        while batch.streams:
            verifying = all(stream.engine.stats.prefills for stream in batch.streams)
            asked = sum(len(stream.target_decode.tokens) for stream in batch.streams if stream.target_decode is not None)
            batch.step()
            if verifying and batch.rows < asked:
                cut_widths.append(batch.rows)
    finally:
        model.close()
    assert [results[i] for i in range(4)] == expected
    assert cut_widths and all(width % 4 == 0 or width < 4 for width in cut_widths)


class RecordingOnCurve(OnCurve):
    def __init__(self, costs):
        super().__init__(costs)
        self.steps: list[StepRecord] = []

    def observe(self, step: StepRecord) -> None:
        self.steps.append(step)
        super().observe(step)


def test_a_draft_the_batch_verified_none_of_reaches_the_policy_as_declined(tiny):
    """Four streams fill the cheap width of a curve on which any fifth row costs five decodes:
    every copy is cut whole, and auto hears of each as a decline (so its evidence fades and the
    source is tried again), not as a draft of nothing."""
    model = Model(tiny["target"])
    try:
        context = Context(model, ContextOptions(n_ctx=4 * 512, sequences=4))
        policy = RecordingOnCurve([0.0] + [1.0] * 4 + [5.0] * 12)
        batch = Batch(context, lambda: policy.costs)
        for i, prompt in enumerate(PROMPTS[:4]):
            batch.add(
                Engine(context.sequence(i), PromptLookup(), Sampler.seeded(SamplerSettings()), policy),
                model.tokenize(prompt),
                16,
            )
        while len(batch.streams) == 4:
            batch.step()
    finally:
        model.close()
    assert all(step.budget is None and step.drafted == 0 for step in policy.steps)
    cut = [d for step in policy.steps for d in step.declined if d.decision == "decline" and d.source.startswith("lookup")]
    assert cut and policy.sources[cut[0].source].skipped > 0


class KeepsNoGuess:
    """A model-like source whose every guess its budget ends before: it drafts nothing, at a cost."""

    names, counters, parts, runs_model = ("draft",), (), (), True

    @without_decodes
    def propose(self, history, request):
        return Draft.under(request.offer("draft", request.limit))

    def rollback(self, history):
        pass


def test_a_model_draft_that_kept_no_token_is_no_decline(tiny):
    """Only a draft a batch cut away counts as declined: one that kept nothing still reaches auto
    under its budget, so the decode that guessed it is charged to the source."""
    model = Model(tiny["target"])
    try:
        context = Context(model, ContextOptions(n_ctx=512))
        policy = RecordingOnCurve(FOURS)
        Engine(context, KeepsNoGuess(), Sampler.seeded(SamplerSettings()), policy).run(model.tokenize(PROMPTS[0]), 4)
    finally:
        model.close()
    first = policy.steps[0]  # auto's first grant to the source
    assert first.budget is not None and first.budget.source == "draft" and first.drafted == 0


def specrun_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specrun", *args], capture_output=True, text=True, timeout=300)


def test_generate_batch_writes_one_json_line_per_prompt_in_order(tiny, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    result = specrun_cli(
        "generate",
        "--batch",
        str(prompts),
        "--target",
        str(tiny["target"]),
        "--lookup",
        "-n",
        "12",
        "--parallel",
        "3",
        "-t",
        "1",
        "-c",
        "512",
    )
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["index"] for line in lines] == list(range(len(PROMPTS)))
    assert all(line["source"] == f"prompts.txt:{i + 1}" and len(line["tokens"]) == 12 for i, line in enumerate(lines))
    with Session(SessionConfig(target=tiny["target"], lookup=True, n_ctx=512)) as session:
        assert lines[1]["tokens"] == session.generate(PROMPTS[1], max_tokens=12).tokens


def test_generate_batch_gives_each_stream_the_ctx_size(tiny, tmp_path):
    """-c is per stream, as in serve: 4 streams of 512 need no more than -c 512 (the refusals are in test_cli_errors.py)."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("the cat\n")
    result = specrun_cli(
        "generate", "--batch", str(prompts), "--target", str(tiny["target"]), "-n", "4", "-t", "1", "--parallel", "4", "-c", "512"
    )
    assert result.returncode == 0, result.stderr


def test_more_streams_than_the_context_holds_is_one_line(tiny):
    with pytest.raises(
        Exception,
        match=r"--parallel 8 gives each stream 64 tokens of context, fewer than the 256 a stream needs: raise --ctx-size",
    ):
        Session(SessionConfig(target=tiny["target"], lookup=True, n_ctx=512, parallel=8))


def test_bench_parallel_reports_aggregate_speed_and_latencies(tiny, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    report = tmp_path / "parallel.json"
    result = specrun_cli(
        "bench",
        str(prompts),
        "--target",
        str(tiny["target"]),
        "--methods",
        "plain,lookup",
        "--k",
        "4",
        "-n",
        "16",
        "--parallel",
        "4",
        "--warmup",
        "0",
        "-t",
        "1",
        "-c",
        "512",
        "--json",
        str(report),
    )
    assert result.returncode == 0, result.stderr
    assert "4 at a time" in result.stdout and "1st tok s p50/95" in result.stdout
    runs = json.loads(report.read_text())["runs"]
    assert [run["method"] for run in runs] == ["plain", "lookup"]
    assert all(len(run["done_s"]) == len(PROMPTS) and run["tokens"] == 16 * len(PROMPTS) for run in runs)


def test_common_prefix_finds_the_first_difference_anywhere():
    rng = random.Random(3)
    for _ in range(2000):
        a = [rng.randrange(3) for _ in range(rng.randrange(40))]
        b = a[: rng.randrange(len(a) + 1)] + [rng.randrange(3) for _ in range(rng.randrange(40))]
        expected = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        assert common_prefix(a, b) == common_prefix(tuple(b), a) == expected
