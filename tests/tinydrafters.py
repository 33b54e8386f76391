"""Tiny random GGUFs of llama.cpp's trained drafters, for tests (not a test module itself).

A trained drafter is a small network of its own that reads a target's hidden states, so it only
runs beside its target: each file here fits a target written by tinymodels.write_tiny_llama or
tinyhybrid.write_tiny_qwen35 (same vocabulary, and the target's width and layer count given).

- `write_tiny_eagle3`: EAGLE-3 ("eagle3"): an encoder `fc` fuses 3 of the target's layers'
  hidden states into one row, and one decoder layer reads (next token, fused row) pairs.
- `write_tiny_dflash`: DFlash ("dflash"): `fc` fuses the target's layers into K/V rows injected
  into the drafter's cache, and a few non-causal layers denoise a block [last token, mask...];
  optionally with DSpark's Markov (and confidence) head, or DFlash2's convolutions and selector.

Neither needs weights of the target in the file: by default, like the released drafters, they
borrow its token embeddings and output head, so llama.cpp creates their context only with
`ctx_other` pointing at the target's context; `own_head` writes both, so no target is needed.

Tensors and keys follow src/models/eagle3.cpp and src/models/dflash.cpp of the llama.cpp that
llama-cpp-python vendors. The PyPI gguf package has no MODEL_ARCH.EAGLE3 / DFLASH nor writer
calls for their keys (vendor/llama.cpp/gguf-py has), so keys are written by name; the
architecture string is all llama.cpp dispatches on. Weights depend only on the seed and names.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import gguf
import numpy as np
from tinyhybrid import _add_spm_vocab, _normal, _write
from tinyhybrid import vocab_tokens as padded_vocab_tokens
from tinymodels import UNK_ID, Vocab, _tensors, vocab_tokens


def _target_vocab(vocab: Vocab, n_vocab: int | None) -> list[tuple[str, float, gguf.TokenType]]:
    """The target's vocabulary: a tinymodels variant, or (n_vocab) the base one padded to a
    real model's size as write_tiny_qwen35 pads it. A drafter shares its target's ids."""
    if n_vocab is None:
        return vocab_tokens(vocab)
    if vocab != "base":
        raise ValueError("n_vocab pads the base vocabulary only")
    return padded_vocab_tokens(n_vocab)


def _check_layers(layers: Sequence[int], target_n_layer: int) -> list[int]:
    # Ids name the *input* of a target layer (llama_set_embeddings_layer_inp). llama.cpp also
    # accepts n_layer (the last layer's output), but only a few graphs tap it (nemotron_h, mimo2,
    # deepseek4): llama's and qwen35's abort in llm_graph_result::set_outputs, so 0..n_layer-1.
    if len(layers) == 0 or not all(0 <= i < target_n_layer for i in layers):
        raise ValueError(f"target layers {list(layers)} must lie in 0..{target_n_layer - 1}")
    return [int(i) for i in layers]


def _proj(seed: int, name: str, n_out: int, n_in: int) -> np.ndarray:
    """A matmul weight, numpy (n_out, n_in) (ggml ne is the reverse), unit-gain scale."""
    return _normal(seed, name, (n_out, n_in), 1.0 / np.sqrt(n_in))


def _own_head(seed: int, n_vocab: int, n_embd: int) -> dict[str, np.ndarray]:
    """token_embd and output drawn as write_tiny_llama draws them: with the target's seed they
    are bit-identical to its own (tinymodels._tensors with no layers)."""
    t = _tensors(seed, n_vocab, 0, n_embd, 1, 1, 1)
    return {name: t[name] for name in ("token_embd.weight", "output.weight")}


def _start(path, arch: str, name: str, tokens) -> gguf.GGUFWriter:
    """A writer for `arch` with the target's vocabulary."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(path, arch)
    w.add_name(name)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_spm_vocab(w, tokens)
    return w


def _add_shape(w: gguf.GGUFWriter, n_ctx_train: int, n_embd: int, n_layer: int, n_ff: int, n_head: int, n_head_kv: int):
    """The keys every llama.cpp model reads (llama_model_base::load_hparams), and the norms' eps."""
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)  # both drafters' load_arch_hparams require it
    w.add_rope_freq_base(10000.0)


def _finish(w: gguf.GGUFWriter, tensors: dict[str, np.ndarray]) -> None:
    _write(w, tensors, "f32")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ---------------------------------------------------------------------------------------------
# eagle3
# ---------------------------------------------------------------------------------------------


def write_tiny_eagle3(
    path: str | os.PathLike[str],
    *,
    target_n_embd: int = 64,
    target_n_layer: int = 2,
    target_layers: Sequence[int] | None = None,
    vocab: Vocab = "base",
    n_vocab: int | None = None,
    n_head: int = 4,
    n_head_kv: int | None = None,
    n_ff: int = 128,
    seed: int = 0,
    own_head: bool = False,
    n_ctx_train: int = 512,
) -> Path:
    """Write a random EAGLE-3 drafter (llama_model_eagle3) for a target of `target_n_embd` wide,
    `target_n_layer` deep, and return its path. The defaults fit write_tiny_llama's defaults.

    target_layers: the 3 target layers whose inputs `fc` fuses (eagle3.target_layers; llama.cpp
                   requires exactly 3). Default (1, n/2, n-1), as HF EAGLE-3's (2, n/2, n-3) at small n.
    vocab, n_vocab: the target's vocabulary (n_vocab: the base one padded, as write_tiny_qwen35's).
    own_head:      also write token_embd and output (the target's with its seed), so a context over
                   the drafter needs no ctx_other.
    The drafter is as wide as its target: its decoder concatenates the target's token embedding
    with its own fused row, and its q/k/v read 2 * n_embd.
    """
    if target_layers is None:
        target_layers = (1, target_n_layer // 2, target_n_layer - 1)
    layers = _check_layers(target_layers, target_n_layer)
    if len(layers) != 3:
        raise ValueError("EAGLE-3 fuses exactly 3 target layers")
    n_embd, n_head_kv = target_n_embd, n_head if n_head_kv is None else n_head_kv
    if n_embd % n_head or n_head % n_head_kv:
        raise ValueError("n_embd must divide by n_head, and n_head by n_head_kv")
    tokens = _target_vocab(vocab, n_vocab)
    hd = n_embd // n_head

    arch = "eagle3"
    w = _start(path, arch, f"tiny-eagle3-seed{seed}", tokens)
    _add_shape(w, n_ctx_train, n_embd, 1, n_ff, n_head, n_head_kv)  # one layer: its graph asserts n_layer == 1
    w.add_rope_dimension_count(hd)
    w.add_array(f"{arch}.target_layers", layers)  # eagle3.cpp: required, exactly 3
    w.add_uint32(f"{arch}.target_hidden_size", target_n_embd)  # required: fc reads 3 * this
    w.add_bool(f"{arch}.norm_before_residual", False)  # optional, as the converter writes it

    ones = np.ones(n_embd, np.float32)
    t = {
        "fc.weight": _proj(seed, "fc.weight", n_embd, 3 * target_n_embd),
        "output_norm.weight": ones,
        "blk.0.attn_norm.weight": ones,  # on the token embedding
        "blk.0.attn_norm_2.weight": ones,  # "hidden_norm", on the fused row
        "blk.0.attn_q.weight": _proj(seed, "blk.0.attn_q.weight", n_head * hd, 2 * n_embd),
        "blk.0.attn_k.weight": _proj(seed, "blk.0.attn_k.weight", n_head_kv * hd, 2 * n_embd),
        "blk.0.attn_v.weight": _proj(seed, "blk.0.attn_v.weight", n_head_kv * hd, 2 * n_embd),
        "blk.0.attn_output.weight": _proj(seed, "blk.0.attn_output.weight", n_embd, n_head * hd),
        "blk.0.ffn_norm.weight": ones,
        "blk.0.ffn_gate.weight": _proj(seed, "blk.0.ffn_gate.weight", n_ff, n_embd),
        "blk.0.ffn_up.weight": _proj(seed, "blk.0.ffn_up.weight", n_ff, n_embd),
        "blk.0.ffn_down.weight": _proj(seed, "blk.0.ffn_down.weight", n_embd, n_ff),
    }
    if own_head:
        t.update(_own_head(seed, len(tokens), n_embd))
    _finish(w, t)
    return Path(path)


def write_agreeing_eagle3(path: str | os.PathLike[str], *, target_seed: int, logit_std: float, target_n_embd: int = 64) -> Path:
    """An EAGLE-3 drafter built, not drawn, to guess what follows its own token as a 2-layer
    write_tiny_llama target of `target_seed` and `logit_std` would with no layers at all: with a
    small `layer_scale` the target writes much the same, with a larger one less often. The
    drafter is 8 wider than the target: its own token embeddings hold CONSTANT in column 0 and
    the target's embeddings after it, its output head the target's (column 0 empty). q and k
    read column 0 alone, in the two fastest-turning rope pairs, so they are the same at every row
    and each row attends to itself; v and the output projection carry the target's columns; the
    fused row (fc's, or the drafter's own last output row) reaches the residual normed by 1e-4,
    and the FFN writes nothing. The output is then the target's embedding of the
    row's own token, which the output head scores as a target without layers would, a little
    sharper (normed over 8 more columns): drafts sampled from it are not the target's draws."""
    n_embd, n_head, n_ff, hd = target_n_embd + 8, 4, 128, (target_n_embd + 8) // 4
    theirs = _tensors(target_seed, len(vocab_tokens("base")), 0, target_n_embd, 1, 1, 1, logit_std)
    embd = np.zeros((len(theirs["token_embd.weight"]), n_embd), np.float32)
    embd[:, 0], embd[:, 1 : 1 + target_n_embd] = CONSTANT, theirs["token_embd.weight"]
    output = np.zeros((len(embd), n_embd), np.float32)
    output[:, 1 : 1 + target_n_embd] = theirs["output.weight"]
    q = np.zeros((n_head * hd, 2 * n_embd), np.float32)
    for head in range(n_head):
        q[head * hd : head * hd + 4, 0] = 1.2  # rope pairs (0, 1) and (2, 3): 1 and 0.32 radians a position
    v = np.zeros((n_embd, 2 * n_embd), np.float32)
    v[1 : 1 + target_n_embd, 1 : 1 + target_n_embd] = np.eye(target_n_embd, dtype=np.float32)
    arch, ones = "eagle3", np.ones(n_embd, np.float32)
    w = _start(path, arch, f"agreeing-eagle3-seed{target_seed}", vocab_tokens("base"))
    _add_shape(w, 512, n_embd, 1, n_ff, n_head, n_head)
    w.add_rope_dimension_count(hd)
    w.add_array(f"{arch}.target_layers", [0, 1, 1])
    w.add_uint32(f"{arch}.target_hidden_size", target_n_embd)
    w.add_bool(f"{arch}.norm_before_residual", True)  # the residual takes the fused row normed: by 1e-4, nothing
    _finish(
        w,
        {
            "token_embd.weight": embd,
            "output.weight": output,
            "fc.weight": np.full((n_embd, 3 * target_n_embd), 1e-6, np.float32),
            "output_norm.weight": ones,
            "blk.0.attn_norm.weight": ones,
            "blk.0.attn_norm_2.weight": np.full(n_embd, 1e-4, np.float32),
            "blk.0.attn_q.weight": q,
            "blk.0.attn_k.weight": q.copy(),
            "blk.0.attn_v.weight": v,
            "blk.0.attn_output.weight": np.eye(n_embd, dtype=np.float32),
            "blk.0.ffn_norm.weight": ones,
            "blk.0.ffn_gate.weight": np.zeros((n_ff, n_embd), np.float32),
            "blk.0.ffn_up.weight": np.zeros((n_ff, n_embd), np.float32),
            "blk.0.ffn_down.weight": np.zeros((n_embd, n_ff), np.float32),
        },
    )
    return Path(path)


CONSTANT = 40.0  # the agreeing drafter's token embeddings all hold this in column 0


# ---------------------------------------------------------------------------------------------
# dflash (and DSpark, DFlash2)
# ---------------------------------------------------------------------------------------------


def _markov_head(seed: int, n_vocab: int, n_embd: int, rank: int, confidence: bool, scale: float) -> dict[str, np.ndarray]:
    """DSpark: a bias on each block position's logits from the token before it
    (markov_w2 @ markov_w1[prev], about `scale` units); with `confidence`, the head whose sigmoid
    ends a draft early."""
    t = {
        "markov_w1.weight": _normal(seed, "markov_w1.weight", (n_vocab, rank), 1.0),  # ne {rank, n_vocab}: rows by token
        "markov_w2.weight": scale * _proj(seed, "markov_w2.weight", n_vocab, rank),  # ne {rank, n_vocab_draft}
    }
    if confidence:
        t["conf_proj.weight"] = _proj(seed, "conf_proj.weight", 1, n_embd + rank)  # reads [hidden; w1[prev]]
        t["conf_proj.bias"] = np.zeros(1, np.float32)
    return t


def _selector(seed: int, n_vocab: int, n_embd: int, n_layer: int, rank: int, kernel: int, group: int) -> dict[str, np.ndarray]:
    """DFlash2: dynamic convolutions around each layer's attention and FFN, and a selector that
    scores pairs of top-k candidates of neighbouring positions (codebooks by token)."""
    projected = 2 * kernel * (n_embd // group)
    t = {
        "selector_predecessor.weight": _normal(seed, "selector_predecessor.weight", (n_vocab, rank), 1.0),
        "selector_successor.weight": _normal(seed, "selector_successor.weight", (n_vocab, rank), 1.0),
        "selector_hidden.weight": _proj(seed, "selector_hidden.weight", rank, n_embd),
    }
    for i in range(n_layer):
        for side in ("attn", "ffn"):
            # the base kernels have no ".weight" suffix (tn(LLM_TENSOR_DFLASH_*_CONV_BASE, i))
            t[f"blk.{i}.{side}_conv_base"] = _normal(seed, f"blk.{i}.{side}_conv_base", (2, kernel, n_embd), 1.0 / kernel)
            t[f"blk.{i}.{side}_conv_proj.weight"] = _proj(seed, f"blk.{i}.{side}_conv_proj.weight", projected, n_embd)
    return t


def write_tiny_dflash(
    path: str | os.PathLike[str],
    *,
    target_n_embd: int = 64,
    target_n_layer: int = 2,
    target_layers: Sequence[int] | None = None,
    vocab: Vocab = "base",
    n_vocab: int | None = None,
    n_layer: int = 1,
    n_head: int = 4,
    n_head_kv: int | None = None,
    n_ff: int = 128,
    block_size: int = 16,
    mask_id: int = UNK_ID,
    causal: bool | None = None,
    markov: bool = False,
    markov_rank: int = 16,
    markov_scale: float = 1.0,
    confidence_head: bool = True,
    sample_from_anchor: bool = True,
    selector_top_k: int = 0,
    selector_rank: int = 16,
    conv_kernel_size: int = 3,
    conv_group_size: int = 16,
    seed: int = 0,
    own_head: bool = False,
    n_ctx_train: int = 512,
    layer_scale: float = 1.0,
) -> Path:
    """Write a random DFlash drafter (llama_model_dflash) for a target of `target_n_embd` wide,
    `target_n_layer` deep, and return its path. The defaults fit write_tiny_llama's defaults.

    target_layers: target layer inputs `fc` fuses (dflash.target_layers, any number; the converter
                   writes HF's ids + 1). Default up to 5 spread over 1..target_n_layer-1 ((0, 1) for 2).
    block_size:    dflash.block_size, the trained block: llama.cpp drafts at most block_size - 1
                   tokens (block_size with DSpark sampling from the anchor).
    mask_id:       tokenizer.ggml.mask_token_id, the token the noise block is filled with. The tiny
                   vocabularies have no mask token; <unk> (never produced) plays it, as released
                   drafters name an unused id of the target's padded vocabulary.
    causal:        dflash.attention.causal when given; absent, llama.cpp drafts non-causally.
    markov:        DSpark's Markov head (markov_w1/markov_w2, rank `markov_rank`, its bias about
                   `markov_scale` units), with the confidence
                   head (conf_proj) when `confidence_head`; writes dflash.sample_from_anchor and
                   dflash.has_confidence_head as the converter does.
    selector_top_k: > 0 makes it DFlash2: per-layer convolutions and the selector, with
                   dflash.conv_kernel_size / conv_group_size / selector_rank / selector_top_k.
    own_head:      also write token_embd and output (the target's with its seed): no ctx_other needed.
    layer_scale:   scales what each layer's attention and FFN write into the residual: small, each
                   row's output stays close to its own input (the mask token's embedding).
    The drafter is as wide as its target: llama.cpp sizes fc by len(target_layers) * its own n_embd.
    """
    if target_layers is None:
        first = 1 if target_n_layer > 2 else 0  # skip the token embeddings (id 0) where there is room
        target_layers = np.unique(np.linspace(first, target_n_layer - 1, min(target_n_layer, 5)).round().astype(int)).tolist()
    layers = _check_layers(target_layers, target_n_layer)
    n_embd, n_head_kv = target_n_embd, n_head if n_head_kv is None else n_head_kv
    if n_embd % n_head or n_head % n_head_kv:
        raise ValueError("n_embd must divide by n_head, and n_head by n_head_kv")
    if selector_top_k and (n_embd % conv_group_size or n_embd < selector_top_k * (selector_top_k + 1)):
        # dflash.cpp's load_arch_tensors refuses these; its lattice row holds top_k * (top_k + 1)
        raise ValueError("DFlash2 needs n_embd divisible by conv_group_size and >= top_k * (top_k + 1)")
    tokens = _target_vocab(vocab, n_vocab)
    if not 0 <= mask_id < len(tokens):
        raise ValueError(f"mask_id {mask_id} outside the vocabulary of {len(tokens)}")
    hd = n_embd // n_head

    arch = "dflash"
    kind = "dspark" if markov else "dflash2" if selector_top_k else "dflash"
    w = _start(path, arch, f"tiny-{kind}-seed{seed}", tokens)
    _add_shape(w, n_ctx_train, n_embd, n_layer, n_ff, n_head, n_head_kv)
    w.add_mask_token_id(mask_id)
    w.add_array(f"{arch}.target_layers", layers)  # dflash.cpp: required
    w.add_uint32(f"{arch}.block_size", block_size)  # read by speculative.cpp, and required by DSpark's graph
    if causal is not None:
        w.add_causal_attention(causal)  # dflash.attention.causal
    if markov:
        w.add_bool(f"{arch}.sample_from_anchor", sample_from_anchor)
        w.add_bool(f"{arch}.has_confidence_head", confidence_head)
    if selector_top_k:
        w.add_uint32(f"{arch}.conv_kernel_size", conv_kernel_size)
        w.add_uint32(f"{arch}.conv_group_size", conv_group_size)
        w.add_uint32(f"{arch}.selector_rank", selector_rank)
        w.add_uint32(f"{arch}.selector_top_k", selector_top_k)

    ones = np.ones(n_embd, np.float32)
    t = {
        "fc.weight": _proj(seed, "fc.weight", n_embd, len(layers) * n_embd),
        "enc.output_norm.weight": ones,  # the norm after fc ("hidden_norm")
        "output_norm.weight": ones,
    }
    for i in range(n_layer):
        b = f"blk.{i}"
        t[f"{b}.attn_norm.weight"] = ones
        t[f"{b}.attn_q.weight"] = _proj(seed, f"{b}.attn_q.weight", n_head * hd, n_embd)
        t[f"{b}.attn_k.weight"] = _proj(seed, f"{b}.attn_k.weight", n_head_kv * hd, n_embd)
        t[f"{b}.attn_v.weight"] = _proj(seed, f"{b}.attn_v.weight", n_head_kv * hd, n_embd)  # optional (shared K/V without)
        t[f"{b}.attn_output.weight"] = layer_scale * _proj(seed, f"{b}.attn_output.weight", n_embd, n_head * hd)
        t[f"{b}.attn_q_norm.weight"] = np.ones(hd, np.float32)  # Qwen3-style q/k norms: required
        t[f"{b}.attn_k_norm.weight"] = np.ones(hd, np.float32)
        t[f"{b}.ffn_norm.weight"] = ones
        t[f"{b}.ffn_gate.weight"] = _proj(seed, f"{b}.ffn_gate.weight", n_ff, n_embd)
        t[f"{b}.ffn_up.weight"] = _proj(seed, f"{b}.ffn_up.weight", n_ff, n_embd)
        t[f"{b}.ffn_down.weight"] = layer_scale * _proj(seed, f"{b}.ffn_down.weight", n_embd, n_ff)
    if markov:
        t.update(_markov_head(seed, len(tokens), n_embd, markov_rank, confidence_head, markov_scale))
    if selector_top_k:
        t.update(_selector(seed, len(tokens), n_embd, n_layer, selector_rank, conv_kernel_size, conv_group_size))
    if own_head:
        t.update(_own_head(seed, len(tokens), n_embd))
    _finish(w, t)
    return Path(path)
