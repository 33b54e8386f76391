"""Names from outside (hub listings, specs, profile fields, other tools' manifests) never
lead outside the cache they belong to: `..`, absolute paths and symlinks are refused."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hub_fixtures import gguf_bytes
from store_layouts import LLAMA_VOCAB, hf_layout_file, llamacpp_flat_file, ollama_manifest, ollama_model

from specrun.cli import run_app
from specrun.errors import SpecrunError
from specrun.hub import resolve_model
from specrun.hub.containment import check_name, inside
from specrun.hub.profiles import load_profiles

ESCAPES = [
    "..",
    "../x.gguf",
    "a/../../x.gguf",
    "/etc/passwd",
    "C:/Windows/x.gguf",
    "a\\..\\x.gguf",
    "",
    "./x.gguf",
    "a//x.gguf",
    "a/\x00.gguf",
]


@pytest.mark.parametrize("name", ESCAPES)
def test_names_that_are_not_plain_relative_paths_are_refused(name, tmp_path):
    with pytest.raises(SpecrunError) as caught:
        inside(tmp_path, name, "test")
    assert "refused" in str(caught.value) and "\n" not in str(caught.value)


def test_symlinks_may_not_lead_out_of_the_root(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "inner").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.gguf").write_bytes(b"GGUF")
    (root / "escape").symlink_to(outside)
    (root / "file.gguf").symlink_to(outside / "secret.gguf")
    (root / "alias").symlink_to(root / "inner")
    with pytest.raises(SpecrunError, match="leads outside"):
        inside(root, "escape/secret.gguf", "test")
    with pytest.raises(SpecrunError, match="leads outside"):
        inside(root, "file.gguf", "test")
    assert inside(root, "alias/model.gguf", "test") == root / "alias" / "model.gguf"
    assert check_name("sub/model-Q4_K_M.gguf", "test") == "sub/model-Q4_K_M.gguf"


@pytest.mark.parametrize(
    "spec", ["owner/repo/../../etc/passwd.gguf", "owner/../x.gguf", "owner/..", "owner/re--po", "owner/repo/sub/../../../x.gguf"]
)
def test_specs_with_escaping_names_get_one_line(spec, isolated, capsys):
    assert run_app(["pair", "check", spec, str(LLAMA_VOCAB), "--offline"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert "refused" in err or "is not a hub repository id" in err


def test_a_hub_listing_with_dotdot_is_refused_before_any_download(fake_hub, isolated):
    fake_hub.add_repo("someone/Evil-GGUF", {"../evil-Q4_K_M.gguf": gguf_bytes("evil")})
    with pytest.raises(SpecrunError, match=r"someone/Evil-GGUF: file name from the hub: '\.\./evil-Q4_K_M\.gguf'"):
        resolve_model("someone/Evil-GGUF:Q4_K_M", show_progress=False)
    assert fake_hub.downloads() == []
    assert not list((isolated / "hf-cache").rglob("evil*")) and not (isolated / "evil-Q4_K_M.gguf").exists()


def test_cached_paths_stay_in_the_hf_cache(isolated, tmp_path):
    from specrun.hub.download import cached_path, hub_cache_dir

    commit = "c0ffee" * 6 + "c0ff"
    hf_layout_file(hub_cache_dir(), "someone/Tiny-GGUF", "tiny.gguf", LLAMA_VOCAB, commit)
    assert cached_path("someone/Tiny-GGUF", commit, "tiny.gguf") is not None  # a blob symlink inside: fine
    for name in ("../../../../etc/passwd", "/etc/passwd"):
        with pytest.raises(SpecrunError, match="refused"):
            cached_path("someone/Tiny-GGUF", commit, name)
    outside = tmp_path / "outside.gguf"
    outside.write_bytes(LLAMA_VOCAB.read_bytes())
    snapshot = hub_cache_dir() / "models--someone--Tiny-GGUF" / "snapshots" / commit
    (snapshot / "planted.gguf").symlink_to(outside)
    with pytest.raises(SpecrunError, match="leads outside"):
        cached_path("someone/Tiny-GGUF", commit, "planted.gguf")


def test_remote_header_names_are_checked(isolated):
    from specrun.pair.remote import read_remote

    with pytest.raises(SpecrunError, match="refused"):
        read_remote("someone/Tiny-GGUF", "../../other/repo/x.gguf", endpoint="http://127.0.0.1:9")


def test_ollama_digests_must_be_sha256_blobs_inside_the_store(tmp_path, monkeypatch, capsys):
    root = tmp_path / "ollama"
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    for name, digest in (
        ("dotdot", "sha256:../../../etc/passwd"),
        ("absolute", "/etc/passwd"),
        ("short", "sha256:abc"),
        ("other", "md5:" + "0" * 32),
    ):
        ollama_manifest(
            root,
            f"registry.ollama.ai/library/{name}/latest",
            {"layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": digest, "size": 1}]},
        )
        assert run_app(["pair", "check", f"ollama:{name}", str(LLAMA_VOCAB)]) == 2
        err = capsys.readouterr().err
        assert "not sha256:<64 hex digits>; refused" in err and err.count("\n") == 1
    manifest = ollama_model(root, "linked", "latest", LLAMA_VOCAB)
    blob = root / "blobs" / json.loads(manifest.read_text())["layers"][0]["digest"].replace(":", "-")
    outside = tmp_path / "outside.gguf"
    blob.rename(outside)
    blob.symlink_to(outside)
    assert run_app(["pair", "check", "ollama:linked", str(LLAMA_VOCAB)]) == 2
    assert "leads outside" in capsys.readouterr().err


def test_a_llamacpp_manifest_naming_a_file_outside_is_ignored(tmp_path, monkeypatch):
    from specrun.hub.stores.llamacpp import LlamaCppStore

    flat = tmp_path / "llama.cpp"
    llamacpp_flat_file(flat, "owner/Model-GGUF", "model-Q4_K_M.gguf", "latest", LLAMA_VOCAB)
    (flat / "manifest=owner=Evil-GGUF=latest.json").write_text(json.dumps({"ggufFile": {"rfilename": "../../../etc/passwd"}}))
    models = LlamaCppStore(flat).models(load_profiles())
    assert [(m.repo, m.file) for m in models] == [("owner/Model-GGUF", "model-Q4_K_M.gguf")]


@pytest.mark.parametrize(
    "field, value, problem",
    [
        ("file", "../Tiny-{quant}.gguf", "must be a file inside the repository"),
        ("file", "/abs/Tiny-{quant}.gguf", "must be a file inside the repository"),
        ("repo", "someone/..", "must look like owner/name"),
        ("repo", "../someone", "must look like owner/name"),
    ],
)
def test_profile_fields_that_would_escape_are_refused(field, value, problem, tmp_path):
    entry = {"repo": "someone/Tiny-GGUF", "file": "Tiny-{quant}.gguf", "params": "1B", field: value}
    lines = ["family: tiny", "default_k: 4", "models:", "  tiny-1b:"]
    lines += [f"    {key}: {json.dumps(text)}" for key, text in entry.items()]
    folder = tmp_path / "profiles"
    folder.mkdir()
    (folder / "tiny.yaml").write_text("\n".join(lines) + "\n")
    with pytest.raises(SpecrunError, match=f"models.tiny-1b.{field}: {problem}"):
        load_profiles([folder])


def test_local_paths_with_dotdot_are_still_plain_paths(tmp_path, monkeypatch):
    """A spec that is a path on disk is the user's own file: `..` in it is fine."""
    (tmp_path / "models").mkdir()
    model = tmp_path / "models" / "tiny.gguf"
    model.write_bytes(LLAMA_VOCAB.read_bytes())
    monkeypatch.chdir(tmp_path / "models")
    assert resolve_model(os.path.join("..", "models", "tiny.gguf")).path == Path("../models/tiny.gguf")
