"""What specrun reads from a header about MTP heads and recurrent states, checked against llama.cpp
itself on tiny random GGUFs of the real architectures (tests/tinyhybrid.py): whether it rolls the
state back, and how many bytes the state and its snapshots take."""

from __future__ import annotations

import contextlib
import re

import pytest
from tinyhybrid import write_tiny_lfm2, write_tiny_mamba, write_tiny_nemotron_h, write_tiny_qwen35
from tinymodels import write_tiny_llama

from specrun.backend import Context, ContextOptions, Model
from specrun.backend.library import llama
from specrun.pair.arch import DRAFTER, HEADS, SEPARATE, header_traits, profile_traits, state_bytes
from specrun.pair.header import read_keys, read_local

# Two state sizes of each layout: llama.cpp frames a state copy the same way for both, so the
# difference of what it copies must be the difference of specrun's sizes, to the byte.
LAYOUTS = {
    "qwen35": (dict(), dict(ssm_d_state=128, ssm_n_group=16, ssm_dt_rank=16)),  # the second: Qwen3.5-0.8B's layers
    "qwen35+mtp": (dict(nextn=True), dict(nextn=True, ssm_d_state=32, ssm_n_group=4, ssm_dt_rank=8)),
    "lfm2": (dict(), dict(n_embd=256, l_cache=4)),
    "nemotron_h": (dict(), dict(d_inner=256, d_state=32, n_group=4, n_ssm_head=16)),
}
WRITERS = {"qwen35": write_tiny_qwen35, "qwen35+mtp": write_tiny_qwen35, "lfm2": write_tiny_lfm2,
           "nemotron_h": write_tiny_nemotron_h}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrid-headers")
    written = {f"{name}/{size}": WRITERS[name](root / f"{name}-{size}.gguf", **shape)
               for name, shapes in LAYOUTS.items() for size, shape in zip(("small", "large"), shapes)}
    written["mamba"] = write_tiny_mamba(root / "mamba.gguf")
    written["llama"] = write_tiny_llama(root / "llama.gguf")
    return written


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
            return L.llama_state_seq_get_size_ext(context._ctx, 0, L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)
        finally:
            context.close()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_one_copy_of_the_state_is_what_llama_cpp_copies(models, layout):
    small, large = models[f"{layout}/small"], models[f"{layout}/large"]
    sizes = {path: state_bytes(read_keys(path).meta) for path in (small, large)}
    framing = copied_state(small) - sizes[small]
    assert copied_state(large) - sizes[large] == framing  # every byte the larger state adds is counted
    assert 0 < framing < 200 and sizes[large] > 2 * sizes[small]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_llama_cpp_keeps_one_copy_and_one_per_snapshot(models, layout, monkeypatch, capsys):
    """llama.cpp's own log line of the buffer it allocates, at n_rs_seq 0 and 16."""
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


@pytest.mark.parametrize("name", ["qwen35/small", "qwen35+mtp/small", "lfm2/small", "nemotron_h/small", "mamba", "llama"])
def test_the_header_says_what_llama_cpp_does(models, name):
    facts = read_local(models[name])
    traits = header_traits(facts.meta, [t.name for t in facts.tensors])
    with loaded(models[name]) as model:
        context = Context(model, ContextOptions(n_ctx=64, rollback=3, n_threads=1))
        rolls_back = context.rollback_limit == 3 if model.recurrent else None
        context.close()
        assert (traits.recurrent, traits.rolls_back, traits.mtp_layers) == (model.recurrent, rolls_back, model.n_nextn)
    assert traits.mtp == (HEADS if model.n_nextn else "")
    size = state_bytes(facts.meta)
    assert size is None if name == "mamba" else size == 0 if name == "llama" else size > 0  # mamba: specrun does not size it


def test_the_fast_header_reader_gives_what_the_full_one_does(models):
    for path in (models["qwen35+mtp/small"], models["nemotron_h/small"], models["llama"]):
        facts, keys = read_local(path), read_keys(path)
        assert keys.meta == facts.meta and keys.tensor_names == tuple(t.name for t in facts.tensors)


def test_what_the_traits_say():
    qwen = {"general.architecture": "qwen35", "qwen35.block_count": 5, "qwen35.nextn_predict_layers": 1}
    trunk = ["blk.0.attn_norm.weight", "blk.4.nextn.eh_proj.weight"]
    traits = header_traits(qwen, trunk)
    assert traits.notes() == ["drafts for itself: --draft mtp (1 MTP (NextN) layer)",
                              "hybrid: llama.cpp rolls its recurrent state back, from a snapshot per token a draft may lose"]
    assert traits.short == "drafts itself (--draft mtp); hybrid, rolls back"
    assert header_traits(qwen, trunk[1:]).mtp == DRAFTER  # NextN layers alone: a separate drafter, as llama.cpp tells
    gemma = header_traits({"general.architecture": "gemma4"}, trunk)
    assert gemma.mtp == SEPARATE and "(gemma4-assistant), which specrun cannot run yet" in gemma.notes()[0]
    assert header_traits({"general.architecture": "gemma4-assistant", "gemma4-assistant.block_count": 4,
                          "gemma4-assistant.nextn_predict_layers": 4}, ["blk.0.attn_q.weight"]).mtp == DRAFTER
    mamba = header_traits({"general.architecture": "mamba"}, trunk)
    assert mamba.notes() == ["recurrent: llama.cpp cannot roll its state back (mamba), so no draft can be verified: "
                             "no speculation, plain decoding only"] and not mamba.speculates
    assert header_traits({"general.architecture": "llama"}, trunk).notes() == []
    profile = profile_traits(HEADS, True)
    assert profile.rolls_back is None and profile.speculates and "per its profile" in profile.notes()[0]


def test_state_sizes_follow_each_architectures_layers():
    """Layer rules beyond the tiny models: Qwen3.5's explicit list, Nemotron-H's MLP layers, and an
    architecture whose state specrun cannot size."""
    qwen = {"general.architecture": "qwen35", "qwen35.block_count": 4, "qwen35.ssm.conv_kernel": 4,
            "qwen35.ssm.inner_size": 8, "qwen35.ssm.state_size": 2, "qwen35.ssm.group_count": 1}
    per_layer = (3 * (8 + 2 * 2) + 2 * 8) * 4
    assert state_bytes(qwen) == 3 * per_layer  # every fourth layer attends (llama.cpp's default interval)
    assert state_bytes({**qwen, "qwen35.attention.recurrent_layers": [True, False, False, False]}) == per_layer
    nemotron = {"general.architecture": "nemotron_h", "nemotron_h.block_count": 3, "nemotron_h.ssm.conv_kernel": 4,
                "nemotron_h.ssm.inner_size": 8, "nemotron_h.ssm.state_size": 2, "nemotron_h.ssm.group_count": 1,
                "nemotron_h.attention.head_count_kv": [0, 0, 2], "nemotron_h.feed_forward_length": [0, 16, 0]}
    assert state_bytes(nemotron) == per_layer  # layer 1 is an MLP, layer 2 attends
    assert state_bytes({"general.architecture": "kimi-k3"}) is None
    qwen_08b = {"general.architecture": "qwen35", "qwen35.block_count": 25, "qwen35.nextn_predict_layers": 1,
                "qwen35.full_attention_interval": 4, "qwen35.ssm.conv_kernel": 4, "qwen35.ssm.inner_size": 2048,
                "qwen35.ssm.state_size": 128, "qwen35.ssm.group_count": 16}
    assert state_bytes(qwen_08b) == 18 * (18_432 + 262_144) * 4  # Qwen3.5-0.8B: 19.27 MiB a copy
    assert state_bytes({"general.architecture": "gemma3"}) == 0
