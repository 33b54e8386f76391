"""What specrun reads from a header about MTP heads and recurrent states, checked against llama.cpp
itself on tiny random GGUFs of the real architectures (tests/tinyhybrid.py): whether it rolls the
state back, and how many bytes the state and its snapshots take; and what `pair check`, `pair
suggest`, `models` and `doctor` say of it."""

from __future__ import annotations

import contextlib
import json
import re

import pytest
from tinyhybrid import write_tiny_lfm2, write_tiny_mamba, write_tiny_nemotron_h, write_tiny_qwen35
from tinymodels import write_tiny_llama

from specrun.backend import Context, ContextOptions, Model
from specrun.backend.library import llama
from specrun.cli import run_app
from specrun.errors import SpecrunError
from specrun.headers.arch import DRAFTER, HEADS, SEPARATE, header_traits, profile_traits, state_bytes
from specrun.headers.read import read_keys, read_local
from specrun.pair.cost import KV_BYTES_PER_VALUE

# Two state sizes of each layout: llama.cpp frames a state copy the same way for both, so the
# difference of what it copies must be the difference of specrun's sizes, to the byte.
LAYOUTS = {
    "qwen35": (dict(), dict(ssm_d_state=128, ssm_n_group=16, ssm_dt_rank=16)),  # the second: Qwen3.5-0.8B's layers
    "qwen35+mtp": (dict(nextn=True), dict(nextn=True, ssm_d_state=32, ssm_n_group=4, ssm_dt_rank=8)),
    "lfm2": (dict(), dict(n_embd=256, l_cache=4)),
    "nemotron_h": (dict(), dict(d_inner=256, d_state=32, n_group=4, n_ssm_head=16)),
    "mamba": (dict(), dict(n_embd=128)),
}
WRITERS = {
    "qwen35": write_tiny_qwen35,
    "qwen35+mtp": write_tiny_qwen35,
    "lfm2": write_tiny_lfm2,
    "nemotron_h": write_tiny_nemotron_h,
    "mamba": write_tiny_mamba,
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrid-headers")
    written = {
        f"{name}/{size}": WRITERS[name](root / f"{name}-{size}.gguf", **shape)
        for name, shapes in LAYOUTS.items()
        for size, shape in zip(("small", "large"), shapes)
    }
    written["llama"] = write_tiny_llama(root / "llama.gguf")
    written["mtp-only"] = write_tiny_qwen35(root / "mtp-qwen35.gguf", mtp_only=True)
    written["draft"] = write_tiny_qwen35(root / "qwen35-draft.gguf", n_layer=2, full_attention_interval=2)
    return written


def cli(capsys, *args) -> tuple[int, str, str]:
    code = run_app([str(arg) for arg in args])
    out, err = capsys.readouterr()
    return code, out, err


@contextlib.contextmanager
def loaded(path):
    model = Model(path)
    try:
        yield model
    finally:
        model.close()


def copied_state(path, rollback: int = 0) -> int:
    """What llama.cpp copies of sequence 0's recurrent state (PARTIAL_ONLY: the state alone), framing included."""
    L = llama()
    with loaded(path) as model:
        context = Context(model, ContextOptions(n_ctx=64, rollback=rollback, n_threads=1))
        try:
            context.eval([1, 5, 6, 7])
            return L.llama_state_seq_get_size_ext(context.handle, 0, L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)
        finally:
            context.close()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_one_copy_of_the_state_is_what_llama_cpp_copies(models, layout):
    small, large = models[f"{layout}/small"], models[f"{layout}/large"]
    sizes = {path: state_bytes(read_keys(path).meta) for path in (small, large)}
    framing = copied_state(small) - sizes[small]
    assert copied_state(large) - sizes[large] == framing  # every byte the larger state adds is counted
    assert 0 < framing < 200 and sizes[large] > 2 * sizes[small]


@pytest.mark.parametrize("layout", [name for name in LAYOUTS if name != "mamba"])
def test_llama_cpp_keeps_one_copy_and_one_per_snapshot(models, layout, monkeypatch, capsys):
    """llama.cpp's own log line of the buffer it allocates, at n_rs_seq 0 and 16 (a Mamba gets none)."""
    path = models[f"{layout}/large"]
    one = state_bytes(read_keys(path).meta)
    monkeypatch.setenv("SPECRUN_DEBUG", "1")  # llama.cpp's log on stderr
    with loaded(path) as model:
        for rollback in (0, 16):
            capsys.readouterr()
            Context(model, ContextOptions(n_ctx=64, rollback=rollback, n_threads=1)).close()
            line = re.search(r"llama_memory_recurrent: size = +([\d.]+) MiB .* (\d+) rs_seq\)", capsys.readouterr().err)
            assert line and int(line.group(2)) == rollback
            assert line.group(1) == f"{one * (1 + rollback) / 2**20:.2f}"


@pytest.mark.parametrize("name", ["qwen35/small", "qwen35+mtp/small", "lfm2/small", "nemotron_h/small", "mamba/small", "llama"])
def test_the_header_says_what_llama_cpp_does(models, name):
    facts = read_local(models[name])
    traits = header_traits(facts.meta, [t.name for t in facts.tensors])
    with loaded(models[name]) as model:
        context = Context(model, ContextOptions(n_ctx=64, rollback=3, n_threads=1))
        rolls_back = context.rollback_limit == 3 if model.recurrent else None
        context.close()
        assert (traits.recurrent, traits.rolls_back, traits.mtp_layers) == (model.recurrent, rolls_back, model.n_nextn)
    assert traits.mtp == (HEADS if model.n_nextn else "")
    assert (state_bytes(facts.meta) > 0) == model.recurrent


def test_the_fast_header_reader_gives_what_the_full_one_does(models):
    for path in (models["qwen35+mtp/small"], models["nemotron_h/small"], models["llama"]):
        facts, keys = read_local(path), read_keys(path)
        assert keys.meta == facts.meta and keys.tensor_names == tuple(t.name for t in facts.tensors)


def test_the_fast_header_reader_refuses_what_is_not_a_whole_gguf_header(models, tmp_path):
    for name, data in (("empty", b""), ("junk", b"GGUF" + b"q4" * 100), ("cut", models["llama"].read_bytes()[:300])):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(SpecrunError, match="not a readable GGUF file, cut short or damaged"):
            read_keys(tmp_path / name)


def test_what_the_traits_say():
    qwen = {"general.architecture": "qwen35", "qwen35.block_count": 5, "qwen35.nextn_predict_layers": 1}
    trunk = ["blk.0.attn_norm.weight", "blk.4.nextn.eh_proj.weight"]
    traits = header_traits(qwen, trunk)
    assert traits.notes() == [
        "drafts for itself: --draft mtp (1 MTP (NextN) layer)",
        "hybrid: it keeps a recurrent state, which llama.cpp rolls back for drafts",
    ]
    assert traits.short == "drafts itself (--draft mtp); hybrid, rolls back"
    assert header_traits(qwen, trunk[1:]).mtp == DRAFTER  # NextN layers alone: a separate drafter, as llama.cpp tells
    gemma = header_traits({"general.architecture": "gemma4"}, trunk)
    assert gemma.mtp == SEPARATE and "(gemma4-assistant), which specrun cannot run yet" in gemma.notes()[0]
    assert (
        header_traits(
            {
                "general.architecture": "gemma4-assistant",
                "gemma4-assistant.block_count": 4,
                "gemma4-assistant.nextn_predict_layers": 4,
            },
            ["blk.0.attn_q.weight"],
        ).mtp
        == DRAFTER
    )
    mamba = header_traits({"general.architecture": "mamba"}, trunk)
    assert (
        mamba.notes()
        == [
            "recurrent: llama.cpp cannot roll its state back (mamba), so no draft can be verified: "
            "no speculation, plain decoding only"
        ]
        and not mamba.speculates
    )
    assert header_traits({"general.architecture": "llama"}, trunk).notes() == []
    profile = profile_traits(HEADS, True)
    assert profile.rolls_back is None and profile.speculates and "per its profile" in profile.notes()[0]


def test_state_sizes_follow_each_architectures_layers():
    """Layer rules beyond the tiny models: Qwen3.5's explicit list, Nemotron-H's MLP layers, and an
    architecture whose state specrun cannot size."""
    qwen = {
        "general.architecture": "qwen35",
        "qwen35.block_count": 4,
        "qwen35.ssm.conv_kernel": 4,
        "qwen35.ssm.inner_size": 8,
        "qwen35.ssm.state_size": 2,
        "qwen35.ssm.group_count": 1,
    }
    per_layer = (3 * (8 + 2 * 2) + 2 * 8) * 4
    assert state_bytes(qwen) == 3 * per_layer  # every fourth layer attends (llama.cpp's default interval)
    assert state_bytes({**qwen, "qwen35.attention.recurrent_layers": [True, False, False, False]}) == per_layer
    nemotron = {
        "general.architecture": "nemotron_h",
        "nemotron_h.block_count": 3,
        "nemotron_h.ssm.conv_kernel": 4,
        "nemotron_h.ssm.inner_size": 8,
        "nemotron_h.ssm.state_size": 2,
        "nemotron_h.ssm.group_count": 1,
        "nemotron_h.attention.head_count_kv": [0, 0, 2],
        "nemotron_h.feed_forward_length": [0, 16, 0],
    }
    assert state_bytes(nemotron) == per_layer  # layer 1 is an MLP, layer 2 attends
    assert state_bytes({"general.architecture": "kimi-k3"}) is None  # its layout is not one specrun knows
    qwen_08b = {
        "general.architecture": "qwen35",
        "qwen35.block_count": 25,
        "qwen35.nextn_predict_layers": 1,
        "qwen35.full_attention_interval": 4,
        "qwen35.ssm.conv_kernel": 4,
        "qwen35.ssm.inner_size": 2048,
        "qwen35.ssm.state_size": 128,
        "qwen35.ssm.group_count": 16,
    }
    assert state_bytes(qwen_08b) == 18 * (18_432 + 262_144) * 4  # Qwen3.5-0.8B: 19.27 MiB a copy
    assert state_bytes({"general.architecture": "gemma3"}) == 0


# --- what the commands say -------------------------------------------------------------
def test_pair_check_counts_the_snapshots_at_the_k_given(models, capsys):
    target, draft = models["qwen35+mtp/small"], models["draft"]
    one, draft_one = (state_bytes(read_keys(path).meta) for path in (target, draft))
    reports = {}
    for k, copies in (("auto", 17), ("llama.cpp", 17), ("4", 5)):
        code, out, err = cli(capsys, "pair", "check", target, draft, "--json", "--k", k)
        assert code == 0, err
        report = reports[k] = json.loads(out)
        assert report["rollback"] == copies - 1
        assert report["state_memory_bytes"] == one * copies + draft_one * 2  # the draft: its own and the checkpoint
    assert reports["auto"]["memory_bytes"] - reports["4"]["memory_bytes"] == 12 * one
    expected = {"mtp": "heads", "mtp_layers": 1, "hybrid": True, "rolls_back": True, "state_bytes": one}
    assert {key: reports["auto"]["target"][key] for key in expected} == expected
    assert reports["auto"]["draft"]["mtp"] is None and reports["auto"]["draft"]["hybrid"]
    code, out, _ = cli(capsys, "pair", "check", target, draft, "--k", "4")
    assert code == 0 and "drafts for itself: --draft mtp (1 MTP (NextN) layer)" in out
    assert "hybrid: it keeps a recurrent state, which llama.cpp rolls back for drafts" in out
    assert f"target 5 x {one / 1024:.1f} KiB: one, and a snapshot for each of 4 drafted tokens" in out


def test_pair_check_of_a_hybrid_counts_kv_only_where_layers_attend(models, capsys):
    """The tiny qwen35 attends in 1 of its 4 layers (2 KV heads of 32 values each for K and V); the
    MTP layer's cache belongs to the MTP head's context, not the target's."""
    target = models["qwen35+mtp/small"]
    code, out, err = cli(capsys, "pair", "check", target, target, "--json", "--ctx", "1000")
    kv = 2 * (32 + 32) * 1000 * KV_BYTES_PER_VALUE
    report = json.loads(out)
    weights = 2 * report["target"]["file_bytes"]
    assert report["memory_bytes"] == weights + 2 * kv + report["state_memory_bytes"]


def test_pair_check_of_the_targets_own_mtp_layers(models, capsys):
    target = models["qwen35+mtp/small"]
    one = state_bytes(read_keys(target).meta)
    code, out, err = cli(capsys, "pair", "check", target, "mtp", "--json", "--k", "3", "--ctx", "1000")
    assert code == 0, err
    report = json.loads(out)
    kv = 2 * (32 + 32) * 1000 * KV_BYTES_PER_VALUE  # one attention layer in the model, one in its MTP block
    assert report["mtp_layers"] == 1 and 0 < report["cost_ratio"] < 1
    assert report["memory_bytes"] == report["target"]["file_bytes"] + 2 * kv + 4 * one
    assert report["acceptance_prior"] is None and report["predicted_speedup"] is None
    assert "acceptance of MTP heads is not assumed" in report["verdict"]
    code, out, _ = cli(capsys, "pair", "check", target, "mtp", "--acceptance", "0.8", "--json")
    report = json.loads(out)
    assert code == 0 and report["best_k"] >= 1 and report["predicted_speedup"] > 1
    code, out, _ = cli(capsys, "pair", "check", target, "mtp")
    assert code == 0 and "draft   mtp: the target's own MTP layers (--draft mtp)" in out and "MTP/target 0." in out


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        (
            "qwen35/small",
            "the target model qwen35-small.gguf has no MTP (NextN) layers, so it cannot draft for itself: "
            "check a draft model instead (specrun pair suggest --target",
        ),
        ("mtp-only", "mtp-qwen35.gguf is an MTP drafter (qwen35), not a model to generate with"),
    ],
)
def test_pair_check_mtp_without_mtp_layers_is_one_line(models, capsys, name, fragment):
    code, out, err = cli(capsys, "pair", "check", models[name], "mtp")
    assert code == 2 and out == "" and err.count("\n") == 1 and fragment in err


def test_what_cannot_draft_says_why(models, capsys):
    code, out, _ = cli(capsys, "pair", "check", models["mamba/small"], models["qwen35/small"])
    assert code == 1 and "verdict    cannot draft: llama.cpp cannot roll back the target's recurrent state (mamba)" in out
    code, out, _ = cli(capsys, "pair", "check", models["qwen35/small"], models["mtp-only"], "--json")
    report = json.loads(out)
    assert code == 1 and not report["can_draft"] and report["draft"]["mtp"] == "drafter"
    assert report["verdict"].startswith("cannot draft: the draft is a separate MTP drafter")


@pytest.fixture
def stores(models, isolated, monkeypatch, tmp_path):
    """llama.cpp's cache holding the tiny models, the other stores empty."""
    root = tmp_path / "llama.cpp"
    root.mkdir()
    for name in ("qwen35+mtp/small", "mamba/small", "lfm2/small", "draft", "mtp-only", "llama"):
        (root / models[name].name).write_bytes(models[name].read_bytes())
    monkeypatch.setenv("LLAMA_CACHE", str(root))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return root


def test_models_says_what_each_file_is(stores, capsys):
    code, out, err = cli(capsys, "models", "--json")
    assert code == 0, err
    rows = {row["name"]: row for row in json.loads(out)}
    assert {key: rows["qwen35+mtp-small.gguf"][key] for key in ("architecture", "mtp", "mtp_layers", "hybrid", "rolls_back")} == {
        "architecture": "qwen35",
        "mtp": "heads",
        "mtp_layers": 1,
        "hybrid": True,
        "rolls_back": True,
    }
    assert (rows["mamba-small.gguf"]["hybrid"], rows["mamba-small.gguf"]["rolls_back"]) == (True, False)
    assert (rows["llama.gguf"]["mtp"], rows["llama.gguf"]["hybrid"]) == (None, False)
    assert rows["mtp-qwen35.gguf"]["mtp"] == "drafter"
    code, out, _ = cli(capsys, "models")
    lines = {line.split()[2]: line for line in out.splitlines()[1:]}  # source, alias, name, ...
    assert "drafts itself (--draft mtp); hybrid, rolls back" in lines["qwen35+mtp-small.gguf"]
    assert "recurrent, no speculation" in lines["mamba-small.gguf"] and "hybrid, rolls back" in lines["lfm2-small.gguf"]


def test_models_aliases_say_what_each_model_is(isolated, capsys):
    code, out, _ = cli(capsys, "models", "--aliases", "--json")
    rows = {row["alias"]: row for row in json.loads(out)}
    assert (rows["qwen3.5-35b-a3b"]["mtp"], rows["qwen3.5-35b-a3b"]["hybrid"], rows["qwen3.5-35b-a3b"]["active"]) == (
        "heads",
        True,
        3_000_000_000,
    )
    assert rows["gemma-4-31b"]["mtp"] == "separate" and rows["llama-8b"]["mtp"] is None
    code, out, _ = cli(capsys, "models", "--aliases")
    assert "drafts itself (--draft mtp); hybrid" in next(line for line in out.splitlines() if line.startswith("qwen3.5-9b "))


def test_suggest_lists_the_targets_own_mtp_layers_first(stores, capsys):
    target = stores / "qwen35+mtp-small.gguf"
    code, out, err = cli(capsys, "pair", "suggest", "--target", target, "--offline", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["target_traits"] == {"mtp": "heads", "mtp_layers": 1, "hybrid": True, "rolls_back": True}
    first, *others = report["drafts"]
    assert first["draft"] == "mtp" and first["mtp_layers"] == 1 and 0 < first["cost_ratio"] < 1 and first["memory_bytes"] > 0
    assert others and "mtp" not in [d["draft"] for d in others]
    assert str(stores / "mtp-qwen35.gguf") not in [d["draft"] for d in others]  # a separate MTP drafter: not offered
    code, out, _ = cli(capsys, "pair", "suggest", "--target", target, "--offline")
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("#  speed-up"))
    assert lines[header + 1].endswith("mtp (the target's own MTP layers)")  # ranked first


def test_suggest_for_a_target_llama_cpp_cannot_roll_back_lists_nothing(stores, capsys):
    code, out, err = cli(capsys, "pair", "suggest", "--target", stores / "mamba-small.gguf", "--offline", "--json")
    report = json.loads(out)
    assert code == 0 and report["drafts"] == [] and report["target_traits"]["rolls_back"] is False
    code, out, _ = cli(capsys, "pair", "suggest", "--target", stores / "mamba-small.gguf", "--offline")
    assert "no draft can work for it: llama.cpp cannot roll its recurrent state back" in out


def test_suggest_from_a_profile_alone_says_what_the_profile_does(isolated, capsys):
    code, out, err = cli(capsys, "pair", "suggest", "--target", "qwen3.5-9b", "--offline", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["target_traits"] == {"mtp": "heads", "mtp_layers": None, "hybrid": True, "rolls_back": None}
    assert [d["draft"] for d in report["drafts"]][:2] == ["mtp", "qwen3.5-0.8b"]
    assert report["drafts"][0]["evidence"] == "profile" and report["drafts"][0]["cost_ratio"] is None
    code, out, _ = cli(capsys, "pair", "suggest", "--target", "gemma-4-31b", "--offline")
    assert "its MTP drafter is a model of its own, which specrun cannot run yet" in out


def test_a_gguf_converted_without_the_mtp_heads_its_profile_lists_is_told(models, fake_hub, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    fake_hub.add_repo("unsloth/Qwen3.5-9B-GGUF", {"Qwen3.5-9B-Q4_K_M.gguf": models["qwen35/small"].read_bytes()})
    assert run_app(["pull", "qwen3.5-9b:Q4_K_M"]) == 0
    capsys.readouterr()
    code, out, err = cli(capsys, "pair", "suggest", "--target", "qwen3.5-9b:Q4_K_M", "--offline")
    assert code == 0, err
    assert "its profile lists MTP heads, but this GGUF has none: it was converted without them" in out
    assert "mtp (the target's own MTP layers)" not in out  # the header decides
