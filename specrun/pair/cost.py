"""A stated cost model for a draft/target pair, from GGUF tensor sizes alone.

Decoding one token is memory-bound: its cost is roughly the bytes of weights read. That
is every layer tensor plus the output head; embedding tables are read one row per
token, nearly free. When a model ties its head to token_embd (Gemma does), the head
costs the table's full size. Speed-up follows Leviathan et al. 2023 (Theorem 3.8):
    S(alpha, k, c) = (1 - alpha^(k+1)) / ((1 - alpha) * (k*c + 1))
with alpha the per-token acceptance rate, k the draft length, c the draft/target cost
ratio, assuming a (k+1)-token verify costs one target step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from specrun.headers.arch import RECURRENT_ARCHS, layer_index, layer_split, recurrent_layers
from specrun.headers.read import LOOKUP_TENSORS, ModelFacts, TensorInfo

MAX_K = 16
# Tensors of an MTP (NextN) layer: its own token embedding (looked up) and its own output head.
NEXTN_EMBEDDING, NEXTN_HEAD = "nextn.embed_tokens.weight", "nextn.shared_head_head.weight"
KV_BYTES_PER_VALUE = 2  # llama.cpp's default KV cache type is f16
MODEL_ASSUMPTIONS = (
    "per-token cost = bytes of layer tensors + output head (embedding rows are free); "
    "speed-up = (1 - a^(k+1)) / ((1 - a)(k*c + 1)) (Leviathan et al. 2023), which assumes "
    "verifying k+1 tokens costs one target step: true when memory-bound (GPU), "
    "optimistic on CPUs, where the verify batch grows with k"
)


@dataclass(frozen=True)
class DecodeCost:
    layer_bytes: int  # everything read in full per token except the head
    head_bytes: int
    head_tied: bool  # head shares token_embd, so the full table is read per token
    head_shape: tuple[int, ...]

    @property
    def per_token_bytes(self) -> int:
        return self.layer_bytes + self.head_bytes

    @property
    def head_share(self) -> float:
        return self.head_bytes / self.per_token_bytes if self.per_token_bytes else 0.0


def decode_cost(model: ModelFacts) -> DecodeCost:
    """What a decode of the model reads per token; its MTP layers, which only drafting runs, left out."""
    return _cost(model, [t for t in model.tensors if not _in_mtp_layer(model, t.name)], "output.weight")


def mtp_cost(model: ModelFacts) -> DecodeCost:
    """What one draft token of the model's MTP (NextN) layers reads: those layers, and the output
    head they share with the model unless they bring their own."""
    mtp = [
        t for t in model.tensors if _in_mtp_layer(model, t.name) and not t.name.endswith(NEXTN_EMBEDDING)
    ]  # its own token embedding: rows looked up
    own_head = next((t.name for t in mtp if t.name.endswith(NEXTN_HEAD)), None)
    return _cost(model, mtp, own_head or "output.weight")


def _in_mtp_layer(model: ModelFacts, tensor_name: str) -> bool:
    trunk, nextn = layer_split(model.meta)
    layer = layer_index(tensor_name)
    return bool(nextn) and layer is not None and layer >= trunk


def _cost(model: ModelFacts, tensors: list[TensorInfo], head_name: str) -> DecodeCost:
    by_name = {t.name: t for t in model.tensors}
    head = by_name.get(head_name)
    tied = head is None
    if tied:
        head = by_name.get("token_embd.weight")
    layer_bytes = 0.0
    expert_fraction = _active_expert_fraction(model)
    for t in tensors:
        if t.name in LOOKUP_TENSORS or t.name == head_name:
            continue
        # Mixture-of-experts tensors: only the routed experts' rows are read.
        layer_bytes += t.n_bytes * (expert_fraction if "_exps." in t.name else 1.0)
    return DecodeCost(
        layer_bytes=int(layer_bytes),
        head_bytes=head.n_bytes if head else 0,
        head_tied=tied and head is not None,
        head_shape=head.shape if head else (),
    )


def _active_expert_fraction(model: ModelFacts) -> float:
    n_expert = int(model.key("expert_count", 0) or 0)
    n_used = int(model.key("expert_used_count", 0) or 0)
    return n_used / n_expert if n_expert and n_used else 1.0


def cost_ratio(target: ModelFacts, draft: ModelFacts) -> float:
    return decode_cost(draft).per_token_bytes / decode_cost(target).per_token_bytes


def kv_cache_bytes(meta: Mapping[str, Any], n_ctx: int, mtp: bool = False) -> int | None:
    """f16 K and V for n_ctx tokens in each layer that attends: the model's own layers, as its context
    keeps them (not those with a recurrent state instead, not its MTP layers), or with `mtp` its MTP
    layers, which an MTP head's context keeps. `meta`: the GGUF's metadata (`ModelFacts.meta`, or
    `read_keys`' for a quick look). None when it lacks the attention shape."""
    arch = str(meta.get("general.architecture", "unknown"))
    if arch in RECURRENT_ARCHS:
        return 0  # no layer attends: llama.cpp gives it a recurrent memory alone

    def key(suffix: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{suffix}", default)

    n_layers, n_embd, n_head = int(key("block_count", 0)), key("embedding_length"), key("attention.head_count")
    if not n_layers or not n_embd or not n_head:
        return None
    heads = _per_layer(key("attention.head_count_kv", n_head), n_layers)
    head_dim = int(_scalar(n_embd)) // int(_scalar(n_head))
    k_len = int(key("attention.key_length", head_dim))
    v_len = int(key("attention.value_length", head_dim))
    trunk = layer_split(meta)[0]
    recurrent = set(recurrent_layers(meta) or ())
    layers = range(trunk, n_layers) if mtp else [i for i in range(trunk) if i not in recurrent]
    return sum(heads[i] * (k_len + v_len) for i in layers) * n_ctx * KV_BYTES_PER_VALUE


def _per_layer(value: int | list[int], n_layers: int) -> list[int]:
    values = [int(v) for v in value] if isinstance(value, list) else [int(value)] * n_layers
    return values + [0] * (n_layers - len(values))


def _scalar(value: int | list[int]) -> int:
    return max(value) if isinstance(value, list) else value


def expected_speedup(alpha: float, k: int, c: float) -> float:
    """Leviathan et al. 2023, Theorem 3.8: expected walltime improvement."""
    if alpha >= 1.0:
        return (k + 1) / (k * c + 1)
    return (1 - alpha ** (k + 1)) / ((1 - alpha) * (k * c + 1))


def best_k(alpha: float, c: float, max_k: int = MAX_K) -> tuple[int, float]:
    """The draft length with the highest predicted speed-up, and that speed-up."""
    return max(((k, expected_speedup(alpha, k, c)) for k in range(1, max_k + 1)), key=lambda pair: pair[1])


def verdict(c: float, alpha: float) -> str:
    """Plain words for what the cost ratio allows at this acceptance rate."""
    lead = f"draft costs {c:.0%} of the target per token"
    if c >= 1:
        return f"{lead}: no speed-up possible"
    k, speedup = best_k(alpha, c)
    at = f"{alpha:.0%} acceptance"
    if speedup < 1:
        ceiling_k, ceiling = best_k(1.0, c)
        return (
            f"{lead}: slower than the target alone at {at}; even if every draft token "
            f"were accepted, at most {ceiling:.2f}x (k={ceiling_k})"
        )
    if speedup < 1.1:
        return f"{lead}: no useful speed-up possible (at most {speedup:.2f}x at {at}, k={k})"
    if speedup < 1.5:
        return f"{lead}: modest speed-up, {speedup:.2f}x predicted at {at}, k={k}"
    return f"{lead}: good pair, {speedup:.2f}x predicted at {at}, k={k}"
