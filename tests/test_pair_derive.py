"""`pair derive`: layer subsets copied byte for byte, loadable and usable as a draft."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from tinymodels import write_tiny_llama

from specrun.cli import run_app
from specrun.errors import SpecrunError
from specrun.headers.read import open_reader
from specrun.pair.derive import describe_layers, parse_layers


def derive(capsys, *args: str) -> tuple[int, str, str]:
    code = run_app(["pair", "derive", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def tensors(path: Path) -> dict[str, tuple[str, bytes]]:
    return {t.name: (t.tensor_type.name, t.data.tobytes()) for t in open_reader(path).tensors}


def test_parse_layers() -> None:
    assert parse_layers("0-2,15-17", 18) == [0, 1, 2, 15, 16, 17]
    assert parse_layers("5, 1,3-4,3", 8) == [1, 3, 4, 5]
    assert describe_layers([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    for bad, message in [("0-20", "not 18"), ("a", "ranges like"), ("4-2", "backwards"), ("0-17", "keeps all 18 layers")]:
        with pytest.raises(SpecrunError, match=message):
            parse_layers(bad, 18)


def test_derived_layers_are_the_targets_bytes_renumbered(tmp_path: Path, capsys) -> None:
    target = write_tiny_llama(tmp_path / "t.gguf", n_layer=4, seed=3)
    out = tmp_path / "d.gguf"
    code, text, err = derive(capsys, "--target", target, "--layers", "0,3", "-o", out, "--json")
    assert code == 0, err
    original, derived = tensors(target), tensors(out)
    assert derived["token_embd.weight"] == original["token_embd.weight"]
    assert derived["output.weight"] == original["output.weight"]
    for new, old in ((0, 0), (1, 3)):
        for kind in ("attn_q", "attn_k", "ffn_down", "attn_norm"):
            assert derived[f"blk.{new}.{kind}.weight"] == original[f"blk.{old}.{kind}.weight"]
    assert not any(name.startswith(("blk.2.", "blk.3.")) for name in derived)
    fields = open_reader(out).fields
    assert fields["llama.block_count"].contents() == 2
    assert fields["specrun.derived.layers"].contents() == [0, 3]
    report = json.loads(text)
    assert report["compatible"] and report["layers"] == [0, 3]
    assert 0 < report["cost_ratio"] < 1


def test_derived_draft_generates_through_the_engine(tmp_path: Path, capsys) -> None:
    target = write_tiny_llama(tmp_path / "t.gguf", n_layer=4, seed=5)
    draft = tmp_path / "d.gguf"
    assert derive(capsys, "--target", target, "--layers", "0-1", "-o", draft)[0] == 0
    code = run_app(
        ["generate", "hello world", "--target", str(target), "--draft", str(draft), "-n", "12", "--k", "3", "-t", "1", "--json"]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    stats = json.loads(out)["stats"]
    assert stats["tokens"] == 12 and stats["drafted"] > 0


def test_quantized_tensors_are_copied_as_they_are(tmp_path: Path, capsys) -> None:
    target = write_tiny_llama(tmp_path / "t.gguf", n_layer=3, n_embd=256, n_ff=512, seed=1)
    q8 = tmp_path / "q8.gguf"
    _requantize_q8(target, q8)
    out = tmp_path / "d.gguf"
    code, _, err = derive(capsys, "--target", q8, "--layers", "1-2", "-o", out)
    assert code == 0, err
    derived, original = tensors(out), tensors(q8)
    assert derived["blk.0.attn_q.weight"] == original["blk.1.attn_q.weight"]
    assert derived["blk.0.attn_q.weight"][0] == "Q8_0"


def _requantize_q8(src: Path, dst: Path) -> None:
    """A Q8_0 copy of a tiny model (matrices only), written with the gguf package."""
    reader = open_reader(src)
    writer = gguf.GGUFWriter(dst, "llama")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub)
    for t in reader.tensors:
        data = np.asarray(t.data)
        if data.ndim == 2 and t.name.startswith("blk."):
            writer.add_tensor(
                t.name, gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0), raw_dtype=gguf.GGMLQuantizationType.Q8_0
            )
        else:
            writer.add_tensor(t.name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_unloadable_result_leaves_nothing_behind(tmp_path: Path, capsys) -> None:
    target = tmp_path / "odd.gguf"
    writer = gguf.GGUFWriter(target, "notanarch")
    writer.add_block_count(2)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(["<unk>", "<s>", "</s>", "a", "b", "c"])
    for i in range(2):
        writer.add_tensor(f"blk.{i}.w.weight", np.ones((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    out = tmp_path / "d.gguf"
    code, _, err = derive(capsys, "--target", target, "--layers", "1", "-o", out)
    assert code == 2 and "cannot load the derived draft" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["odd.gguf"]


def test_existing_output_needs_force(tmp_path: Path, capsys) -> None:
    target = write_tiny_llama(tmp_path / "t.gguf", n_layer=2)
    out = tmp_path / "d.gguf"
    out.write_bytes(b"keep me")
    code, _, err = derive(capsys, "--target", target, "--layers", "0", "-o", out)
    assert code == 2 and "--force" in err and out.read_bytes() == b"keep me"
    assert derive(capsys, "--target", target, "--layers", "0", "-o", out, "--force")[0] == 0


@pytest.mark.gemma
def test_gemma_subset_keeps_each_layers_attention_kind(tmp_path: Path, capsys) -> None:
    from specrun.hub.embedded import embedded_model_path

    out = tmp_path / "g.gguf"
    code, text, err = derive(capsys, "--target", embedded_model_path(), "--layers", "3-5,11", "-o", out)
    assert code == 0, err
    fields = open_reader(out).fields
    # Gemma 3: layers 5, 11, 17 are global (i % 6 == 5); the rest use the sliding window.
    assert fields["gemma3.attention.sliding_window_pattern"].contents() == [True, True, False, False]
    assert fields["gemma3.block_count"].contents() == 4
    assert "loaded by llama.cpp" in text
    assert "output head (262144 x 640, tied to token_embd" in text
    assert "slower than the target alone" in text


def test_auto_candidates_cover_three_shapes() -> None:
    from specrun.pair.autoderive import candidate_subsets

    subsets = candidate_subsets(18)
    assert (0, 1, 2, 15, 16, 17) in subsets  # first and last layers
    assert tuple(range(9)) in subsets  # the first half
    assert all(len(s) < 18 and list(s) == sorted(set(s)) for s in subsets)
    assert {len(s) for s in subsets} == {6, 9, 12, 15}


def test_teacher_forced_agreement_of_the_target_with_itself(tmp_path: Path) -> None:
    # Aligned correctly, the target's argmax along its own greedy output is that output.
    from specrun.pair.autoderive import SAMPLE_PROMPTS, Probe

    target = write_tiny_llama(tmp_path / "t.gguf", n_layer=2, seed=7)
    probe = Probe(target, n_ctx=256, threads=1)
    try:
        prompt = probe.model.tokenize(SAMPLE_PROMPTS[0])
        continuation, _ = probe.greedy(prompt, 16)
        agree = probe.argmax_along(prompt, continuation) == np.asarray(continuation)
    finally:
        probe.close()
    assert agree.mean() >= 15 / 16


def test_auto_writes_the_best_measured_subset(tmp_path: Path, capsys) -> None:
    target = write_tiny_llama(tmp_path / "t.gguf", n_layer=6, n_embd=128, n_ff=256, seed=4)
    out = tmp_path / "d.gguf"
    code, text, err = derive(capsys, "--target", target, "--auto", "-t", "1", "-o", out, "--json")
    assert code == 0, err
    report = json.loads(text)
    best = max(report["measured"], key=lambda m: m["speedup"])
    assert report["layers"] == list(best["layers"])
    assert report["acceptance_prior"] == best["acceptance"]
    assert open_reader(out).fields["specrun.derived.layers"].contents() == report["layers"]
    assert all(0 <= m["acceptance"] <= 1 and m["cost_ratio"] > 0 for m in report["measured"])
    assert err.count("layers ") == len(report["measured"])  # progress on stderr
