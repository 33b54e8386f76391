"""`pair suggest`: compatible, cheaper drafts from the cache and a (local) hub search."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from pair_hub_server import serve
from tinymodels import write_tiny_llama

from specrun.cli import run_app
from specrun.headers.read import read_local
from specrun.pair.check import acceptance_prior, check_pair


@pytest.fixture
def env(tmp_path: Path, monkeypatch):
    """Isolated HF cache, specrun cache and config; a fake hub with three llama repos."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "no-tokens"))
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    models = tmp_path / "models"
    shape = dict(n_embd=128, n_ff=256)
    target = write_tiny_llama(models / "target.gguf", n_layer=6, **shape)
    small = write_tiny_llama(models / "small.gguf", n_layer=1, **shape, seed=1)
    other = write_tiny_llama(models / "other.gguf", vocab="different", n_layer=1, **shape)
    big = write_tiny_llama(models / "big.gguf", n_layer=8, **shape, seed=2)
    cached = write_tiny_llama(tmp_path / "cache" / "specrun" / "mine.gguf", n_layer=3, **shape)
    with serve() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        hub.add("org/tiny-llama-small-GGUF", "tiny-llama-small-Q4_K_M.gguf", small)
        hub.add("org/tiny-llama-other-GGUF", "tiny-llama-other-Q4_K_M.gguf", other)
        hub.add("org/tiny-llama-big-GGUF", "tiny-llama-big-Q8_0.gguf", big)
        yield {"hub": hub, "target": target, "cached": cached}


def suggest(capsys, *args: str) -> tuple[int, dict, str]:
    code = run_app(["pair", "suggest", *map(str, args), "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out else {}, err


def test_ranks_compatible_cheaper_drafts_from_hub_and_cache(env, capsys) -> None:
    code, report, err = suggest(capsys, "--target", env["target"])
    assert code == 0, err
    drafts = {d["draft"]: d for d in report["drafts"]}
    small = "org/tiny-llama-small-GGUF/tiny-llama-small-Q4_K_M.gguf"
    assert set(drafts) == {small, str(env["cached"])}  # not the other vocab, not the bigger
    assert drafts[small]["origin"] == "hub" and drafts[str(env["cached"])]["origin"] == "cache"
    # The 1-layer draft is cheaper than the 3-layer one: ranked first, higher speed-up.
    assert report["drafts"][0]["draft"] == small
    assert drafts[small]["predicted_speedup"] > drafts[str(env["cached"])]["predicted_speedup"]
    for d in report["drafts"]:
        assert d["compatible"] and 0 < d["cost_ratio"] < 1 and d["memory_bytes"] > 0
        assert d["k"] >= 1 and d["acceptance_prior"] == 0.7


def test_offline_uses_only_local_files(env, capsys) -> None:
    code, report, _ = suggest(capsys, "--target", env["target"], "--offline")
    assert code == 0
    assert [d["draft"] for d in report["drafts"]] == [str(env["cached"])]
    assert env["hub"].requests == []


def test_a_file_on_disk_with_another_vocabulary_is_offered_translated(env, capsys, tmp_path: Path) -> None:
    shape = dict(n_embd=128, n_ff=256)
    cache = tmp_path / "cache" / "specrun"
    foreign = write_tiny_llama(cache / "foreign.gguf", vocab="different", n_layer=1, **shape)
    write_tiny_llama(cache / "alien.gguf", vocab="alien", n_layer=1, **shape)  # shares almost nothing
    code, report, err = suggest(capsys, "--target", env["target"], "--offline")
    assert code == 0, err
    drafts = {d["draft"]: d for d in report["drafts"]}
    assert set(drafts) == {str(env["cached"]), str(foreign)}
    assert drafts[str(foreign)]["translated"] and drafts[str(foreign)]["translation"]["usable"]
    assert not drafts[str(env["cached"])]["translated"]
    assert run_app(["pair", "suggest", "--target", str(env["target"]), "--offline"]) == 0
    assert f"{foreign} (cache, translated)" in capsys.readouterr().out


def test_top_limits_the_list(env, capsys) -> None:
    code, report, _ = suggest(capsys, "--target", env["target"], "--top", "1")
    assert code == 0 and len(report["drafts"]) == 1


def test_human_output_states_the_model(env, capsys) -> None:
    assert run_app(["pair", "suggest", "--target", str(env["target"])]) == 0
    out = capsys.readouterr().out
    assert "speed-up is predicted, not measured" in out and "(hub)" in out


def test_finetuned_target_is_flagged(tmp_path: Path) -> None:
    base = read_local(write_tiny_llama(tmp_path / "base.gguf", n_layer=2))
    draft = read_local(write_tiny_llama(tmp_path / "draft.gguf", n_layer=1))
    tuned = replace(
        base,
        meta={
            **base.meta,
            "general.finetune": "Instruct",
            "general.base_model.count": 1,
            "general.base_model.0.repo_url": "https://huggingface.co/org/base",
        },
    )
    result = check_pair(tuned, draft)
    assert any("fine-tuned (instruct) from org/base: prefer a draft tuned the same way" in w for w in result.warnings())
    assert acceptance_prior(tuned, draft).alpha < acceptance_prior(base, draft).alpha
    same_tune = replace(draft, meta={**draft.meta, "general.finetune": "instruct"})
    assert not any("fine-tuned" in w for w in check_pair(tuned, same_tune).warnings())


def test_a_trained_drafter_is_offered_to_its_own_target_alone(capsys, tmp_path: Path, monkeypatch) -> None:
    """qwen3.6-27b lists its DFlash drafter first among its drafts, judged from the profiles
    offline; qwen3.6-35b-a3b, of the same family and tokenizer, is not offered it."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    code, report, err = suggest(capsys, "--target", "qwen3.6-27b", "--offline")
    assert code == 0, err
    drafter = next(d for d in report["drafts"] if d["draft"] == "qwen3.6-27b-dflash")
    assert drafter["acceptance_prior_reason"] == "a DFlash drafter trained for qwen3.6-27b, per the profiles"
    code, report, err = suggest(capsys, "--target", "qwen3.6-35b-a3b", "--offline")
    assert code == 0 and "qwen3.6-27b-dflash" not in {d["draft"] for d in report["drafts"]}, err
