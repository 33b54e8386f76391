"""`specrun bench` on tiny generated models: run order, cache resets, JSON/CSV/plot outputs,
consistent numbers, and errors that leave no file behind."""

import csv
import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from specrun.bench.methods import drafter, plan_variants
from specrun.bench.runner import measure, run_variant
from specrun.cli import run_app
from specrun.config import SessionConfig
from specrun.core.sampling import SamplerSettings
from specrun.session import Session

PROMPTS = [
    "the cat sat on the mat and the cat sat on the",
    "hello world , the dog was there and the dog was",
    "I see the water , I see the water and I",
]

GREEDY = SamplerSettings()


def specrun(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "specrun", *map(str, args)], capture_output=True, text=True, timeout=300, env=env
    )


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(PROMPTS) + "\n")
    return path


def test_runs_interleave_and_reuse_contexts_with_emptied_caches(tiny):
    config = SessionConfig(target=tiny["target"], draft=tiny["same"], k=4, n_ctx=256)
    variants = plan_variants(["lookup", "draft", "hybrid"], [2, 4])
    with Session(config) as session:
        contexts = (session.target, session.drafter.context)
        prompts = [session.tokenize(text) for text in PROMPTS[:2]]
        runs = list(measure(session, prompts, variants, SamplerSettings(), max_tokens=10, repeat=2, warmup=1))
        assert (session.target, session.drafter.context) == contexts
        # Computed apart from the bench: each method's tokens, and plain's, from fresh generators.
        same_tokens_as_plain = {(i, PLAIN_VARIANT): None for i in range(len(prompts))}
        for i, prompt in enumerate(prompts):
            plain = generated(session, PLAIN_VARIANT, prompt)
            for variant in variants[1:]:
                same_tokens_as_plain[(i, variant)] = generated(session, variant, prompt) == plain
    assert [(r.prompt_index, r.repeat, r.variant) for r in runs] == [
        (p, rep, v) for p in range(2) for rep in range(2) for v in variants
    ]
    for run in runs:
        assert run.stats.prefilled_tokens == run.stats.prompt_tokens  # nothing reused from the last run
        assert run.stats.tokens == 10 and run.stats.accepted <= run.stats.drafted
        assert run.matches_plain == same_tokens_as_plain[(run.prompt_index, run.variant)]
    draft_runs = [r.stats for r in runs if r.variant.method in ("draft", "hybrid")]
    # The draft has the target's weights: almost every guess is accepted (batched FP aside).
    assert sum(s.accepted for s in draft_runs) / sum(s.drafted for s in draft_runs) > 0.8


def generated(session, variant, prompt, settings=GREEDY, seed=0):
    """The tokens one run of `variant` produces, from a generator made here, not by the bench."""
    source = drafter(session, variant.method)
    session.target.truncate(0)
    if source is not None:
        source.rollback([])
    generator = session.engine(plain=source is None, policy=variant.k, sampler=replace(settings, seed=seed), drafter=source)
    return generator.run(prompt, 10).tokens


PLAIN_VARIANT = plan_variants([], [])[0]


def test_same_seed_gives_a_deterministic_drafter_the_tokens_of_plain_at_temperature(tiny):
    """Sample-and-match draws one number per emitted token, as plain decoding does: with the
    bench's shared seed, lookup and a greedy draft model reproduce plain's tokens exactly."""
    config = SessionConfig(target=tiny["target"], draft=tiny["draft"], k=4, n_ctx=256, draft_sampling=False)
    variants = plan_variants(["lookup", "draft", "hybrid"], [2, 4])
    for seed in (7, 8, 9):
        settings = SamplerSettings(temperature=0.8, seed=seed)
        with Session(replace(config, sampler=settings)) as session:
            prompt = session.tokenize(PROMPTS[0])
            streams = {variant: run_variant(session, variant, prompt, settings, seed, 12) for variant in variants}
        plain_tokens = streams[PLAIN_VARIANT][0]
        assert len(plain_tokens) == 12
        assert sum(stats.drafted for _, stats in streams.values()) > 0
        for variant, (tokens, _) in streams.items():
            assert tokens == plain_tokens, variant.label


def test_json_csv_and_plot_from_a_tiny_run(tiny, prompts_file, tmp_path):
    pytest.importorskip("matplotlib", reason="--plot needs matplotlib (in specrun's test extra)")
    out = {kind: tmp_path / f"out.{kind}" for kind in ("json", "csv", "png")}
    result = specrun(
        "bench",
        prompts_file,
        "--target",
        tiny["target"],
        "--draft",
        tiny["same"],
        "--k",
        "2,auto",
        "-n",
        10,
        "--repeat",
        2,
        "--warmup",
        0,
        "--ctx-size",
        256,
        "--json",
        out["json"],
        "--csv",
        out["csv"],
        "--plot",
        out["png"],
    )
    assert result.returncode == 0, result.stderr
    assert "recommendation:" in result.stdout and "Summary" in result.stdout
    assert "bench: 3 prompts" in result.stderr and "greedy" in result.stderr
    document = json.loads(out["json"].read_text())
    check_document(document, n_prompts=3, keys=["lookup_k2", "lookup_kauto", "draft_k2", "draft_kauto"], repeat=2)
    rows = list(csv.DictReader(out["csv"].open()))
    assert len(rows) == 3 * 5
    assert {(r["prompt"], r["method"], r["k"]) for r in rows} == {
        (str(p), m, str(k))
        for p in range(3)
        for m, k in [("plain", 0), ("lookup", 2), ("lookup", "auto"), ("draft", 2), ("draft", "auto")]
    }
    for r in rows:
        prompt = document["prompts"][int(r["prompt"])]
        source = prompt["plain"] if r["method"] == "plain" else prompt["results"][f"{r['method']}_k{r['k'].replace('.', '')}"]
        assert float(r["tokens_per_s"]) == pytest.approx(source["tokens_per_s"])
    assert out["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob(".*partial*"))


def test_an_80_column_terminal_gets_whole_headers_and_a_short_chart(tiny, prompts_file):
    # Two methods at four k: too many columns for one per-prompt table (tests/test_bench_view.py has long drafts).
    result = specrun(
        "bench",
        prompts_file,
        "--target",
        tiny["target"],
        "--draft",
        tiny["same"],
        "--k",
        "2,4,8,auto",
        "-n",
        24,
        "--warmup",
        0,
        "--ctx-size",
        256,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(map(len, lines)) <= 80 and not [line for line in lines if "…" in line]
    chart = lines[lines.index("Acceptance by draft position (each method at its largest k)") + 1 :]
    chart = chart[: next(i for i, line in enumerate(chart) if line.startswith("of N drafts"))]
    heads = [i for i, line in enumerate(chart) if not line.startswith("  pos ")]
    assert [chart[i] for i in heads] == ["lookup k=auto", "draft k=auto"]
    assert all(end - start <= 12 for start, end in zip(heads, [*heads[1:], len(chart)]))
    summary = lines.index(next(line for line in lines if line.strip() == "Summary"))
    assert sum(line.startswith("┏") for line in lines[:summary]) >= 2  # per-prompt tables: one or more per method


def check_document(document, n_prompts, keys, repeat):
    assert set(document) >= {"config", "summary", "plain", "prompts"}
    assert list(document["summary"]) == keys
    assert document["plain"]["tokens_per_s"] > 0
    for key, row in document["summary"].items():
        assert key == f"{row['method']}_k{str(row['k']).replace('.', '')}"
        assert set(row) >= {
            "method",
            "k",
            "tokens_per_s",
            "speedup",
            "acceptance_rate",
            "mean_accepted_length",
            "acceptance_by_position",
        }
        assert row["speedup"] == pytest.approx(row["tokens_per_s"] / document["plain"]["tokens_per_s"])
        check_counts(row, row["k"])
    assert len(document["prompts"]) == n_prompts
    for prompt in document["prompts"]:
        assert prompt["plain"]["runs"] == repeat
        for row in prompt["results"].values():
            assert row["speedup"] == pytest.approx(row["tokens_per_s"] / prompt["plain"]["tokens_per_s"])
            assert row["runs"] == repeat
            check_counts(row, row["k"])
    assert document["config"]["speedup"] and document["peak_rss_mb"] > 0


def check_counts(row, k):
    k = k if isinstance(k, int) else 511  # auto and llama.cpp draft at most n_batch - 1
    assert 0 <= row["accepted"] <= row["drafted"]
    assert row["acceptance_rate"] == pytest.approx(row["accepted"] / row["drafted"] if row["drafted"] else 0)
    assert row["mean_accepted_length"] == pytest.approx(1 + row["accepted"] / row["drafts"] if row["drafts"] else 0)
    assert row["tokens_per_step"] == pytest.approx((row["tokens"] - row["runs"]) / row["steps"])  # the prefills give one each
    assert row["drafts"] == 0 or 1 <= row["mean_accepted_length"] <= k + 1
    assert len(row["acceptance_by_position"]) <= k
    assert all(0 <= rate <= 1 for rate in row["acceptance_by_position"])
    assert row["matches_plain"] is None or 0 <= row["matches_plain"] <= 1


def assert_one_line_error(result, *fragments):
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and "Traceback" not in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in lines[-1]


def test_draft_method_asked_for_without_a_draft_model(tiny, prompts_file):
    result = specrun("bench", prompts_file, "--target", tiny["target"], "--methods", "plain,draft")
    assert_one_line_error(result, "--methods includes draft", "--draft")
    result = specrun("bench", prompts_file, "--target", tiny["target"], "--methods", "hybrid")
    assert_one_line_error(result, "--methods includes hybrid", "--draft")


def test_default_methods_skip_draft_with_a_notice(tiny, prompts_file, tmp_path):
    out = tmp_path / "r.json"
    result = specrun(
        "bench", prompts_file, "--target", tiny["target"], "--k", 3, "-n", 6, "--warmup", 0, "--ctx-size", 256, "--json", out
    )
    assert result.returncode == 0, result.stderr
    assert "no --draft: skipping the draft method" in result.stderr
    assert list(json.loads(out.read_text())["summary"]) == ["lookup_k3"]


def test_prompt_too_long_for_the_context_names_the_line_and_writes_nothing(tiny, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("short one\n" + "the cat " * 200 + "\n")
    out = tmp_path / "r.json"
    result = specrun("bench", prompts, "--target", tiny["target"], "--ctx-size", 64, "--json", out)
    assert_one_line_error(result, "p.txt:2", "402 tokens", "--ctx-size")
    assert list(tmp_path.iterdir()) == [prompts]


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--json", "/nonexistent-folder/r.json"], ["--json", "does not exist"]),
        (["--k", "2,zero"], ["but is 'zero'"]),
        (["--repeat", "0"], ["--repeat has to be an integer >= 1"]),
        (["--set", "code"], ["either PROMPTS or --set"]),
    ],
)
def test_bad_options_fail_before_loading_anything(prompts_file, args, fragments):
    assert_one_line_error(specrun("bench", prompts_file, "--target", "/no/model.gguf", *args), *fragments)


def test_interrupt_leaves_no_output_file(tiny, prompts_file, tmp_path, monkeypatch):
    from specrun.cli import bench as bench_cli

    def interrupted(*args, **kwargs):
        yield from []
        raise KeyboardInterrupt

    monkeypatch.setattr(bench_cli, "measure", interrupted)
    before = set(tmp_path.iterdir())
    code = run_app(
        [
            "bench",
            str(prompts_file),
            "--target",
            str(tiny["target"]),
            "--json",
            str(tmp_path / "r.json"),
            "--csv",
            str(tmp_path / "r.csv"),
        ]
    )
    assert code == 130
    assert set(tmp_path.iterdir()) == before


@pytest.mark.gemma
def test_gemma_on_a_builtin_set(gemma, tmp_path):
    out = tmp_path / "r.json"
    result = specrun("bench", "--set", "chat", "--k", 4, "-n", 16, "--warmup", 0, "--ctx-size", 1024, "--json", out)
    assert result.returncode == 0, result.stderr
    assert "built-in sets: chat" in result.stderr
    document = json.loads(out.read_text())
    check_document(document, n_prompts=4, keys=["lookup_k4"], repeat=1)
    assert {p["group"] for p in document["prompts"]} == {"chat"}
    assert document["config"]["target"] == str(gemma)
