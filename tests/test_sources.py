"""Draft sources by name: the suffix copy, and a source of one's own that reaches the library, the
CLI and bench through its one `register` call."""

import json
import subprocess
import sys
from typing import Sequence

import numpy as np
import pytest

import specrun
from specrun.cli import run_app
from specrun.core.drafting import Draft, DraftRequest, drafted, without_decodes
from specrun.core.policy import FixedK
from specrun.core.sampling import Sampler, SamplerSettings
from specrun.drafts import registry
from specrun.drafts.suffix import SuffixCopy, longest_match

COUNTING = "1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2,"
GREEDY = Sampler.seeded(SamplerSettings())


def test_the_longest_match_wins_and_the_latest_of_equals():
    # "1 2 3" ends the text: it occurred at 1..3 (3 tokens agree) and "2 3" at 5..6 (2 agree).
    assert longest_match(np.array([5, 1, 2, 3, 9, 2, 3, 7, 1, 2, 3]), 64) == (3, 3)
    # "7 1 2" occurred twice before, as long each time: the later one.
    assert longest_match(np.array([7, 1, 2, 8, 7, 1, 2, 9, 7, 1, 2]), 64) == (6, 3)
    assert longest_match(np.array([7, 1, 2, 8, 7, 1, 2, 9, 7, 1, 2]), 2) == (6, 2)  # capped: the latest that far
    assert longest_match(np.array([4, 5, 6]), 64) == (-1, 0)
    assert longest_match(np.array([4]), 64) == (-1, 0)


def test_suffix_copies_what_followed_and_follows_a_changed_history():
    source = SuffixCopy()
    history = [7, 1, 2, 8, 7, 1, 2, 9, 7, 1, 2]
    assert drafted(source, history, DraftRequest(3, FixedK(3), GREEDY)).tokens == [9, 7, 1]
    assert drafted(source, [3, 4, 5, 3, 4], DraftRequest(3, FixedK(3), GREEDY)).tokens == [5, 3, 4]  # a new text
    assert drafted(source, [3, 4, 5, 6], DraftRequest(3, FixedK(3), GREEDY)).tokens == []  # one token agreeing is not enough


def test_the_suffix_source_drafts_for_a_session_and_keeps_greedy_output(gemma):
    with specrun.load(gemma, sources=["suffix"], k=4, n_ctx=512) as session:
        speculative = session.generate(COUNTING, 24)
        plain = session.generate(COUNTING, 24, plain=True)
    assert speculative.tokens == plain.tokens
    assert speculative.stats.accepted_by_source.get("suffix", 0) > 0


def test_the_cli_and_bench_reach_the_suffix_source(gemma, tmp_path):
    generate = subprocess.run(
        [sys.executable, "-m", "specrun", "generate", COUNTING, "--target", gemma, "--source", "suffix"]
        + ["--k", "4", "-n", "16", "--ctx-size", "512", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert generate.returncode == 0, generate.stderr
    assert json.loads(generate.stdout)["stats"]["accepted_by_source"]["suffix"] > 0
    (tmp_path / "prompts.txt").write_text(COUNTING + "\n")
    bench = subprocess.run(
        [sys.executable, "-m", "specrun", "bench", tmp_path / "prompts.txt", "--target", gemma, "--methods", "plain,suffix"]
        + ["--k", "4", "--max-tokens", "8", "--warmup", "0", "--json", tmp_path / "bench.json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bench.returncode == 0, bench.stderr
    assert "suffix_k4" in (tmp_path / "bench.json").read_text()


class Again:
    """A source of one's own, for the test: it guesses the last token again."""

    names = ("again",)
    counters = ()
    parts = ()
    runs_model = False
    asked = 0

    @without_decodes
    def propose(self, history: Sequence[int], request: DraftRequest) -> Draft:
        Again.asked += 1
        return Draft.under(request.offer(self.names[0], 1), [history[-1]])

    def rollback(self, history: Sequence[int]) -> None:
        pass


@pytest.fixture
def again(monkeypatch):
    """`again` registered as a module of one's own would register it, for this test only."""
    monkeypatch.setattr(registry, "_KINDS", dict(registry._KINDS))
    registry.register("again", lambda site: Again())
    Again.asked = 0


def test_a_registered_source_reaches_the_library_the_cli_and_bench(again, tiny, tmp_path, capsys):
    with specrun.load(tiny["target"], sources=["again"], k=2, n_ctx=256) as session:
        assert session.generate("the cat sat", 6).stats.drafts > 0
    asked = Again.asked
    common = ["--target", tiny["target"], "--k", "2", "--ctx-size", "256"]
    assert run_app(["generate", "the cat sat", "--source", "again", "-n", "6", "--json", *common]) == 0
    assert json.loads(capsys.readouterr().out)["stats"]["drafts"] > 0 and Again.asked > asked
    (tmp_path / "prompts.txt").write_text("the cat sat\n")
    out, asked = tmp_path / "bench.json", Again.asked
    assert (
        run_app(
            ["bench", str(tmp_path / "prompts.txt"), "--methods", "plain,again", "--max-tokens", "6", "--json", str(out), *common]
        )
        == 0
    )
    assert json.loads(out.read_text())["summary"]["again_k2"]["method"] == "again" and Again.asked > asked


def test_an_unknown_source_is_one_line_before_anything_loads(tiny):
    result = subprocess.run(
        [sys.executable, "-m", "specrun", "generate", "hi", "--target", tiny["target"], "--source", "nope"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert "unknown draft source 'nope'" in result.stderr and "suffix" in result.stderr


def test_bench_asks_for_a_source_as_a_method(capsys):
    assert run_app(["bench", "--source", "suffix", "--target", "unused.gguf"]) != 0
    assert "give --methods plain,suffix instead of --source" in capsys.readouterr().err
