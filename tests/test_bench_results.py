"""Bench arithmetic on hand-made runs: medians, speed-ups, summary throughput, the verdict."""

import pytest

from specrun.bench.export import build_document, csv_rows
from specrun.bench.methods import Variant
from specrun.bench.results import Results, recommend
from specrun.bench.runner import Run
from specrun.core.events import Stats

PLAIN, LOOKUP = Variant("plain"), Variant("lookup", 4)


def stats(tokens, seconds, drafted=0, accepted=0, steps=None, by_position=((), ())):
    return Stats(
        tokens=tokens,
        prefills=1,
        generate_s=seconds,
        steps=steps or tokens - 1,
        drafted=drafted,
        accepted=accepted,
        drafts=by_position[0][0] if by_position[0] else 0,
        drafted_by_position=list(by_position[0]),
        accepted_by_position=list(by_position[1]),
        prompt_tokens=10,
        prefilled_tokens=9,
        prefill_s=0.1,
        draft_s=seconds / 10,
        verify_s=seconds / 2,
    )


def results_of(runs, n_prompts):
    results = Results([PLAIN, LOOKUP], n_prompts)
    for prompt, repeat, variant, s, match in runs:
        results.add(Run(prompt, repeat, variant, s, match, 100.0 + prompt))
    return results


def two_prompts():
    return results_of(
        [
            # prompt 0: plain 10 tok/s (three repeats, median 10); lookup 20 tok/s median
            (0, 0, PLAIN, stats(10, 1.0), None),
            (0, 0, LOOKUP, stats(10, 0.5, 8, 6, 4, ([4, 2, 1, 1], [3, 2, 1, 0])), True),
            (0, 1, PLAIN, stats(10, 2.0), None),
            (0, 1, LOOKUP, stats(10, 0.4, 8, 6, 4, ([4, 2, 1, 1], [3, 2, 1, 0])), True),
            (0, 2, PLAIN, stats(10, 0.5), None),
            (0, 2, LOOKUP, stats(10, 1.0, 8, 6, 4, ([4, 2, 1, 1], [3, 2, 1, 0])), False),
            # prompt 1: plain 40 tok/s, lookup 20 tok/s; nothing of lookup's drafts accepted
            (1, 0, PLAIN, stats(40, 1.0), None),
            (1, 0, LOOKUP, stats(40, 2.0, 4, 0, 40, ([4], [0])), True),
        ],
        n_prompts=2,
    )


def test_per_prompt_speedup_is_the_ratio_of_median_speeds():
    results = two_prompts()
    assert results.prompt_row(0, "plain")["tokens_per_s"] == 10.0
    row = results.prompt_row(0, "lookup_k4")
    assert row["tokens_per_s"] == 20.0 and row["speedup"] == 2.0
    assert row["acceptance_rate"] == 18 / 24 and row["mean_accepted_length"] == 1 + 18 / 12  # llama.cpp's: per draft
    assert row["tokens_per_step"] == (30 - 3) / 12  # per target decode, the prefills' first tokens left out
    assert row["acceptance_by_position"] == [9 / 12, 6 / 6, 3 / 3, 0.0]
    assert row["matches_plain"] == pytest.approx(2 / 3) and row["runs"] == 3
    assert results.prompt_row(1, "lookup_k4")["speedup"] == 0.5


def test_summary_is_total_tokens_over_total_time_at_median_speeds():
    results = two_prompts()
    # plain: prompt 0 takes 10 tokens / 10 tok/s = 1 s, prompt 1 takes 40 / 40 = 1 s -> 50 tokens in 2 s
    assert results.summary_row("plain")["tokens_per_s"] == 25.0
    # lookup: 10 / 20 = 0.5 s and 40 / 20 = 2 s -> 50 tokens in 2.5 s = 20 tok/s
    row = results.summary()["lookup_k4"]
    assert row["tokens_per_s"] == 20.0 and row["speedup"] == pytest.approx(20 / 25)
    assert row["method"] == "lookup" and row["k"] == 4
    assert row["acceptance_rate"] == 18 / 28
    assert row["acceptance_by_position"] == [9 / 16, 6 / 6, 3 / 3, 0.0]
    assert row["drafted_by_position"] == [16, 6, 3, 3] and row["accepted_by_position"] == [9, 6, 3, 0]
    assert results.peak_rss_mb == 101.0


def test_document_and_csv_shapes():
    document = build_document(two_prompts(), {"note": "x"}, [{"source": "a:1", "group": "a", "prompt_tokens": 10}] * 2)
    assert list(document) == ["config", "summary", "plain", "prompts", "recommendation", "peak_rss_mb"]
    assert list(document["summary"]) == ["lookup_k4"]
    assert document["prompts"][1]["results"]["lookup_k4"]["speedup"] == 0.5
    rows = csv_rows(document)
    assert [(r["prompt"], r["method"], r["k"]) for r in rows] == [
        (0, "plain", 0),
        (0, "lookup", 4),
        (1, "plain", 0),
        (1, "lookup", 4),
    ]
    assert rows[1]["acceptance_by_position"] == "0.7500;1.0000;1.0000;0.0000"


def row(method, k, speedup, acceptance=0.5, length=2.0, draft_share=0.1):
    return {
        "method": method,
        "k": k,
        "speedup": speedup,
        "acceptance_rate": acceptance,
        "mean_accepted_length": length,
        "tokens_per_step": length,
        "draft_share": draft_share,
    }


def test_recommendation_names_the_best_and_why():
    line = recommend({"lookup_k4": row("lookup", 4, 1.10), "lookup_k8": row("lookup", 8, 1.40, 0.62, 3.1, 0.02)})
    assert line.startswith("lookup k=8: 1.40x plain")
    assert "62% of drafted tokens accepted" in line and "3.10 tokens per target decode" in line
    assert "each step costing 2.2x a plain decode" in line  # 3.10 tokens per step / 1.40x
    assert "noise" not in line


def test_recommendation_prefers_plain_when_nothing_beats_it_beyond_noise():
    line = recommend({"draft_k4": row("draft", 4, 0.80, 0.2, 1.3, 0.45), "lookup_k4": row("lookup", 4, 0.7)})
    assert line.startswith("plain decoding: no method beat it") and "draft k=4 at 0.80x" in line
    assert "drafting 45% of the time" in line
    assert recommend({"a": row("lookup", 4, 1.04)}).startswith("plain decoding")


def test_recommendation_flags_a_runner_up_within_noise():
    assert "lookup k=8 is within noise" in recommend({"a": row("lookup", 4, 1.20), "b": row("lookup", 8, 1.18)})
    assert "noise" not in recommend({"a": row("lookup", 4, 1.20), "b": row("lookup", 8, 1.10)})
    assert recommend({}).startswith("only plain decoding was measured")
