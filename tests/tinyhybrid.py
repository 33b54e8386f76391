"""Tiny random GGUFs of architectures with a recurrent state, for tests (not a test module itself).

- `write_tiny_qwen35`: Qwen3.5's hybrid layout (gated-delta-net layers and full attention),
  optionally with one MTP (NextN) block, or that block alone; llama.cpp rolls its recurrent
  state back (n_rs_seq).
  `shapes="qwen3.5-0.8b"` writes Qwen3.5-0.8B's real layer sizes (random weights) for benchmarks.
- `write_tiny_lfm2`: LFM2's short-convolution layers beside attention; llama.cpp rolls its
  (small) recurrent state back too.
- `write_tiny_nemotron_h`: Nemotron-H's Mamba-2 layers (grouped), attention and MLP layers;
  llama.cpp rolls it back.
- `write_tiny_mamba`: a pure recurrent model llama.cpp cannot roll back at all.

All use tinymodels' vocabulary. Each tensor follows what src/models/<arch>.cpp of the llama.cpp
that llama-cpp-python vendors loads; weights depend only on the seed and the tensor's name.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

import gguf
import numpy as np
from tinymodels import _BYTES, _PIECES, _SPECIAL, BASE_VOCAB_SIZE, BOS_ID, EOS_ID, UNK_ID


def vocab_tokens(pad_to: int | None = None) -> list[tuple[str, float, gguf.TokenType]]:
    """tinymodels' base vocabulary as (text, score, type) per id; `pad_to` appends unused
    tokens up to that size (a model with a real-sized output head)."""
    toks = [(t, 0.0, k) for t, k in _SPECIAL + _BYTES]
    toks += [(p, -float(i), gguf.TokenType.NORMAL) for i, p in enumerate(_PIECES)]
    if pad_to is not None and pad_to > len(toks):
        toks += [(f"[PAD{i}]", -1e9, gguf.TokenType.UNUSED) for i in range(pad_to - len(toks))]
    return toks


def _add_spm_vocab(w: gguf.GGUFWriter, tokens) -> None:
    w.add_tokenizer_model("llama")
    w.add_token_list([t for t, _, _ in tokens])
    w.add_token_scores([s for _, s, _ in tokens])
    w.add_token_types([k for _, _, k in tokens])
    w.add_unk_token_id(UNK_ID)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)


# ---------------------------------------------------------------------------------------------
# random tensors
# ---------------------------------------------------------------------------------------------


def _normal(seed: int, name: str, shape: tuple[int, ...], std: float) -> np.ndarray:
    """float32 N(0, std^2), determined by (seed, name) only (rows drawn in order)."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    return (rng.standard_normal(shape) * std).astype(np.float32)


def _uniform(seed: int, name: str, shape, lo: float, hi: float) -> np.ndarray:
    rng = np.random.default_rng([seed, zlib.crc32(name.encode()), 1])
    return rng.uniform(lo, hi, shape).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# qwen35
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Qwen35Shapes:
    n_layer: int  # trunk layers (without the MTP block)
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int  # qwen35.attention.key_length == value_length
    n_rot: int  # qwen35.rope.dimension_count (partial rotary: head_dim/4 in Qwen3.5)
    rope_sections: tuple[int, int, int, int]  # qwen35.rope.dimension_sections, sum == n_rot/2
    ssm_d_state: int  # linear_key_head_dim (== linear_value_head_dim in llama.cpp's loader)
    ssm_n_group: int  # linear_num_key_heads
    ssm_dt_rank: int  # linear_num_value_heads
    ssm_d_conv: int  # linear_conv_kernel_dim
    full_attention_interval: int
    rope_freq_base: float
    rms_eps: float
    n_ctx_train: int
    tie_embeddings: bool
    n_vocab: int | None  # None = tiny vocab (BASE_VOCAB_SIZE); else padded up to this

    @property
    def ssm_d_inner(self) -> int:  # linear_value_head_dim * linear_num_value_heads
        return self.ssm_d_state * self.ssm_dt_rank


QWEN35_SHAPES: dict[str, Qwen35Shapes] = {
    # ~0.5 MB f32 (with MTP); 3 gated-delta-net layers + 1 full-attention layer (layers 0,1,2 = linear, 3 = full)
    "tiny": Qwen35Shapes(
        n_layer=4,
        n_embd=64,
        n_ff=128,
        n_head=4,
        n_head_kv=2,
        head_dim=32,
        n_rot=8,
        rope_sections=(2, 1, 1, 0),
        ssm_d_state=16,
        ssm_n_group=2,
        ssm_dt_rank=4,
        ssm_d_conv=4,
        full_attention_interval=4,
        rope_freq_base=10_000_000.0,
        rms_eps=1e-6,
        n_ctx_train=4096,
        tie_embeddings=False,
        n_vocab=None,
    ),
    # Qwen/Qwen3.5-0.8B text config (config.json "text_config"): hidden 1024, 24 layers
    # (layer_types = [linear x3, full] x6, full_attention_interval 4), intermediate 3584,
    # 8 heads / 2 kv heads, head_dim 256, partial_rotary_factor 0.25 (n_rot 64),
    # mrope_section [11, 11, 10], rope_theta 1e7, rms_norm_eps 1e-6, linear_num_key_heads 16,
    # linear_num_value_heads 16, linear_key/value_head_dim 128, linear_conv_kernel_dim 4,
    # mtp_num_hidden_layers 1, tie_word_embeddings true, vocab 248320, max_position 262144.
    # (llama.cpp's qwen35 loader calls 24 layers with n_embd 1024 "0.8B".)
    "qwen3.5-0.8b": Qwen35Shapes(
        n_layer=24,
        n_embd=1024,
        n_ff=3584,
        n_head=8,
        n_head_kv=2,
        head_dim=256,
        n_rot=64,
        rope_sections=(11, 11, 10, 0),
        ssm_d_state=128,
        ssm_n_group=16,
        ssm_dt_rank=16,
        ssm_d_conv=4,
        full_attention_interval=4,
        rope_freq_base=10_000_000.0,
        rms_eps=1e-6,
        n_ctx_train=262144,
        tie_embeddings=True,
        n_vocab=248320,
    ),
}


def qwen35_is_recurrent(sh: Qwen35Shapes, il: int) -> bool:
    """llama.cpp's rule when qwen35.attention.recurrent_layers is absent (llama_model_qwen35::load_arch_hparams)."""
    return il < sh.n_layer and (il + 1) % sh.full_attention_interval != 0


def qwen35_tensor_shapes(sh: Qwen35Shapes, n_vocab: int, nextn: bool) -> dict[str, tuple[int, ...]]:
    """name -> numpy shape (n_out, n_in) for every tensor written (ggml ne is the reverse)."""
    E, hd = sh.n_embd, sh.head_dim
    key_dim = sh.ssm_d_state * sh.ssm_n_group
    value_dim = sh.ssm_d_state * sh.ssm_dt_rank
    conv_dim = 2 * key_dim + value_dim
    out: dict[str, tuple[int, ...]] = {"token_embd.weight": (n_vocab, E), "output_norm.weight": (E,)}
    if not sh.tie_embeddings:
        out["output.weight"] = (n_vocab, E)

    def attn_block(i):
        return {
            f"blk.{i}.attn_q.weight": (2 * sh.n_head * hd, E),  # query + output gate, interleaved per head
            f"blk.{i}.attn_k.weight": (sh.n_head_kv * hd, E),
            f"blk.{i}.attn_v.weight": (sh.n_head_kv * hd, E),
            f"blk.{i}.attn_output.weight": (E, sh.n_head * hd),
            f"blk.{i}.attn_q_norm.weight": (hd,),
            f"blk.{i}.attn_k_norm.weight": (hd,),
        }

    def ffn_block(i):
        return {
            f"blk.{i}.ffn_gate.weight": (sh.n_ff, E),
            f"blk.{i}.ffn_up.weight": (sh.n_ff, E),
            f"blk.{i}.ffn_down.weight": (E, sh.n_ff),
        }

    for i in range(sh.n_layer):
        out[f"blk.{i}.attn_norm.weight"] = (E,)
        out[f"blk.{i}.post_attention_norm.weight"] = (E,)
        if qwen35_is_recurrent(sh, i):
            out.update(
                {
                    f"blk.{i}.attn_qkv.weight": (conv_dim, E),  # q (key_dim) | k (key_dim) | v (value_dim)
                    f"blk.{i}.attn_gate.weight": (value_dim, E),  # z
                    f"blk.{i}.ssm_conv1d.weight": (conv_dim, sh.ssm_d_conv),
                    f"blk.{i}.ssm_dt.bias": (sh.ssm_dt_rank,),
                    f"blk.{i}.ssm_a": (sh.ssm_dt_rank,),  # = -exp(A_log), no ".weight"
                    f"blk.{i}.ssm_beta.weight": (sh.ssm_dt_rank, E),
                    f"blk.{i}.ssm_alpha.weight": (sh.ssm_dt_rank, E),
                    f"blk.{i}.ssm_norm.weight": (sh.ssm_d_state,),
                    f"blk.{i}.ssm_out.weight": (E, value_dim),
                }
            )
        else:
            out.update(attn_block(i))
        out.update(ffn_block(i))
    if nextn:
        i = sh.n_layer
        out[f"blk.{i}.attn_norm.weight"] = (E,)
        out[f"blk.{i}.post_attention_norm.weight"] = (E,)
        out.update(attn_block(i))
        out.update(ffn_block(i))
        out[f"blk.{i}.nextn.eh_proj.weight"] = (E, 2 * E)  # input = concat(enorm(embd(tok)), hnorm(h)), embedding first
        out[f"blk.{i}.nextn.enorm.weight"] = (E,)
        out[f"blk.{i}.nextn.hnorm.weight"] = (E,)
        out[f"blk.{i}.nextn.shared_head_norm.weight"] = (E,)  # optional (falls back to output_norm)
        # optional and not written: nextn.embed_tokens (n_vocab, E), nextn.shared_head_head (n_vocab, E)
    return out


def _qwen35_tensors(
    sh: Qwen35Shapes,
    n_vocab: int,
    nextn: bool,
    seed: int,
    trunk_scale: float,
    mtp_agree: float,
    mtp_scale: float,
    logit_std: float,
) -> dict[str, np.ndarray]:
    shapes = qwen35_tensor_shapes(sh, n_vocab, nextn)
    E = sh.n_embd
    t: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        blk = int(name.split(".")[1]) if name.startswith("blk.") else -1
        is_mtp = blk == sh.n_layer
        if len(shape) == 1:
            if name.endswith("ssm_a"):
                # -A with A in [1, 16] (HF init of A_log = log(uniform(1, 16)))
                t[name] = -np.exp(_uniform(seed, name, shape, 0.0, np.log(16.0)))
            elif name.endswith("ssm_dt.bias"):
                dt = np.exp(_uniform(seed, name, shape, np.log(1e-3), np.log(1e-1)))
                t[name] = np.log(np.expm1(dt)).astype(np.float32)
            else:
                t[name] = np.ones(shape, np.float32)  # all RMSNorm weights (GGUF stores 1+w)
            continue
        if name == "token_embd.weight":
            t[name] = _normal(seed, name, shape, 1.0)
            t[name][BASE_VOCAB_SIZE:] = 0.0
            continue
        if name == "output.weight":
            w = _normal(seed, name, shape, logit_std / np.sqrt(E))
            w[BASE_VOCAB_SIZE:] = 0.0  # padded tokens get logit 0
            t[name] = w
            continue
        if name.endswith("nextn.eh_proj.weight"):
            # identity on the token-embedding half (mtp_agree) + small random rest
            w = _normal(seed, name, shape, mtp_scale / np.sqrt(2 * E))
            w[:, :E] += mtp_agree * np.eye(E, dtype=np.float32)
            t[name] = w
            continue
        if name.endswith("ssm_conv1d.weight"):
            t[name] = _normal(seed, name, shape, 1.0 / np.sqrt(shape[1]))
            continue
        scale = mtp_scale if is_mtp else trunk_scale
        t[name] = _normal(seed, name, shape, scale / np.sqrt(shape[1]))
    return t


def _write(w: gguf.GGUFWriter, tensors: dict[str, np.ndarray], wtype: str) -> None:
    """wtype: f32 | f16 | q8_0 | q4_0 | q5_0 ...: 2-D matmul weights (n_in % 32 == 0) get that type,
    1-D tensors and ssm_conv1d stay f32 (llama.cpp's ssm_conv needs f32)."""
    qt = {
        "f16": None,
        "q8_0": gguf.GGMLQuantizationType.Q8_0,
        "q4_0": gguf.GGMLQuantizationType.Q4_0,
        "q4_1": gguf.GGMLQuantizationType.Q4_1,
        "q5_0": gguf.GGMLQuantizationType.Q5_0,
        "q5_1": gguf.GGMLQuantizationType.Q5_1,
    }
    for name, a in tensors.items():
        if wtype == "f32" or a.ndim == 1 or "ssm_conv1d" in name:
            w.add_tensor(name, a)
        elif wtype == "f16":
            w.add_tensor(name, a.astype(np.float16))
        else:
            T = qt[wtype]
            if a.shape[-1] % gguf.GGML_QUANT_SIZES[T][0]:
                w.add_tensor(name, a.astype(np.float16))
            else:
                w.add_tensor(name, gguf.quants.quantize(a, T), raw_dtype=T)


def write_tiny_qwen35(
    path: str | os.PathLike[str],
    *,
    nextn: bool = False,
    shapes: str | Qwen35Shapes = "tiny",
    seed: int = 0,
    trunk_scale: float = 1.0,
    mtp_agree: float = 0.0,
    mtp_scale: float = 1.0,
    logit_std: float = 3.0,
    wtype: str = "f32",
    mtp_only: bool = False,
    **overrides,
) -> Path:
    """Write a random qwen35 GGUF and return its path.

    nextn:       append one NextN/MTP block (blk.{n_layer}.*), block_count = n_layer + 1,
                 qwen35.nextn_predict_layers = 1 (llama.cpp's qwen35 MTP graph supports exactly 1).
    shapes:      "tiny" or "qwen3.5-0.8b" (or a Qwen35Shapes); **overrides replace fields.
    trunk_scale: std multiplier of the trunk's projections (lower -> the residual stream stays close
                 to the token embedding, so the next token is mostly a function of the current one).
    mtp_agree:   weight of an identity path from the token embedding through eh_proj; with
                 mtp_agree ~1 and small mtp_scale, the MTP head predicts roughly what the target
                 predicts for the next position (gives non-trivial acceptance with random weights).
    wtype:       f32 | f16 | q8_0 | q4_0 | q4_1 | q5_0 | q5_1 for 2-D matmul weights.
    mtp_only:    write the MTP block without the model's own layers, as llama.cpp's converter does with
                 --mtp (an mtp-*.gguf drafter file); implies nextn.
    """
    nextn = nextn or mtp_only
    sh = QWEN35_SHAPES[shapes] if isinstance(shapes, str) else shapes
    if overrides:
        sh = replace(sh, **overrides)
    assert 2 * sum(sh.rope_sections) == sh.n_rot, "rope sections must cover n_rot/2 pairs"
    assert sh.ssm_dt_rank % sh.ssm_n_group == 0
    tokens = vocab_tokens(sh.n_vocab)
    n_vocab = len(tokens)

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arch = gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.QWEN35]  # "qwen35"
    w = gguf.GGUFWriter(path, arch)
    w.add_name(f"tiny-qwen35{'-mtp' if nextn else ''}-seed{seed}")
    w.add_file_type(
        gguf.LlamaFileType.ALL_F32
        if wtype == "f32"
        else gguf.LlamaFileType.MOSTLY_F16
        if wtype == "f16"
        else getattr(gguf.LlamaFileType, "MOSTLY_" + wtype.upper())
    )
    w.add_context_length(sh.n_ctx_train)
    w.add_embedding_length(sh.n_embd)
    w.add_block_count(sh.n_layer + (1 if nextn else 0))  # n_layer_all (trunk + MTP)
    if nextn:
        w.add_nextn_predict_layers(1)
    w.add_feed_forward_length(sh.n_ff)
    w.add_head_count(sh.n_head)
    w.add_head_count_kv(sh.n_head_kv)
    w.add_key_length(sh.head_dim)
    w.add_value_length(sh.head_dim)
    w.add_rope_dimension_count(sh.n_rot)
    w.add_rope_dimension_sections(list(sh.rope_sections))  # required by the qwen35 loader (4 ints)
    w.add_rope_freq_base(sh.rope_freq_base)
    w.add_layer_norm_rms_eps(sh.rms_eps)
    w.add_ssm_conv_kernel(sh.ssm_d_conv)
    w.add_ssm_state_size(sh.ssm_d_state)
    w.add_ssm_group_count(sh.ssm_n_group)
    w.add_ssm_time_step_rank(sh.ssm_dt_rank)
    w.add_ssm_inner_size(sh.ssm_d_inner)
    w.add_full_attention_interval(sh.full_attention_interval)
    _add_spm_vocab(w, tokens)

    tensors = _qwen35_tensors(sh, n_vocab, nextn, seed, trunk_scale, mtp_agree, mtp_scale, logit_std)
    if mtp_only:
        tensors = {name: t for name, t in tensors.items() if not name.startswith("blk.") or name.startswith(f"blk.{sh.n_layer}.")}
    _write(w, tensors, wtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ---------------------------------------------------------------------------------------------
# lfm2: short convolutions (a recurrent state of l_cache - 1 inputs) and attention
# ---------------------------------------------------------------------------------------------


def write_tiny_lfm2(
    path: str | os.PathLike[str],
    *,
    seed: int = 0,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int = 2,
    l_cache: int = 3,
    attention: tuple[bool, ...] = (False, False, True, False),
) -> Path:
    """A random LFM2 (llama_model_lfm2): a layer is a short convolution where its head_count_kv is 0."""
    tokens = vocab_tokens()
    n_vocab, head_dim, n_ff = len(tokens), n_embd // n_head, 2 * n_embd
    path = Path(path)
    w = gguf.GGUFWriter(path, "lfm2")
    w.add_name(f"tiny-lfm2-seed{seed}")
    w.add_context_length(4096)
    w.add_embedding_length(n_embd)
    w.add_block_count(len(attention))
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv([n_head_kv if attends else 0 for attends in attention])
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_shortconv_l_cache(l_cache)
    _add_spm_vocab(w, tokens)
    t = {
        "token_embd.weight": _normal(seed, "token_embd", (n_vocab, n_embd), 1.0),
        "token_embd_norm.weight": np.ones(n_embd, np.float32),  # LFM2's output norm keeps this name
        "output.weight": _normal(seed, "output", (n_vocab, n_embd), 3.0 / np.sqrt(n_embd)),
    }
    for i, attends in enumerate(attention):
        b = f"blk.{i}"
        t[f"{b}.attn_norm.weight"] = np.ones(n_embd, np.float32)
        t[f"{b}.ffn_norm.weight"] = np.ones(n_embd, np.float32)
        t[f"{b}.ffn_gate.weight"] = _normal(seed, f"{b}.gate", (n_ff, n_embd), 1 / np.sqrt(n_embd))
        t[f"{b}.ffn_up.weight"] = _normal(seed, f"{b}.up", (n_ff, n_embd), 1 / np.sqrt(n_embd))
        t[f"{b}.ffn_down.weight"] = _normal(seed, f"{b}.down", (n_embd, n_ff), 1 / np.sqrt(n_ff))
        if attends:
            t[f"{b}.attn_q_norm.weight"] = np.ones(head_dim, np.float32)
            t[f"{b}.attn_k_norm.weight"] = np.ones(head_dim, np.float32)
            t[f"{b}.attn_q.weight"] = _normal(seed, f"{b}.q", (n_embd, n_embd), 1 / np.sqrt(n_embd))
            t[f"{b}.attn_k.weight"] = _normal(seed, f"{b}.k", (n_head_kv * head_dim, n_embd), 1 / np.sqrt(n_embd))
            t[f"{b}.attn_v.weight"] = _normal(seed, f"{b}.v", (n_head_kv * head_dim, n_embd), 1 / np.sqrt(n_embd))
            t[f"{b}.attn_output.weight"] = _normal(seed, f"{b}.o", (n_embd, n_embd), 1 / np.sqrt(n_embd))
        else:
            t[f"{b}.shortconv.conv.weight"] = _normal(seed, f"{b}.conv", (n_embd, l_cache), 1 / np.sqrt(l_cache))
            t[f"{b}.shortconv.in_proj.weight"] = _normal(seed, f"{b}.in", (3 * n_embd, n_embd), 1 / np.sqrt(n_embd))
            t[f"{b}.shortconv.out_proj.weight"] = _normal(seed, f"{b}.out", (n_embd, n_embd), 1 / np.sqrt(n_embd))
    _write(w, t, "f32")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ---------------------------------------------------------------------------------------------
# nemotron_h: Mamba-2 layers, attention layers and MLP layers, each a layer of its own
# ---------------------------------------------------------------------------------------------


def write_tiny_nemotron_h(
    path: str | os.PathLike[str],
    *,
    seed: int = 0,
    n_embd: int = 64,
    layers: str = "M-*M",
    d_inner: int = 128,
    d_state: int = 16,
    n_group: int = 2,
    n_ssm_head: int = 8,
) -> Path:
    """A random Nemotron-H (llama_model_nemotron_h): `layers` spells its layers as NVIDIA's
    hybrid_override_pattern does, M a Mamba-2 layer, * attention, - an MLP. A layer keeps a
    recurrent state where both its head_count_kv and its feed_forward_length are 0."""
    tokens = vocab_tokens()
    n_vocab, n_head, n_head_kv, n_ff, d_conv = len(tokens), 4, 2, 2 * n_embd, 4
    head_dim, conv_dim = n_embd // n_head, d_inner + 2 * n_group * d_state
    path = Path(path)
    w = gguf.GGUFWriter(path, "nemotron_h")
    w.add_name(f"tiny-nemotron-h-seed{seed}")
    w.add_context_length(4096)
    w.add_embedding_length(n_embd)
    w.add_block_count(len(layers))
    w.add_feed_forward_length([n_ff if kind == "-" else 0 for kind in layers])
    w.add_head_count(n_head)
    w.add_head_count_kv([n_head_kv if kind == "*" else 0 for kind in layers])
    w.add_layer_norm_eps(1e-5)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(n_ssm_head)
    w.add_ssm_group_count(n_group)
    _add_spm_vocab(w, tokens)
    t = {
        "token_embd.weight": _normal(seed, "token_embd", (n_vocab, n_embd), 1.0),
        "output_norm.weight": np.ones(n_embd, np.float32),
        "output.weight": _normal(seed, "output", (n_vocab, n_embd), 3.0 / np.sqrt(n_embd)),
    }
    for i, kind in enumerate(layers):
        b = f"blk.{i}"
        t[f"{b}.attn_norm.weight"] = np.ones(n_embd, np.float32)
        if kind == "M":
            d_in_proj = 2 * d_inner + 2 * n_group * d_state + n_ssm_head  # z, x, B, C and dt
            t[f"{b}.ssm_in.weight"] = _normal(seed, f"{b}.in", (d_in_proj, n_embd), 1 / np.sqrt(n_embd))
            t[f"{b}.ssm_conv1d.weight"] = _normal(seed, f"{b}.conv", (conv_dim, d_conv), 1 / np.sqrt(d_conv))
            t[f"{b}.ssm_conv1d.bias"] = np.zeros(conv_dim, np.float32)
            t[f"{b}.ssm_dt.bias"] = np.full(n_ssm_head, -3.0, np.float32)
            t[f"{b}.ssm_a"] = -np.exp(_uniform(seed, f"{b}.a", (n_ssm_head, 1), 0.0, np.log(16.0)))
            t[f"{b}.ssm_d"] = np.ones((n_ssm_head, 1), np.float32)
            t[f"{b}.ssm_norm.weight"] = np.ones((n_group, d_inner // n_group), np.float32)
            t[f"{b}.ssm_out.weight"] = _normal(seed, f"{b}.out", (n_embd, d_inner), 1 / np.sqrt(d_inner))
        elif kind == "*":
            t[f"{b}.attn_q.weight"] = _normal(seed, f"{b}.q", (n_embd, n_embd), 1 / np.sqrt(n_embd))
            t[f"{b}.attn_k.weight"] = _normal(seed, f"{b}.k", (n_head_kv * head_dim, n_embd), 1 / np.sqrt(n_embd))
            t[f"{b}.attn_v.weight"] = _normal(seed, f"{b}.v", (n_head_kv * head_dim, n_embd), 1 / np.sqrt(n_embd))
            t[f"{b}.attn_output.weight"] = _normal(seed, f"{b}.o", (n_embd, n_embd), 1 / np.sqrt(n_embd))
        else:
            t[f"{b}.ffn_up.weight"] = _normal(seed, f"{b}.up", (n_ff, n_embd), 1 / np.sqrt(n_embd))
            t[f"{b}.ffn_down.weight"] = _normal(seed, f"{b}.down", (n_embd, n_ff), 1 / np.sqrt(n_ff))
    _write(w, t, "f32")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ---------------------------------------------------------------------------------------------
# mamba: recurrent only, and not among the architectures llama.cpp rolls back
# ---------------------------------------------------------------------------------------------


def write_tiny_mamba(path: str | os.PathLike[str], *, seed: int = 0, n_layer: int = 2, n_embd: int = 32) -> Path:
    """A random Mamba (llama_model_mamba: d_inner = 2 * n_embd, the only expansion it takes)."""
    d_inner, d_state, d_conv, dt_rank = 2 * n_embd, 8, 4, 4
    tokens = vocab_tokens()
    n_vocab = len(tokens)
    path = Path(path)
    w = gguf.GGUFWriter(path, "mamba")
    w.add_name(f"tiny-mamba-seed{seed}")
    w.add_context_length(4096)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(dt_rank)
    w.add_layer_norm_rms_eps(1e-6)
    _add_spm_vocab(w, tokens)
    t = {
        "token_embd.weight": _normal(seed, "token_embd", (n_vocab, n_embd), 1.0),
        "output_norm.weight": np.ones(n_embd, np.float32),
        "output.weight": _normal(seed, "output", (n_vocab, n_embd), 3.0 / np.sqrt(n_embd)),
    }
    for i in range(n_layer):
        b = f"blk.{i}"
        t[f"{b}.attn_norm.weight"] = np.ones(n_embd, np.float32)
        t[f"{b}.ssm_in.weight"] = _normal(seed, f"{b}.in", (2 * d_inner, n_embd), 1 / np.sqrt(n_embd))
        t[f"{b}.ssm_conv1d.weight"] = _normal(seed, f"{b}.conv", (d_inner, d_conv), 1 / np.sqrt(d_conv))
        t[f"{b}.ssm_conv1d.bias"] = np.zeros(d_inner, np.float32)
        t[f"{b}.ssm_x.weight"] = _normal(seed, f"{b}.x", (dt_rank + 2 * d_state, d_inner), 1 / np.sqrt(d_inner))
        t[f"{b}.ssm_dt.weight"] = _normal(seed, f"{b}.dt", (d_inner, dt_rank), 1 / np.sqrt(dt_rank))
        t[f"{b}.ssm_dt.bias"] = np.full(d_inner, -3.0, np.float32)
        t[f"{b}.ssm_a"] = -np.exp(_uniform(seed, f"{b}.a", (d_inner, d_state), 0.0, np.log(16.0)))
        t[f"{b}.ssm_d"] = np.ones(d_inner, np.float32)
        t[f"{b}.ssm_out.weight"] = _normal(seed, f"{b}.out", (n_embd, d_inner), 1 / np.sqrt(d_inner))
    _write(w, t, "f32")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
