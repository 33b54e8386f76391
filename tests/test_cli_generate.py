"""`specrun generate` as a user runs it: real subprocesses, exit codes, one-line errors."""

import json
import subprocess
import sys

import pytest

PROMPT = "the cat sat on the mat and the cat sat on the"


def specrun(*args, stdin=None):
    return subprocess.run(
        [sys.executable, "-m", "specrun", *map(str, args)],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
    )


def assert_one_line_error(result, code, *fragments):
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_json_output_with_compare_plain(tiny):
    result = specrun(
        "generate",
        PROMPT,
        "--target",
        tiny["target"],
        "--draft",
        tiny["draft"],
        "--k",
        3,
        "--max-tokens",
        12,
        "--ctx-size",
        256,
        "--compare-plain",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert len(out["tokens"]) == 12 and isinstance(out["text"], str)
    stats = out["stats"]
    for key in ("steps", "drafted", "accepted", "acceptance_rate", "mean_accepted_length", "tokens_per_s"):
        assert key in stats
    assert stats["accepted"] <= stats["drafted"]
    assert set(out["plain"]) >= {"text", "tokens_per_s"}
    assert out["speedup"] == pytest.approx(stats["tokens_per_s"] / out["plain"]["tokens_per_s"])
    assert isinstance(out["matches_plain"], bool)


def test_prompt_from_stdin_streams_text(tiny):
    result = specrun("generate", "--target", tiny["target"], "--lookup", "-n", 8, stdin=PROMPT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    assert "tok/s" in result.stderr


def test_missing_model_file(tmp_path):
    assert_one_line_error(
        specrun("generate", "x", "--target", tmp_path / "nope.gguf", "--lookup"), 2, "no such model file", "nope.gguf"
    )


def test_file_that_is_not_gguf(tmp_path):
    bogus = tmp_path / "model.gguf"
    bogus.write_text("hello, I am not a model")
    assert_one_line_error(specrun("generate", "x", "--target", bogus, "--lookup"), 2, "not a GGUF file")


def test_truncated_gguf(tmp_path, tiny):
    data = tiny["target"].read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])
    assert_one_line_error(specrun("generate", "x", "--target", cut, "--lookup"), 2, "could not load", "truncated")


def test_a_draft_sharing_almost_nothing_exits_2_with_the_reason(tiny):
    result = specrun("generate", "x", "--target", tiny["target"], "--draft", tiny["alien"])
    assert_one_line_error(result, 2, "alien.gguf shares almost no tokens with target target.gguf", "0 of its 400")


@pytest.mark.parametrize(
    "args, fragment",
    [(["--k", "0"], "--k has to be an integer >= 1, 'auto' or 'llama.cpp', but is '0'"), (["--max-tokens", "0"], "--max-tokens")],
)
def test_bad_numbers(tiny, args, fragment):
    assert_one_line_error(specrun("generate", "x", "--target", tiny["target"], "--lookup", *args), 2, fragment)


def test_draft_and_lookup_together_draft_hybrid(tiny):
    result = specrun("generate", PROMPT, "--target", tiny["target"], "--lookup", "--draft", tiny["draft"], "-n", 10, "--json")
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)["tokens"]) == 10


def test_no_prompt(tiny):
    assert_one_line_error(specrun("generate", "--target", tiny["target"], "--lookup", stdin=""), 2, "no prompt")


def test_doctor_reports_backends_and_versions():
    result = specrun("doctor", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert "CPU" in report["backends"]
    assert report["llama_cpp_python"].startswith("0.3.")
    assert isinstance(report["gpu_offload"], bool)
    assert report["verify_costs"].endswith("verify-costs.json")
    assert report["recurrent_snapshots"] == {"fixed_k": "k", "auto": 16, "llama.cpp": 16}
    if not report["gpu_offload"]:
        assert "GGML_CUDA=on" in report["gpu_build_hint"] or "GGML_METAL=on" in report["gpu_build_hint"]
