"""What an architecture means for drafting, from GGUF metadata: MTP (NextN) heads, a recurrent
state, whether llama.cpp rolls that state back, and how much memory it takes.

The sets and formulas are llama.cpp's, as vendored by llama-cpp-python 0.3.36:
`llm_arch_is_recurrent`, `llm_arch_is_hybrid` and `llm_arch_supports_rs_rollback` in
src/llama-arch.cpp, `n_embd_r()` and `n_embd_s()` in src/llama-hparams.cpp, and which layers keep
a state in each architecture's `load_arch_hparams` (src/models/). llama.cpp keeps 1 + n_rs_seq
copies of a sequence's recurrent state, in f32, and specrun sets n_rs_seq to the longest draft a
k grants (`core.policy.rollback_tokens`); tests/test_pair_hybrid.py checks the sizes against the
buffers llama.cpp allocates.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from specrun.hub.profiles import MTP_HEADS, MTP_SEPARATE, TRAINED_KINDS

RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
HYBRID_ARCHS = frozenset(
    {
        "jamba",
        "falcon-h1",
        "plamo2",
        "granitehybrid",
        "lfm2",
        "lfm2moe",
        "nemotron_h",
        "nemotron_h_moe",
        "qwen3next",
        "kimi-linear",
        "bailingmoe3",
        "kimi-k3",
        "glm5-next",
        "qwen35",
        "qwen35moe",
        "qwen4exp",
        "deepseek4",
        "minimax-01",
    }
)
ROLLBACK_ARCHS = frozenset(
    {
        "kimi-k3",
        "qwen35",
        "qwen35moe",
        "qwen4exp",
        "deepseek4",
        "glm5-next",
        "nemotron_h",
        "nemotron_h_moe",
        "lfm2",
        "lfm2moe",
        "bailingmoe3",
    }
)
# Architectures whose MTP drafter is a model of its own, and that drafter's architecture.
SEPARATE_DRAFTERS = {"gemma4": "gemma4-assistant"}
STATE_BYTES_PER_VALUE = 4  # llama.cpp allocates the recurrent state (its r and s tensors) in f32

# Traits.mtp, besides "" (none): a profile's own words, so that its traits and a header's compare.
HEADS, SEPARATE, DRAFTER = MTP_HEADS, MTP_SEPARATE, "drafter"
LAYER = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True)
class Traits:
    """What a model is for drafting, from its header or, without one, its profile."""

    # HEADS: MTP (NextN) layers in its own weights, which draft for it (--draft mtp); SEPARATE: its MTP
    # drafter is a model of its own; DRAFTER: it is such a drafter (a gemma4-assistant, or NextN layers
    # without the model), not a model to generate with; "": none.
    mtp: str
    mtp_layers: int | None  # NextN layers in the file; None when known from a profile
    recurrent: bool  # keeps a recurrent state (a recurrent or hybrid architecture)
    rolls_back: bool | None  # llama.cpp keeps snapshots of that state; None when no header says
    arch: str | None = None  # general.architecture; None when known from a profile
    trained: TrainedDrafter | None = None  # a drafter trained to read its target's features (EAGLE-3, DFlash)

    def notes(self) -> list[str]:
        """What this means for drafting, a line each; [] for a plain transformer."""
        found = []
        if self.mtp == HEADS and self.mtp_layers is None:
            found.append(
                "drafts for itself: --draft mtp (MTP heads, per its profile; a GGUF converted without "
                "them has none: its header's nextn_predict_layers says)"
            )
        elif self.mtp == HEADS:
            found.append(f"drafts for itself: --draft mtp ({plural(self.mtp_layers or 0, 'MTP (NextN) layer')})")
        elif self.mtp == SEPARATE:
            drafter = f" ({SEPARATE_DRAFTERS[self.arch]})" if self.arch in SEPARATE_DRAFTERS else ""
            found.append(
                f"its MTP drafter is a model of its own{drafter}, which specrun cannot run yet "
                "(llama.cpp's draft-mtp can); --draft mtp needs MTP layers in the target's own GGUF"
            )
        elif self.mtp == DRAFTER:
            found.append(
                "an MTP drafter without a model to draft for (a gemma4-assistant, or NextN layers alone), "
                "which specrun cannot run yet (llama.cpp's draft-mtp can)"
            )
        if self.trained:
            found.append(self.trained.note())
        if self.recurrent:
            found.append(self.recurrent_note())
        return found

    def recurrent_note(self) -> str:
        if self.rolls_back is None:
            return (
                "hybrid, per its profile: it keeps a recurrent state; whether llama.cpp rolls it back "
                "for drafts shows in its header"
            )
        if self.rolls_back:
            return "hybrid: it keeps a recurrent state, which llama.cpp rolls back for drafts"
        return (
            f"recurrent: llama.cpp cannot roll its state back ({self.arch}), so no draft can be verified: "
            "no speculation, plain decoding only"
        )

    @property
    def short(self) -> str:
        """A few words for a table cell; "" for a plain transformer."""
        words = {HEADS: "drafts itself (--draft mtp)", SEPARATE: "separate MTP drafter", DRAFTER: "an MTP drafter"}.get(
            self.mtp, ""
        )
        if self.recurrent:
            state = {True: "hybrid, rolls back", False: "recurrent, no speculation", None: "hybrid"}[self.rolls_back]
            words = f"{words}; {state}" if words else state
        return words

    def as_json(self) -> dict[str, Any]:
        return {"mtp": self.mtp or None, "mtp_layers": self.mtp_layers, "hybrid": self.recurrent, "rolls_back": self.rolls_back}

    @property
    def speculates(self) -> bool:
        """False where llama.cpp is known to be unable to verify a draft on it."""
        return not self.recurrent or self.rolls_back is not False


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def layer_split(meta: Mapping[str, Any]) -> tuple[int, int]:
    """(the model's own layers, the MTP layers after them): llama.cpp's n_layer() and n_layer_nextn."""
    key = _keys(meta, str(meta.get("general.architecture", "")))
    nextn = key("nextn_predict_layers")
    return max(key("block_count") - nextn, 0), nextn


def layer_index(tensor_name: str) -> int | None:
    """The layer a tensor belongs to ("blk.12.attn_q.weight" -> 12); None for the others."""
    match = LAYER.match(tensor_name)
    return int(match.group(1)) if match else None


def header_traits(meta: Mapping[str, Any], tensor_names: Iterable[str]) -> Traits:
    """A GGUF's traits from its metadata and tensor names."""
    arch = str(meta.get("general.architecture", ""))
    trunk, nextn = layer_split(meta)
    tensor_names = list(tensor_names)
    has_trunk = any((i := layer_index(name)) is not None and i < trunk for name in tensor_names)
    if arch in SEPARATE_DRAFTERS.values() or (nextn and not has_trunk):
        mtp = DRAFTER  # llama.cpp's own test for an MTP-only file: no layer of the model itself
    elif nextn:
        mtp = HEADS
    else:
        mtp = SEPARATE if arch in SEPARATE_DRAFTERS else ""
    recurrent = arch in RECURRENT_ARCHS or arch in HYBRID_ARCHS
    rolls_back = arch in ROLLBACK_ARCHS if recurrent else None
    return Traits(mtp, nextn, recurrent, rolls_back, arch, trained_drafter(meta, tensor_names))


def profile_traits(mtp: str, hybrid: bool) -> Traits:
    """A profile's traits: `mtp` is ModelProfile.mtp ("heads", "separate" or "")."""
    return Traits(mtp, None, hybrid, None)


def state_bytes(meta: Mapping[str, Any]) -> int | None:
    """One copy of one sequence's recurrent state: llama.cpp's n_embd_r() + n_embd_s() f32 values in
    each layer that keeps a state. 0 for a model without one; None for a recurrent architecture whose
    layout specrun does not know (it then says so rather than guess)."""
    layers = recurrent_layers(meta)
    if layers is None:
        return None
    arch = str(meta.get("general.architecture", ""))
    key = _keys(meta, arch)
    l_cache = key("shortconv.l_cache")
    if l_cache:  # LFM2's short convolutions: the last l_cache - 1 inputs, no state matrix (d_state is 0)
        per_layer = key("embedding_length") * (l_cache - 1)
    else:  # Mamba-2 and gated delta nets: the convolution's last d_conv - 1 inputs, and the state matrix
        d_inner, d_state = key("ssm.inner_size"), key("ssm.state_size")
        per_layer = max(key("ssm.conv_kernel") - 1, 0) * (d_inner + 2 * key("ssm.group_count") * d_state) + d_state * d_inner
    return len(layers) * per_layer * STATE_BYTES_PER_VALUE


def recurrent_layers(meta: Mapping[str, Any]) -> list[int] | None:
    """The model's layers that keep a recurrent state, by each architecture's own rule (the MTP
    layers after them never do): [] for an architecture without one, None for a recurrent one
    whose rule specrun does not know."""
    arch = str(meta.get("general.architecture", ""))
    if arch not in RECURRENT_ARCHS and arch not in HYBRID_ARCHS:
        return []
    trunk = range(layer_split(meta)[0])
    if arch in ("mamba", "mamba2"):
        return list(trunk)  # llama.cpp gives every layer of a recurrent architecture a state
    kv_heads = _per_layer(meta.get(f"{arch}.attention.head_count_kv", meta.get(f"{arch}.attention.head_count")), trunk)
    if arch in ("qwen35", "qwen35moe"):
        marked = meta.get(f"{arch}.attention.recurrent_layers")
        if marked is not None:
            flags = _per_layer(marked, trunk)
            return [i for i in trunk if flags[i]]
        interval = _int(meta.get(f"{arch}.full_attention_interval")) or 4  # llama.cpp's default when absent
        return [i for i in trunk if (i + 1) % interval != 0]
    if arch in ("lfm2", "lfm2moe"):
        return [i for i in trunk if kv_heads[i] == 0]
    if arch in ("nemotron_h", "nemotron_h_moe"):
        ff = _per_layer(meta.get(f"{arch}.feed_forward_length", 0), trunk)
        return [i for i in trunk if kv_heads[i] == 0 and ff[i] == 0]
    return None


def _keys(meta: Mapping[str, Any], arch: str):
    """An integer key of the architecture, 0 when absent."""
    return lambda suffix: _int(meta.get(f"{arch}.{suffix}"))


def _per_layer(value: Any, layers: range) -> list[int]:
    """A per-layer key as llama.cpp reads it: an array, or one value for every layer."""
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value] + [0] * max(0, len(layers) - len(value))
    return [_int(value)] * len(layers)


def _int(value: Any) -> int:
    return int(value) if value is not None and not isinstance(value, (list, tuple, str)) else 0


TRAINED_DRAFTERS = dict(zip(TRAINED_KINDS, ("EAGLE-3", "DFlash", "DSpark")))
"""The drafters trained to read their target's features, by the kind llama.cpp's speculative
types name them (draft-eagle3, draft-dflash, draft-dspark), and how people write them."""


@dataclass(frozen=True)
class TrainedDrafter:
    """A drafter trained to read its target's features, from its header."""

    kind: str  # a key of TRAINED_DRAFTERS
    target_layers: tuple[int, ...]  # the target layers whose inputs it reads
    target_width: int  # the target's hidden size it reads (0 where the file does not say)
    block_size: int | None = None  # DFlash's block: its last token and the mask tokens it drafts in one decode
    mask: int | None = None  # DFlash's mask token, which fills a block after its last token
    causal: bool = False  # a DFlash block attends causally (else both ways, as DFlash is trained)
    # DSpark's blocks start at the anchor (the last token), whose row drafts too: a block of k
    # tokens drafts k, not k - 1 (dflash.sample_from_anchor; SpecForge's exports set it false)
    anchored: bool = False
    selector: bool = False  # DFlash2: a selector reads candidates off its rows (dflash.selector_top_k)

    @property
    def name(self) -> str:
        return TRAINED_DRAFTERS[self.kind]

    def note(self) -> str:
        reads = f"reads the target's layers {', '.join(map(str, self.target_layers))}"
        if self.kind == "eagle3":
            return f"an EAGLE-3 drafter: {reads} ({self.target_width} wide); specrun drafts with it (--draft FILE)"
        return (
            f"a {self.name} drafter: {reads} ({self.target_width} wide), up to {self.most} tokens a block; "
            "specrun drafts with it (--draft FILE)"
        )

    @property
    def most(self) -> int:
        """The most tokens a block drafts: its size, less the last token's row unless anchored."""
        return (self.block_size or 0) - (not self.anchored)


def trained_drafter(meta: Mapping[str, Any], tensor_names: Iterable[str]) -> TrainedDrafter | None:
    """Which of TRAINED_DRAFTERS a GGUF is, or None for a model of its own: llama.cpp's
    `common_speculative_types_from_gguf` (a dflash file with a Markov head is DSpark), and the
    eagle3 architecture, which llama.cpp leaves to --spec-type."""
    arch = str(meta.get("general.architecture", ""))
    if arch not in TRAINED_DRAFTERS:
        return None
    kind = "dspark" if arch == "dflash" and "markov_w1.weight" in set(tensor_names) else arch
    layers = tuple(int(i) for i in meta.get(f"{arch}.target_layers") or ())
    if arch == "eagle3":
        return TrainedDrafter(kind, layers, _int(meta.get(f"{arch}.target_hidden_size")))
    # DFlash's fc reads each layer as wide as the drafter itself (n_embd_inp_enc); 16: llama.cpp's default block
    mask = meta.get("tokenizer.ggml.mask_token_id")
    return TrainedDrafter(
        kind,
        layers,
        _int(meta.get(f"{arch}.embedding_length")),
        _int(meta.get(f"{arch}.block_size")) or 16,
        None if mask is None else _int(mask),
        bool(meta.get(f"{arch}.attention.causal", False)),
        kind == "dspark" and bool(meta.get(f"{arch}.sample_from_anchor", True)),
        _int(meta.get(f"{arch}.selector_top_k")) > 0,
    )


def drafter_misfit(drafter: TrainedDrafter, n_vocab: int, target_layers: int, target_width: int, target_vocab: int) -> str | None:
    """Why a trained drafter cannot read a target of these sizes (None: it can), as llama.cpp
    would find out at its first decode: its layers (EAGLE-3's 3), their width, one vocabulary."""
    layers = drafter.target_layers
    if drafter.kind == "eagle3" and len(layers) != 3:
        return f"it reads {len(layers)} target layers, not EAGLE-3's 3"
    if not layers:
        return "it names no target layers to read"
    if max(layers) == target_layers:  # llama.cpp hands over the last layer's output as the NextN rows
        return (
            f"it reads the output of the target's last layer ({target_layers}), which specrun does not hand "
            f"a drafter yet (llama.cpp's draft-{drafter.kind} does)"
        )
    if max(layers) > target_layers:
        return f"it reads layers {', '.join(map(str, layers))}, but the target has {target_layers}"
    if drafter.target_width != target_width:
        return f"it reads rows {drafter.target_width} wide, the target's are {target_width}"
    if n_vocab != target_vocab:
        return f"its vocabulary has {n_vocab} tokens, the target's {target_vocab}"
    if drafter.selector:
        return "it is a DFlash2 drafter, whose selector specrun does not read yet (llama.cpp's draft-dflash does)"
    if drafter.block_size is not None and drafter.mask is None:
        return "it names no mask token (tokenizer.ggml.mask_token_id) to fill its blocks with"
    return None
