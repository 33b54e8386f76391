"""`pair check`: real tokenizers, tiny models, Gemma, and hub files read by range requests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gguf import GGUFReader
from pair_hub_server import serve
from tinymodels import write_tiny_llama

from specrun.backend.compat import check_vocab
from specrun.cli import run_app
from specrun.headers.read import PlainArrayReader, read_local
from specrun.pair.check import check_pair
from specrun.pair.cost import best_k, decode_cost, expected_speedup, verdict

DATA = Path(__file__).parent / "data"
LLAMA_SPM = DATA / "ggml-vocab-llama-spm.gguf"
PHI3 = DATA / "ggml-vocab-phi-3.gguf"
GPT2 = DATA / "ggml-vocab-gpt-2.gguf"
NEOX = DATA / "ggml-vocab-gpt-neox.gguf"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = run_app(["pair", "check", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_fast_reader_gives_the_stock_readers_fields() -> None:
    # Strings, floats and ints in arrays; the stock reader takes seconds even on 32k tokens.
    fast, stock = PlainArrayReader(LLAMA_SPM), GGUFReader(LLAMA_SPM)
    assert list(fast.fields) == list(stock.fields)
    for name, field in stock.fields.items():
        mine = fast.fields[name]
        assert mine.types == field.types and list(mine.data) == list(field.data), name
        assert [p.tobytes() for p in mine.parts] == [p.tobytes() for p in field.parts], name


def test_vocab_facts_apply_llama_cpp_defaults() -> None:
    # gpt-2's file has no add_bos key: BPE with pre-tokenizer "gpt-2" does not add bos.
    gpt2 = read_local(GPT2).vocab
    assert (gpt2.vocab_type, gpt2.n_tokens, gpt2.bos, gpt2.eos) == ("bpe", 50257, 50256, 50256)
    assert (gpt2.add_bos, gpt2.add_eos) == (False, False)
    spm = read_local(LLAMA_SPM).vocab
    assert (spm.vocab_type, spm.bos, spm.eos, spm.add_bos, spm.add_eos) == ("spm", 1, 2, True, False)


def test_llama2_and_phi3_vocabularies_are_compatible_with_a_note(capsys) -> None:
    # Phi-3 = Llama 2's 32000 tokens + 64 chat/padding tokens, eos 32000 instead of 2;
    # llama.cpp compares eos ids only when eos is added to prompts (neither adds it).
    code, out, _ = run(capsys, LLAMA_SPM, PHI3)
    assert code == 0
    assert "compatible: yes" in out
    assert "eos id differs (target 2, draft 32000) but neither adds it" in out
    assert "vocab only (no weights)" in out


def test_gpt2_and_neox_fail_llama_cpps_rule_with_evidence_and_draft_translated(capsys) -> None:
    code, out, _ = run(capsys, GPT2, NEOX, "--json")
    assert code == 0
    report = json.loads(out)
    assert report["compatible"] is False and report["translated"] is True and report["can_draft"] is True
    assert report["problems"] == [
        "vocab sizes differ by 175 (> 128): target 50257, draft 50432",
        "token 5 differs: target '&', draft '$'",
    ]
    shares = report["translation"]
    assert 0.7 < shares["draft_share"] < 0.8 and 0.7 < shares["target_share"] < 0.8  # two byte-level BPEs, 73% alike
    assert shares["sample_target_tokens"] >= shares["sample_shared_boundaries"] > 0.9 * shares["sample_target_tokens"]


def test_every_failed_criterion_is_named_and_the_tokenizers_line_up(capsys) -> None:
    code, out, _ = run(capsys, GPT2, LLAMA_SPM)
    assert code == 0
    for problem in (
        "vocab type differs: target bpe, draft spm",
        "add_bos differs: target False, draft True",
        "vocab sizes differ by 18257",
        "token 5 differs: target '&', draft '<0x02>'",
        "specrun drafts translated, through text",
        "57% of the draft's 31901 text tokens have a target token with the same bytes",
    ):
        assert problem in out


def test_vocabularies_that_share_almost_nothing_cannot_draft(tmp_path: Path, capsys) -> None:
    alien = write_tiny_llama(tmp_path / "alien.gguf", vocab="alien", n_layer=1)
    code, out, _ = run(capsys, write_tiny_llama(tmp_path / "t.gguf"), alien)
    assert code == 1 and "cannot draft: the vocabularies share almost nothing (0 byte strings" in out


def test_bos_id_matters_when_bos_is_added(tmp_path: Path) -> None:
    target = read_local(write_tiny_llama(tmp_path / "t.gguf", seed=1))
    draft = read_local(write_tiny_llama(tmp_path / "d.gguf", seed=2, eos_id=5))
    report = check_vocab(target.vocab, draft.vocab)
    assert report.ok and report.notes == ("eos id differs (target 2, draft 5) but neither adds it",)
    moved_bos = type(draft.vocab)(**{**draft.vocab.__dict__, "bos": 3})
    assert check_vocab(target.vocab, moved_bos).problems == ("bos id differs: target 1, draft 3",)


def test_tiny_model_variants(tmp_path: Path, capsys) -> None:
    base = write_tiny_llama(tmp_path / "base.gguf", n_layer=4, n_embd=128, n_ff=256)
    padded = write_tiny_llama(tmp_path / "padded.gguf", vocab="padded", n_layer=1)
    different = write_tiny_llama(tmp_path / "different.gguf", vocab="different", n_layer=1)
    bigger = write_tiny_llama(tmp_path / "bigger.gguf", vocab="bigger", n_layer=1)
    code, out, _ = run(capsys, base, padded)
    assert code == 0 and "compatible: yes" in out
    code, out, _ = run(capsys, base, different)
    assert code == 0 and "specrun drafts translated" in out and "100% of the draft's" in out
    code, out, _ = run(capsys, base, bigger)
    assert code == 0 and "vocab sizes differ by 256 (> 128)" in out


def test_cost_ratio_comes_from_tensor_bytes(tmp_path: Path) -> None:
    target = read_local(write_tiny_llama(tmp_path / "t.gguf", n_layer=4))
    draft = read_local(write_tiny_llama(tmp_path / "d.gguf", n_layer=1))
    by_name = {t.name: t.n_bytes for t in target.tensors}
    layer = sum(n for name, n in by_name.items() if name.startswith("blk.0."))
    cost = decode_cost(target)
    # Untied head: output.weight is read per token, token_embd only one row.
    assert cost.head_bytes == by_name["output.weight"] and not cost.head_tied
    assert cost.layer_bytes == 4 * layer + by_name["output_norm.weight"]
    result = check_pair(target, draft)
    expected = (layer + by_name["output_norm.weight"] + by_name["output.weight"]) / cost.per_token_bytes
    assert result.cost_ratio == pytest.approx(expected)
    assert result.param_ratio < 1 and result.memory_bytes > target.file_size + draft.file_size


def test_speedup_model_and_verdicts() -> None:
    # Leviathan et al. 2023: alpha=0 gives 1/(kc+1); alpha=1 gives (k+1)/(kc+1).
    assert expected_speedup(0.0, 4, 0.1) == pytest.approx(1 / 1.4)
    assert expected_speedup(1.0, 4, 0.1) == pytest.approx(5 / 1.4)
    assert expected_speedup(0.8, 3, 0.05) == pytest.approx((1 - 0.8**4) / (0.2 * 1.15))
    assert best_k(0.7, 0.05)[0] > best_k(0.7, 0.3)[0]  # cheaper drafts draft further
    assert verdict(1.0, 0.9) == "draft costs 100% of the target per token: no speed-up possible"
    assert verdict(0.62, 0.7).startswith("draft costs 62% of the target per token: no useful")
    assert "good pair" in verdict(0.05, 0.7)


def test_missing_file_is_an_error_line(capsys, tmp_path: Path) -> None:
    code, out, err = run(capsys, tmp_path / "nope.gguf", LLAMA_SPM)
    assert code == 2 and out == "" and err.startswith("error: no such model file")
    assert "Traceback" not in err


@pytest.fixture
def hub(monkeypatch, tmp_path: Path):
    from huggingface_hub import constants

    with serve() as fake:
        monkeypatch.setenv("HF_ENDPOINT", fake.url)
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
        monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "no-tokens"))
        monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
        for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
            monkeypatch.delenv(name, raising=False)
        yield fake


def test_hub_header_by_range_requests_only(hub, tmp_path: Path, capsys, monkeypatch) -> None:
    import specrun.pair.remote as remote

    # A 4 KiB first fetch forces the grow-and-reparse path on this 17 KiB header.
    monkeypatch.setattr(remote, "FIRST_FETCH", 4 << 10)
    model = write_tiny_llama(tmp_path / "m.gguf", n_layer=8, n_embd=256, n_ff=1024)
    hub.add("org/tiny-GGUF", "tiny-F32.gguf", model)
    code, out, err = run(capsys, model, "org/tiny-GGUF/tiny-F32.gguf", "--json")
    assert code == 0, err
    report = json.loads(out)
    local = read_local(model)
    assert report["draft"]["file_bytes"] == model.stat().st_size
    assert report["draft"]["params"] == local.n_params and report["cost_ratio"] == 1.0
    ranges = [r for r in hub.requests if "/resolve/" in r]
    assert len(ranges) >= 3  # 4, 8, 16, 32 KiB: grown until the header fit
    header_end = PlainArrayReader(model).data_offset
    listing_json = 2048  # the model-info answer
    assert hub.bytes_sent < header_end * 2 + listing_json < model.stat().st_size // 10


def test_hub_vocab_file_compared_with_local(hub, capsys) -> None:
    hub.add("microsoft/Phi-3-GGUF", "vocab/phi-3.gguf", PHI3)
    code, out, err = run(capsys, LLAMA_SPM, "microsoft/Phi-3-GGUF/vocab/phi-3.gguf")
    assert code == 0 and "compatible: yes" in out, err


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing", "other.gguf is not in org/repo"),
        ("gated", "gated or private"),
        ("no-range", "ignored the Range request"),
    ],
)
def test_hub_errors_are_one_line(hub, capsys, case: str, message: str) -> None:
    hub.add("org/repo", "m.gguf", LLAMA_SPM)
    if case == "gated":
        hub.gated.add("org/repo")
    if case == "no-range":
        hub.honour_range = False
    spec = "org/repo/other.gguf" if case == "missing" else "org/repo/m.gguf"
    code, _, err = run(capsys, LLAMA_SPM, spec)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_offline_hub_file_not_cached_is_an_error(hub, capsys) -> None:
    code, _, err = run(capsys, LLAMA_SPM, "org/repo/m.gguf", "--offline")
    assert code == 2 and "offline" in err and hub.requests == []


@pytest.mark.gemma
def test_gemma_with_itself_is_compatible_but_cannot_be_faster(capsys) -> None:
    from specrun.hub.embedded import embedded_model_path

    gemma = embedded_model_path()
    code, out, _ = run(capsys, gemma, gemma, "--json")
    report = json.loads(out)
    assert code == 0 and report["compatible"] and report["cost_ratio"] == 1.0
    assert report["verdict"] == "draft costs 100% of the target per token: no speed-up possible"
    # The tied 262144 x 640 head is read in full per token: most of the model.
    assert report["draft"]["head_tied"] and report["draft"]["head_bytes"] > 0.7 * report["draft"]["bytes_per_token"]
    assert any("output head (262144 x 640" in w for w in report["warnings"])
