"""`specrun pull` and `specrun models` through the CLI boundary, against the fake hub."""

from __future__ import annotations

import json

from hub_fixtures import gguf_bytes

from specrun.cli import run_app

LLAMA_1B = "bartowski/Llama-3.2-1B-Instruct-GGUF"
FILES = {
    "Llama-3.2-1B-Instruct-Q4_K_M.gguf": gguf_bytes("q4", 4000),
    "Llama-3.2-1B-Instruct-Q8_0.gguf": gguf_bytes("q8", 8000),
}


def test_pull_prints_the_path_on_stdout_and_the_reason_on_stderr(fake_hub, capsys):
    fake_hub.add_repo(LLAMA_1B, FILES)
    assert run_app(["pull", "llama-1b:Q8_0"]) == 0
    out, err = capsys.readouterr()
    assert out.strip().endswith("Llama-3.2-1B-Instruct-Q8_0.gguf")
    assert "llama-1b: Q8_0" in err and "as asked" in err


def test_pull_error_is_one_line_and_a_non_zero_exit(fake_hub, capsys):
    fake_hub.add_repo(LLAMA_1B, FILES, gated=True)
    assert run_app(["pull", "llama-1b:Q4_K_M"]) != 0
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: ") and "gated" in err
    assert "Traceback" not in err and err.count("\n") == 1


def test_models_lists_the_cache_as_json(fake_hub, capsys):
    fake_hub.add_repo(LLAMA_1B, FILES)
    fake_hub.add_repo("someone/Other-GGUF", {"other-Q5_K_M.gguf": gguf_bytes("o", 5000)})
    assert run_app(["pull", "llama-1b:Q4_K_M", "someone/Other-GGUF:Q5_K_M"]) == 0
    capsys.readouterr()
    assert run_app(["models", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    summary = [(r["alias"], r["repo"], r["quant"], r["size"], r["complete"]) for r in rows]
    assert summary == [
        ("llama-1b", LLAMA_1B, "Q4_K_M", 4000, True),
        (None, "someone/Other-GGUF", "Q5_K_M", 5000, True),
    ]
    assert rows[0]["path"].endswith("Llama-3.2-1B-Instruct-Q4_K_M.gguf")


def test_models_table_and_empty_cache(fake_hub, capsys):
    assert run_app(["models"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and "no GGUF models" in err
    fake_hub.add_repo(LLAMA_1B, FILES)
    run_app(["pull", "llama-1b:Q4_K_M"])
    capsys.readouterr()
    assert run_app(["models"]) == 0
    out = capsys.readouterr().out
    assert "llama-1b" in out and "Q4_K_M" in out and "4.0 kB" in out


def test_models_aliases(isolated, capsys):
    assert run_app(["models", "--aliases", "--json"]) == 0
    rows = {r["alias"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["llama-70b"]["drafts"] == ["llama-1b", "llama-3b", "llama-8b"]


def test_generate_downloads_a_hub_target_and_runs_it(fake_hub, tmp_path, capsys):
    from tinymodels import write_tiny_llama

    weights = write_tiny_llama(tmp_path / "tiny.gguf").read_bytes()
    fake_hub.add_repo("someone/Tiny-GGUF", {"tiny-F32.gguf": weights})
    code = run_app(["generate", "the", "--target", "someone/Tiny-GGUF:F32", "-n", "4", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert len(json.loads(out)["tokens"]) == 4
    assert "someone/Tiny-GGUF: F32" in err and len(fake_hub.downloads()) == 1


def test_generate_reports_a_missing_cached_model_in_one_line(isolated, capsys):
    assert run_app(["generate", "the", "--target", "llama-1b:Q4_K_M", "--offline"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: llama-1b:Q4_K_M: ") and "specrun pull llama-1b:Q4_K_M" in err
