"""`pair derive`: a self-speculative draft made of a subset of the target's layers.

Tensor bytes are copied as they are (any quant); the embedding, output norm and head
are kept, `blk.N` tensors are renumbered, and per-layer metadata is cut to the kept
layers. The result is written to a temporary file, loaded by llama.cpp as a check,
and only then renamed into place.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf import GGUFReader, GGUFValueType, GGUFWriter

from specrun.backend import Model, ModelOptions
from specrun.errors import SpecrunError
from specrun.files import atomic_path
from specrun.headers.read import ModelFacts, open_reader, read_local

BLOCK_TENSOR = re.compile(r"blk\.(\d+)\.(.+)")
# Sliding-window layouts llama.cpp applies when a file has no per-layer pattern array:
# arch -> (n_pattern, dense_first), from each architecture's load_hparams.
SWA_DEFAULT_PATTERNS = {"gemma3": (6, False)}
DERIVED_FROM_KEY = "specrun.derived.from"
DERIVED_LAYERS_KEY = "specrun.derived.layers"


@dataclass(frozen=True)
class DerivedDraft:
    path: Path
    layers: tuple[int, ...]
    n_target_layers: int


def parse_layers(spec: str, n_layers: int) -> list[int]:
    """'0-5', '0,2,4-7' -> sorted layer ids, each checked against the target's count."""
    layers: set[int] = set()
    for part in spec.replace(" ", "").split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not match:
            raise SpecrunError(f"--layers {spec!r}: use ids and ranges like 0-5 or 0,2,4-7")
        first, last = int(match.group(1)), int(match.group(2) or match.group(1))
        if first > last:
            raise SpecrunError(f"--layers {spec!r}: range {part} runs backwards")
        layers.update(range(first, last + 1))
    outside = sorted(i for i in layers if i >= n_layers)
    if outside:
        raise SpecrunError(f"--layers {spec!r}: the target has layers 0-{n_layers - 1}, not {outside[0]}")
    if len(layers) == n_layers:
        raise SpecrunError(f"--layers {spec!r} keeps all {n_layers} layers: that is the target")
    return sorted(layers)


def check_derivable(target: ModelFacts) -> None:
    """A draft is cut from the layers of a model llama.cpp can load: say so when this is not one."""
    if "general.architecture" not in target.meta:
        raise SpecrunError(
            f"{target.source} has no general.architecture in its header: "
            "not a model llama.cpp can load, so no draft can be cut from it"
        )
    if target.n_layers < 2:
        raise SpecrunError(
            f"{target.source} has {target.n_layers} layers ({target.arch}.block_count): "
            "a derived draft needs a target with 2 or more"
        )


def derive_draft(target: Path, layers: list[int], out: Path, verify: bool = True) -> DerivedDraft:
    facts = read_local(target)
    check_derivable(facts)
    arch, n_layers = facts.arch, facts.n_layers
    reader = open_reader(target)
    with atomic_path(out, "--output") as partial:
        write_subset(reader, arch, n_layers, layers, target.name, partial)
        if verify:
            check_loads(partial, out)
    return DerivedDraft(out, tuple(layers), n_layers)


def write_subset(reader: GGUFReader, arch: str, n_layers: int, layers: list[int], source_name: str, out: Path) -> None:
    writer = GGUFWriter(out, arch)
    for name, (value, vtype, sub_type) in subset_metadata(reader, arch, n_layers, layers).items():
        writer.add_key_value(name, value, vtype, sub_type=sub_type)
    writer.add_string(DERIVED_FROM_KEY, source_name)
    writer.add_array(DERIVED_LAYERS_KEY, layers)
    renamed = {old: new for new, old in enumerate(layers)}
    kept = []
    for tensor in reader.tensors:
        new_name = renamed_tensor(tensor.name, renamed)
        if new_name is not None:
            kept.append(tensor)
            writer.add_tensor_info(new_name, tensor.data.shape, tensor.data.dtype, tensor.data.nbytes, tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in kept:
        writer.write_tensor_data(tensor.data, tensor_endianess=reader.endianess)
    writer.close()


def renamed_tensor(name: str, renamed: dict[int, int]) -> str | None:
    """blk.<old>.x -> blk.<new>.x for kept layers; None for dropped ones; others as is."""
    match = BLOCK_TENSOR.fullmatch(name)
    if match is None:
        return name
    new = renamed.get(int(match.group(1)))
    return None if new is None else f"blk.{new}.{match.group(2)}"


MetaValue = tuple[Any, GGUFValueType, "GGUFValueType | None"]


def subset_metadata(reader: GGUFReader, arch: str, n_layers: int, layers: list[int]) -> dict[str, MetaValue]:
    """Every key of the target, with block_count and per-layer arrays cut to `layers`."""
    meta: dict[str, MetaValue] = {}
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        value = field.contents()
        if field.name == f"{arch}.block_count":
            value = len(layers)
        elif field.name.startswith(f"{arch}.") and _is_per_layer(value, n_layers):
            value = [value[i] for i in layers]
        meta[field.name] = (value, vtype, sub_type)
    name = meta.get("general.name", (arch, GGUFValueType.STRING, None))[0]
    meta["general.name"] = (f"{name} (layers {describe_layers(layers)})", GGUFValueType.STRING, None)
    swa = swa_pattern(meta, arch, n_layers)
    if swa is not None:
        key = f"{arch}.attention.sliding_window_pattern"
        meta[key] = ([swa[i] for i in layers], GGUFValueType.ARRAY, GGUFValueType.BOOL)
    return meta


def _is_per_layer(value: Any, n_layers: int) -> bool:
    return isinstance(value, list) and len(value) == n_layers and n_layers > 1


def swa_pattern(meta: dict[str, MetaValue], arch: str, n_layers: int) -> list[bool] | None:
    """Which target layers use sliding-window attention, when the file leaves it implicit.

    llama.cpp derives the layout from the layer index (Gemma 3: every 6th layer is
    global), so renumbered layers would change kind; an explicit array keeps each as it was.
    """
    if f"{arch}.attention.sliding_window" not in meta:
        return None
    explicit = meta.get(f"{arch}.attention.sliding_window_pattern")
    if explicit is not None and isinstance(explicit[0], list):
        return None  # already per layer, cut by subset_metadata
    if arch not in SWA_DEFAULT_PATTERNS:
        raise SpecrunError(
            f"{arch} uses sliding-window attention with a layout specrun does "
            "not know, so a layer subset would change which layers use it"
        )
    n_pattern, dense_first = SWA_DEFAULT_PATTERNS[arch]
    if explicit is not None:
        n_pattern = int(explicit[0])
    if dense_first:  # llama_hparams::set_swa_pattern
        return [n_pattern == 0 or i % n_pattern != 0 for i in range(n_layers)]
    return [n_pattern == 0 or i % n_pattern < n_pattern - 1 for i in range(n_layers)]


def describe_layers(layers: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    runs: list[list[int]] = []
    for layer in layers:
        if runs and layer == runs[-1][-1] + 1:
            runs[-1].append(layer)
        else:
            runs.append([layer])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def check_loads(path: Path, shown_as: Path) -> None:
    """llama.cpp must load the draft, or nothing is left behind."""
    try:
        Model(path, ModelOptions(n_gpu_layers=0), role="derived draft").close()
    except SpecrunError:
        raise SpecrunError(
            f"llama.cpp cannot load the derived draft {shown_as}; nothing was written (SPECRUN_DEBUG=1 shows llama.cpp's log)"
        ) from None
