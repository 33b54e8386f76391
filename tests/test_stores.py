"""Models other tools keep (Ollama, LM Studio, llama.cpp), in their real layouts, read-only.

The stores hold the vocab-only GGUFs under tests/data (and tiny llamas where a cost must
be computed); a fake hub on localhost counts requests to prove nothing went online.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest
from store_layouts import (
    GPT2_VOCAB,
    LLAMA_VOCAB,
    hf_layout_file,
    llamacpp_flat_file,
    lmstudio_file,
    ollama_manifest,
    ollama_model,
    ollama_tensor_model,
    snapshot,
)
from tinymodels import write_tiny_llama

from specrun.cli import run_app
from specrun.errors import SpecrunError
from specrun.hub import resolve_model
from specrun.hub.resolve import resolve_pair

LLAMA_1B = "bartowski/Llama-3.2-1B-Instruct-GGUF"
LLAMA_3B = "bartowski/Llama-3.2-3B-Instruct-GGUF"
LLAMA_8B = "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF"


def blob_of(data_file: Path, root: Path) -> Path:
    return root / "blobs" / f"sha256-{hashlib.sha256(data_file.read_bytes()).hexdigest()}"


@pytest.fixture
def stores(fake_hub, tmp_path, monkeypatch):
    """Ollama, LM Studio and a LLAMA_CACHE folder, each holding models in its own layout."""
    ollama, lmstudio, llama_cache = tmp_path / "ollama", tmp_path / "home" / ".lmstudio", tmp_path / "llama-cache"
    monkeypatch.setenv("OLLAMA_MODELS", str(ollama))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LLAMA_CACHE", str(llama_cache))
    ollama_model(ollama, "llama3.2", "1b", LLAMA_VOCAB, extra=("projector", "template", "license", "params"))
    ollama_model(ollama, "gpt2", "latest", GPT2_VOCAB, family="gpt2", file_type="F16")
    ollama_model(ollama, "Llama-3.2-3B-Instruct-GGUF", "Q8_0", LLAMA_VOCAB, file_type="Q8_0", host="hf.co", namespace="bartowski")
    ollama_tensor_model(ollama, "newformat", "latest")
    lm_file = lmstudio_file(lmstudio / "models", LLAMA_1B, "Llama-3.2-1B-Instruct-Q4_K_M.gguf", LLAMA_VOCAB)
    lmstudio_file(lmstudio / "models", LLAMA_1B, "mmproj-Llama-3.2-1B-f16.gguf", GPT2_VOCAB)
    lmstudio_file(lmstudio / "models", LLAMA_1B, "README.md", b"# notes")
    cached = hf_layout_file(llama_cache, LLAMA_8B, "Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf", LLAMA_VOCAB)
    return {
        "ollama": ollama,
        "lmstudio": lmstudio / "models",
        "llama_cache": llama_cache,
        "lm_file": lm_file,
        "cached": cached,
        "hub": fake_hub,
    }


def cli_json(capsys, *args: str) -> tuple[int, object, str]:
    code = run_app([*args, "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else None, err


def test_models_lists_every_store_beside_the_hf_cache(stores, capsys):
    code, rows, err = cli_json(capsys, "models")
    assert code == 0, err
    by_name = {(r["source"], r["name"]): r for r in rows}
    assert set(by_name) == {
        ("ollama", "llama3.2:1b"),
        ("ollama", "gpt2:latest"),
        ("ollama", f"hf.co/{LLAMA_3B}:Q8_0"),
        ("ollama", "newformat:latest"),
        ("lmstudio", f"{LLAMA_1B}/Llama-3.2-1B-Instruct-Q4_K_M.gguf"),  # not its mmproj or README
        ("llama.cpp", LLAMA_8B),
    }
    llama = by_name[("ollama", "llama3.2:1b")]
    assert llama["path"] == str(blob_of(LLAMA_VOCAB, stores["ollama"]))  # the model layer, not the projector
    assert (llama["quant"], llama["family"], llama["size"], llama["usable"]) == (
        "Q4_K_M",
        "llama",
        LLAMA_VOCAB.stat().st_size,
        True,
    )
    hub_pull = by_name[("ollama", f"hf.co/{LLAMA_3B}:Q8_0")]
    assert (hub_pull["repo"], hub_pull["alias"], hub_pull["quant"]) == (LLAMA_3B, "llama-3b", "Q8_0")
    tensors = by_name[("ollama", "newformat:latest")]
    assert not tensors["usable"] and tensors["path"] is None and "separate tensor layers" in tensors["problem"]
    lm = by_name[("lmstudio", f"{LLAMA_1B}/Llama-3.2-1B-Instruct-Q4_K_M.gguf")]
    assert (lm["alias"], lm["family"], lm["path"]) == ("llama-1b", "llama", str(stores["lm_file"]))
    assert by_name[("llama.cpp", LLAMA_8B)]["alias"] == "llama-8b"
    assert run_app(["models"]) == 0
    table = capsys.readouterr().out
    assert "lmstudio" in table and "llama.cpp" in table and "not usable: a newer Ollama" in table
    assert stores["hub"].requests == []


def test_old_flat_llamacpp_folder_is_listed_and_used(fake_hub, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("LLAMA_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    flat = tmp_path / "xdg" / "llama.cpp"
    chosen = llamacpp_flat_file(flat, LLAMA_1B, "Llama-3.2-1B-Instruct-Q8_0.gguf", "Q8_0", LLAMA_VOCAB)
    (flat / "loose-model.gguf").write_bytes(GPT2_VOCAB.read_bytes())  # from -mu URL, no manifest
    (flat / "partial.gguf.downloadInProgress").write_bytes(b"GGUF")
    code, rows, _ = cli_json(capsys, "models")
    assert code == 0
    summary = {(r["name"], r["repo"], r["alias"], r["quant"], r["path"]) for r in rows}
    assert summary == {
        (f"{LLAMA_1B}:Q8_0", LLAMA_1B, "llama-1b", "Q8_0", str(chosen)),
        ("loose-model.gguf", None, None, None, str(flat / "loose-model.gguf")),
    }
    model = resolve_model("llama-1b:Q8_0", show_progress=False)
    assert model.path == chosen and "llama.cpp's cache" in model.reason and fake_hub.requests == []


def test_alias_or_repo_spec_uses_a_stored_file_instead_of_downloading(stores):
    hub = stores["hub"]
    lm = resolve_model("llama-1b:Q4_K_M", show_progress=False)
    assert lm.path == stores["lm_file"] and lm.store == "lmstudio" and lm.quant == "Q4_K_M"
    assert "already on disk in LM Studio's models" in lm.reason
    assert resolve_model("llama-1b", show_progress=False).path == stores["lm_file"]  # no quant: what is stored
    pulled = resolve_model(f"{LLAMA_3B}:Q8_0", show_progress=False)
    assert pulled.path == blob_of(LLAMA_VOCAB, stores["ollama"]) and pulled.store == "ollama"
    assert resolve_model("llama-8b:Q4_K_M", show_progress=False).path == stores["cached"]
    named = resolve_model(f"{LLAMA_1B}/Llama-3.2-1B-Instruct-Q4_K_M.gguf", show_progress=False)
    assert named.path == stores["lm_file"]
    assert hub.requests == []
    lines: list[str] = []
    resolve_pair("llama-8b:Q4_K_M", "llama-1b:Q4_K_M", report=lines.append)
    assert len(lines) == 2 and all("already on disk" in line for line in lines)
    # A quant no store has goes to the hub as before (which has no such repository here).
    with pytest.raises(SpecrunError, match="no repository"):
        resolve_model("llama-1b:Q8_0", show_progress=False)
    assert hub.requests


def test_ollama_spec_names_the_model_layer(stores):
    model = resolve_model("ollama:llama3.2:1b")
    assert model.path == blob_of(LLAMA_VOCAB, stores["ollama"]) and model.quant == "Q4_K_M"
    assert model.reason.startswith("ollama:llama3.2:1b: Q4_K_M") and "Ollama's store" in model.reason
    assert resolve_model("ollama:gpt2").path == blob_of(GPT2_VOCAB, stores["ollama"])  # tag latest
    assert resolve_model(f"ollama:hf.co/{LLAMA_3B}:Q8_0").alias == "llama-3b"
    with pytest.raises(SpecrunError, match="holds Q4_K_M, not Q8_0"):
        resolve_model("ollama:llama3.2:1b", quant="Q8_0")
    assert stores["hub"].requests == []


def test_broken_ollama_models_get_one_clear_line(stores, capsys):
    root = stores["ollama"]
    ollama_manifest(root, "registry.ollama.ai/library/broken/latest", "{not json")
    ollama_model(root, "noblob", "latest", b"GGUF" + b"\0" * 64)
    blob_of_bytes = root / "blobs" / f"sha256-{hashlib.sha256(b'GGUF' + bytes(64)).hexdigest()}"
    blob_of_bytes.unlink()
    ollama_model(root, "notgguf", "latest", b"safetensors, not a GGUF")
    expected = {
        "ollama:nothere": "no such model in",
        "ollama:broken": "is not readable JSON",
        "ollama:noblob": "is missing from",
        "ollama:newformat": "separate tensor layers",
        "ollama:notgguf": "is not a GGUF file",
        "ollama:../../etc": "not an Ollama model name",
    }
    for spec, problem in expected.items():
        code = run_app(["pair", "check", spec, str(stores["lm_file"])])
        out, err = capsys.readouterr()
        assert code == 2 and out == "", spec
        assert err.startswith("error: ollama:") and problem in err and err.count("\n") == 1, err
    code, rows, _ = cli_json(capsys, "models")  # listing still works, each with its problem
    problems = {r["name"]: r["problem"] for r in rows if not r["usable"]}
    assert set(problems) == {"broken:latest", "noblob:latest", "notgguf:latest", "newformat:latest"}


def test_pair_check_reads_stored_headers(stores, capsys):
    code, report, err = cli_json(capsys, "pair", "check", "ollama:llama3.2:1b", str(stores["lm_file"]))
    assert code == 0, err
    assert report["compatible"] and report["target"]["vocab_size"] == 32000
    code, report, _ = cli_json(capsys, "pair", "check", "llama-8b:Q4_K_M", "ollama:gpt2", "--offline")
    assert code == 0 and not report["compatible"] and report["translated"]  # another vocabulary: drafts translated
    assert report["target"]["source"] == str(stores["cached"].resolve())
    assert stores["hub"].requests == []


def test_suggest_offline_from_profiles_alone(fake_hub, capsys):
    code, report, err = cli_json(capsys, "pair", "suggest", "--target", "llama-70b", "--offline")
    assert code == 0, err
    assert report["target_evidence"] == "profile" and report["target_on_disk"] is None
    assert [d["draft"] for d in report["drafts"]] == ["llama-1b", "llama-3b", "llama-8b"]
    for draft in report["drafts"]:
        assert draft["evidence"] == "profile" and draft["on_disk"] is None and draft["compatible"]
        assert 0 < draft["cost_ratio"] < 1 and draft["k"] >= 1 and draft["acceptance_prior"] == 0.7
    assert run_app(["pair", "suggest", "--target", "llama-70b", "--offline"]) == 0
    out = capsys.readouterr().out
    assert "known from its profile: llama family, 70.6B params" in out and "profile" in out
    assert fake_hub.requests == []


def test_suggest_offline_weighs_a_mixture_of_experts_by_the_parameters_a_token_reads(fake_hub, capsys):
    code, report, err = cli_json(capsys, "pair", "suggest", "--target", "qwen3.5-35b-a3b", "--offline", "--top", "9")
    assert code == 0, err
    drafts = {d["draft"]: d for d in report["drafts"]}
    # 3B of its 35B parameters are active: Qwen3.5's 0.8B and 2B draft, the 4B and up read more than it does.
    assert {"qwen3.5-0.8b", "qwen3.5-2b"} <= set(drafts) and "qwen3.5-4b" not in drafts
    assert drafts["qwen3.5-0.8b"]["cost_ratio"] == pytest.approx(0.8 / 3)


def test_suggest_marks_drafts_already_on_disk(stores, capsys):
    code, report, err = cli_json(capsys, "pair", "suggest", "--target", "llama-70b", "--offline")
    assert code == 0, err
    drafts = {d["draft"]: d for d in report["drafts"]}
    assert set(drafts) == {"llama-1b", "llama-3b", "llama-8b"}
    assert (drafts["llama-1b"]["store"], drafts["llama-1b"]["on_disk"]) == ("lmstudio", str(stores["lm_file"]))
    assert drafts["llama-3b"]["store"] == "ollama" and drafts["llama-8b"]["store"] == "llama.cpp"
    assert "models on disk not judged" in err  # gpt2 and others: no profile, no target header
    assert stores["hub"].requests == []


def test_suggest_judges_stored_files_by_their_headers(fake_hub, tmp_path, monkeypatch, capsys):
    """Weights on disk: a target in LM Studio, a cheaper draft in Ollama, both read locally."""
    shape = dict(n_embd=128, n_ff=256)
    target = write_tiny_llama(tmp_path / "target.gguf", n_layer=6, **shape)
    draft = write_tiny_llama(tmp_path / "draft.gguf", n_layer=1, seed=1, **shape)
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    ollama_model(tmp_path / "ollama", "tinydraft", "latest", draft, extra=("projector", "license"))
    stored_target = lmstudio_file(
        tmp_path / "no-stores" / "home" / ".lmstudio" / "models", "org/Tiny-GGUF", "tiny-Q8_0.gguf", target
    )
    code, report, err = cli_json(capsys, "pair", "suggest", "--target", str(stored_target), "--offline")
    assert code == 0, err
    assert report["target_evidence"] == "local header"
    [found] = [d for d in report["drafts"] if d["draft"] == "ollama:tinydraft:latest"]
    assert found["evidence"] == "local header" and found["store"] == "ollama" and found["origin"] == "ollama"
    assert found["on_disk"] == str(blob_of(draft, tmp_path / "ollama")) and 0 < found["cost_ratio"] < 1
    assert fake_hub.requests == []


def test_unknown_target_offline_says_what_is_known(isolated, capsys):
    assert run_app(["pair", "suggest", "--target", "nobody/Nothing-GGUF", "--offline"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nothing is known of it offline" in err
    assert "profiles know the families gemma3, gemma4, " in err and ", llama, " in err


def test_nothing_is_written_into_the_stores(stores, capsys):
    roots = [stores["ollama"], stores["lmstudio"], stores["llama_cache"]]
    before = snapshot(*roots)
    modes = {path: os.lstat(path).st_mode for path in before}
    for path, mode in modes.items():
        if not stat.S_ISLNK(mode):
            os.chmod(path, mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    try:
        assert run_app(["models", "--json"]) == 0
        assert run_app(["pair", "check", "ollama:llama3.2:1b", "llama-1b:Q4_K_M", "--json"]) == 0
        assert run_app(["pair", "suggest", "--target", "llama-70b", "--offline", "--json"]) == 0
        assert run_app(["pair", "suggest", "--target", "llama-8b:Q4_K_M", "--json"]) == 0
        resolve_model("llama-1b", show_progress=False)
        resolve_model("ollama:gpt2")
    finally:
        for path, mode in modes.items():
            if not stat.S_ISLNK(mode):
                os.chmod(path, mode)
    capsys.readouterr()
    assert snapshot(*roots) == before


def test_default_places_of_the_stores(tmp_path, monkeypatch):
    from specrun.hub.stores import llamacpp, lmstudio, ollama

    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("OLLAMA_MODELS")
    (home / ".ollama" / "models").mkdir(parents=True)
    assert ollama.default_root() == home / ".ollama" / "models"
    monkeypatch.delenv("LLAMA_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert llamacpp.default_root() == tmp_path / "xdg" / "llama.cpp"
    assert lmstudio.default_root() == home / ".lmstudio" / "models"
    (home / ".cache" / "lm-studio").mkdir(parents=True)  # before LM Studio 0.3
    assert lmstudio.default_root() == home / ".cache" / "lm-studio" / "models"
    (home / ".lmstudio-home-pointer").write_text(str(tmp_path / "elsewhere") + "\n")
    assert lmstudio.default_root() == tmp_path / "elsewhere" / "models"
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "settings.json").write_text(json.dumps({"downloadsFolder": str(tmp_path / "big")}))
    assert lmstudio.default_root() == tmp_path / "big"
