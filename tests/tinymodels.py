"""Tiny random llama GGUF models for fast tests (not a test module itself).

`write_tiny_llama` writes a ~1 MB llama-architecture GGUF with a SentencePiece
("llama") vocabulary that llama.cpp loads in milliseconds, so tests can run real
draft/target loops without downloading weights.

Vocabulary variants, for draft/target compatibility tests (llama.cpp's rule: same
vocab type, same bos/eos, sizes within 128, same text for ids 5..min(n_vocab)-1):

- "base":      <unk>, <s>, </s>, 256 byte tokens, then English word pieces.
- "padded":    base + PAD_EXTRA unused "[PADi]" tokens: compatible with base.
- "different": same size as base, word pieces permuted: incompatible (text).
- "bigger":    base + BIGGER_EXTRA letter-pair pieces: incompatible (size).
- "alien":     the three special tokens and CJK characters only, no byte tokens: it shares
               nothing with base, so it cannot draft for it even translated.
- "gpt2":      another tokenizer altogether: GPT-2's byte-level BPE with merges for some of
               the words, no start token, <|endoftext|> as end; drafts for base only translated.

Weights depend only on `seed` and the shapes, never on the vocabulary: every variant
with the same seed has bit-identical weights for ids < BASE_VOCAB_SIZE, and the output
rows of extra tokens are zero, so a padded draft predicts like the base target.
"""

from __future__ import annotations

import os
import string
import zlib
from pathlib import Path
from typing import Literal

import gguf
import numpy as np

Vocab = Literal["base", "padded", "different", "bigger", "gpt2", "alien"]

UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
SPACE = "\u2581"  # SentencePiece's word-boundary marker "▁"

# Common English words; each is added as "▁word" together with all its prefixes
# ("▁w", "▁wo", ...) because SPM tokenization only merges pairs that are themselves
# tokens, so a word piece is unreachable without its prefix chain.
_WORDS = (
    "the of and to in is it that was for on are as with he his they at be this "
    "from have or by one had not but what all were when we there can an your which "
    "their said if do will each about how up out them then she many some so these "
    "would other into has more her two like him see time could no make than first "
    "been its who now people my made over did down only way find use may water "
    "long little very after words called just where most know hello world cat dog "
    "Hello The A I"
).split()
_PUNCT = ".,!?;:'\"-()[]{}/\\@#$%&*+=<>_~`^|"

PAD_EXTRA = 64  # "padded": within llama.cpp's 128-token size tolerance
BIGGER_EXTRA = 256  # "bigger": beyond it


def _base_pieces() -> list[str]:
    """Ordinary (non-special, non-byte) pieces, most 'frequent' first."""
    pieces = [SPACE, *string.ascii_lowercase, *string.ascii_uppercase, *string.digits, *_PUNCT]
    for word in _WORDS:
        marked = SPACE + word
        pieces += [marked[:i] for i in range(2, len(marked) + 1)]
    return list(dict.fromkeys(pieces))  # de-duplicate, keep first occurrence


_SPECIAL = [
    ("<unk>", gguf.TokenType.UNKNOWN),
    ("<s>", gguf.TokenType.CONTROL),
    ("</s>", gguf.TokenType.CONTROL),
]
_BYTES = [(f"<0x{b:02X}>", gguf.TokenType.BYTE) for b in range(256)]
_PIECES = _base_pieces()
# write_tiny_llama(fim=True): the bytes 0x01-0x05 stand for the prefix, suffix, middle, repository and file separator tokens
FIM_IDS = {
    key: len(_SPECIAL) + byte
    for byte, key in enumerate(
        (
            gguf.Keys.Tokenizer.FIM_PRE_ID,
            gguf.Keys.Tokenizer.FIM_SUF_ID,
            gguf.Keys.Tokenizer.FIM_MID_ID,
            gguf.Keys.Tokenizer.FIM_REP_ID,
            gguf.Keys.Tokenizer.FIM_SEP_ID,
        ),
        start=1,
    )
}
# Scores rank merges in SPM: earlier pieces win. Tied to the text, not the id, so the
# "different" vocabulary splits text into the same strings as "base".
_SCORE = {piece: -float(i) for i, piece in enumerate(_PIECES)}
BASE_VOCAB_SIZE = len(_SPECIAL) + len(_BYTES) + len(_PIECES)
_PERMUTATION = np.random.default_rng(12345).permutation(len(_PIECES))  # "different": fixed, whatever the weight seed


def vocab_tokens(vocab: Vocab = "base") -> list[tuple[str, float, gguf.TokenType]]:
    """(text, score, type) for every id of a vocabulary variant."""
    if vocab == "alien":
        return [(text, 0.0, kind) for text, kind in _SPECIAL] + [
            (chr(0x4E00 + i), -float(i), gguf.TokenType.NORMAL) for i in range(400)
        ]
    head = [(text, 0.0, kind) for text, kind in _SPECIAL + _BYTES]
    pieces = list(_PIECES)
    if vocab == "different":
        pieces = [pieces[i] for i in _PERMUTATION]
    body = [(p, _SCORE[p], gguf.TokenType.NORMAL) for p in pieces]
    if vocab == "padded":
        body += [(f"[PAD{i}]", -1e9, gguf.TokenType.UNUSED) for i in range(PAD_EXTRA)]
    elif vocab == "bigger":
        pairs = (a + b for a in string.ascii_lowercase for b in string.ascii_lowercase)
        extra = [p for p in pairs if p not in _SCORE][:BIGGER_EXTRA]
        body += [(p, -1000.0 - i, gguf.TokenType.NORMAL) for i, p in enumerate(extra)]
    elif vocab not in ("base", "different"):
        raise ValueError(f"unknown vocab variant {vocab!r}")
    return head + body


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (its vocabulary spells bytes this way)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("\u00a1"), ord("\u00ac") + 1),
        *range(ord("\u00ae"), ord("\u00ff") + 1),
    ]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


GPT2_EOT = "<|endoftext|>"


def gpt2_vocab() -> tuple[list[tuple[str, gguf.TokenType]], list[str]]:
    """(token, type) for every id and the merges of the "gpt2" vocabulary: <|endoftext|>, the 256
    bytes, then each of every other word of _WORDS (with and without its leading space) merged
    left to right, so BPE splits the rest into pieces the base vocabulary does not have."""
    byte_char = _bytes_to_unicode()
    tokens = [(GPT2_EOT, gguf.TokenType.CONTROL)] + [(byte_char[b], gguf.TokenType.NORMAL) for b in range(256)]
    known, merges = {text for text, _ in tokens}, []
    for word in _WORDS[::2]:
        for spelled in (" " + word, word):
            chars = [byte_char[b] for b in spelled.encode()]
            piece = chars[0]
            for char in chars[1:]:
                if piece + char not in known:
                    merges.append(f"{piece} {char}")
                    tokens.append((piece + char, gguf.TokenType.NORMAL))
                    known.add(piece + char)
                piece += char
    return tokens, merges


def _normal(seed: int, name: str, shape: tuple[int, ...], std: float) -> np.ndarray:
    """Random float32 tensor determined by (seed, tensor name) only.

    Rows are drawn in order from one stream, so a taller tensor with the same seed
    starts with the rows of a shorter one (used for vocab-sized tensors).
    """
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    return (rng.standard_normal(shape) * std).astype(np.float32)


def _tensors(
    seed: int,
    n_vocab: int,
    n_layer: int,
    n_embd: int,
    n_head: int,
    n_head_kv: int,
    n_ff: int,
    logit_std: float = 3.0,
    layer_scale: float = 1.0,
    steady: float = 0.0,
) -> dict[str, np.ndarray]:
    """Llama weights, numpy shape (n_out, n_in) (gguf reverses it to ggml's ne order).

    Scales: unit-variance embeddings, 1/sqrt(n_in) projections, and an output head
    giving logits with std ~`logit_std` (3: greedy decoding varies with the context and
    the top token rarely has 75% of the mass; 30: it usually has).
    """
    head_dim = n_embd // n_head
    ones = np.ones(n_embd, dtype=np.float32)
    out = _normal(seed, "output.weight", (n_vocab, n_embd), logit_std / np.sqrt(n_embd))
    out[BASE_VOCAB_SIZE:] = 0.0  # extra tokens get logit 0: padded models act like base
    embd = _normal(seed, "token_embd.weight", (n_vocab, n_embd), 1.0)
    if steady:
        embd[:, 0] = steady
    t = {
        "token_embd.weight": embd,
        "output_norm.weight": ones,
        "output.weight": out,
    }
    shapes = {
        "attn_q": (n_head * head_dim, n_embd),
        "attn_k": (n_head_kv * head_dim, n_embd),
        "attn_v": (n_head_kv * head_dim, n_embd),
        "attn_output": (n_embd, n_head * head_dim),
        "ffn_gate": (n_ff, n_embd),
        "ffn_up": (n_ff, n_embd),
        "ffn_down": (n_embd, n_ff),
    }
    for i in range(n_layer):
        t[f"blk.{i}.attn_norm.weight"] = ones
        t[f"blk.{i}.ffn_norm.weight"] = ones
        for kind, shape in shapes.items():
            name = f"blk.{i}.{kind}.weight"
            t[name] = _normal(seed, name, shape, layer_scale / np.sqrt(shape[1]))
    return t


def write_tiny_llama(
    path: str | os.PathLike[str],
    *,
    vocab: Vocab = "base",
    n_layer: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int | None = None,
    n_ff: int = 128,
    seed: int = 0,
    n_ctx_train: int = 512,
    eos_id: int = EOS_ID,
    chat_template: str | None = None,
    logit_std: float = 3.0,
    vocab_only: bool = False,
    relabelled: bool = False,
    endless: bool = False,
    layer_scale: float = 1.0,
    steady: float = 0.0,
    fim: bool = False,
) -> Path:
    """Write a tiny random llama GGUF (float32 weights) and return its path.

    Same seed and shapes give bit-identical weights; different seeds differ.
    `eos_id` lets pairs disagree on end-of-sequence (any id of the vocabulary).
    `chat_template` is stored as tokenizer.chat_template (Jinja, as in real GGUFs).
    `vocab_only` writes the tokenizer alone, no tensors (as llama.cpp's ggml-vocab-*.gguf files).
    `relabelled` (with vocab "different"): the embedding and output rows follow the permuted
    pieces, so the model is base's under other ids: a draft that only translation can pair.
    `layer_scale` scales the layers' projections: small, each row stays close to its token's
    embedding, so what follows a token depends mostly on that token (tinydrafters' agreeing EAGLE-3).
    `steady`: every token embedding holds this in column 0, which after the norm outweighs the
    rest: each row's distribution leans on the output head's column 0 alike, and the context moves
    it a little, so a drafter blind to the tokens before a row still guesses it (tinydrafters' DFlash).
    `endless`: the end-of-sequence row of the output head is zero, so its logit is 0 against the
    others' spread of several units: greedy decoding never ends a generation before -n.
    `fim`: the file names fill-in-the-middle tokens (FIM_IDS: byte tokens no test text holds).
    """
    tokens = vocab_tokens(vocab) if vocab != "gpt2" else [(text, 0.0, kind) for text, kind in gpt2_vocab()[0]]
    n_vocab = len(tokens)
    n_head_kv = n_head if n_head_kv is None else n_head_kv
    if n_embd % n_head or n_head % n_head_kv:
        raise ValueError("n_embd must divide by n_head, and n_head by n_head_kv")
    if not 0 <= eos_id < n_vocab:
        raise ValueError(f"eos_id {eos_id} outside vocabulary of {n_vocab}")

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA])
    w.add_name(f"tiny-llama-{vocab}-seed{seed}")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(n_embd // n_head)  # llama.cpp requires n_rot == head_dim
    w.add_rope_freq_base(10000.0)

    if vocab == "gpt2":
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt-2")
        w.add_token_merges(gpt2_vocab()[1])
        w.add_bos_token_id(0)
        w.add_eos_token_id(0)
        w.add_add_bos_token(False)
    else:
        w.add_tokenizer_model("llama")
        w.add_token_scores([score for _, score, _ in tokens])
        w.add_unk_token_id(UNK_ID)
        w.add_bos_token_id(BOS_ID)
        w.add_eos_token_id(eos_id)
        w.add_add_bos_token(True)
    w.add_token_list([text for text, _, _ in tokens])
    w.add_token_types([kind for _, _, kind in tokens])
    w.add_add_eos_token(False)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    if fim:
        for key, token in FIM_IDS.items():
            w.add_uint32(key, token)

    tensors = (
        {} if vocab_only else _tensors(seed, n_vocab, n_layer, n_embd, n_head, n_head_kv, n_ff, logit_std, layer_scale, steady)
    )
    if relabelled:
        if vocab != "different":
            raise ValueError("relabelled goes with vocab='different'")
        rows = np.concatenate([np.arange(len(_SPECIAL) + len(_BYTES)), len(_SPECIAL) + len(_BYTES) + _PERMUTATION])
        for name in ("token_embd.weight", "output.weight"):
            tensors[name] = tensors[name][rows]
    if endless:
        tensors["output.weight"][eos_id] = 0.0
    for name, array in tensors.items():
        w.add_tensor(name, array)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
