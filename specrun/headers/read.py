"""What `pair` needs from a GGUF header: vocabulary facts, metadata and tensor sizes.

Parsing stays in the gguf package (GGUFReader); this module turns its fields into
plain facts and applies llama.cpp's defaults for keys a file leaves out.
"""

from __future__ import annotations

import functools
import inspect
import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType

from specrun.backend.compat import VocabFacts
from specrun.errors import SpecrunError

NO_TOKEN = -1

# tokenizer.ggml.model -> llama.cpp vocab type (llama-vocab.cpp, load()).
VOCAB_TYPES = {
    "llama": "spm",
    "gpt2": "bpe",
    "hybriddna": "bpe",
    "whitespace": "bpe",
    "gemma4": "bpe",
    "bert": "wpm",
    "t5": "ugm",
    "rwkv": "rwkv",
    "plamo2": "plamo2",
    "none": "none",
    "no_vocab": "none",
}

# Default bos/eos ids per tokenizer model when the keys are missing (llama-vocab.cpp).
DEFAULT_SPECIAL_IDS = {
    "llama": (1, 2),
    "bert": (101, NO_TOKEN),
    "gpt2": (11, 11),
    "hybriddna": (11, 11),
    "whitespace": (11, 11),
    "t5": (NO_TOKEN, 1),
    "rwkv": (NO_TOKEN, NO_TOKEN),
    "plamo2": (1, 2),
    "gemma4": (NO_TOKEN, NO_TOKEN),
}

# Default add_bos/add_eos per vocab type; BPE defaults depend on the pre-tokenizer.
DEFAULT_ADD_FLAGS = {"spm": (True, False), "wpm": (True, False), "ugm": (False, True)}
BPE_PRE_ADDING_BOS = {
    "llama3",
    "llama-v3",
    "llama-bpe",
    "falcon3",
    "falcon-h1",
    "pixtral",
    "midm-2.0",
    "lfm2",
    "jina-v5-nano",
    "tekken",
    "chameleon",
}
# Pre-tokenizers for which llama.cpp forces add_bos after reading the keys (its PR 21500).
BPE_PRE_FORCING_BOS = {"gemma4", "granite-embed-multi-311m"}
BPE_PRE_WITHOUT_BOS = {"chatglm-bpe", "glm4", "glm5"}

# Tensors read one row per token (a lookup), not multiplied in full.
LOOKUP_TENSORS = ("token_embd.weight", "position_embd.weight", "token_types.weight", "per_layer_token_embd.weight")


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: str  # e.g. "Q4_K"
    shape: tuple[int, ...]  # GGUF order: fastest-moving dimension first
    n_elements: int
    n_bytes: int


@dataclass(frozen=True)
class ModelFacts:
    source: str  # path or hub spec, for messages
    file_size: int
    arch: str
    meta: dict[str, Any]  # scalar and short-array metadata (no token lists)
    vocab: VocabFacts
    tensors: tuple[TensorInfo, ...] = field(repr=False)

    def key(self, suffix: str, default: Any = None) -> Any:
        """An architecture key such as `block_count` -> meta['gemma3.block_count']."""
        return self.meta.get(f"{self.arch}.{suffix}", default)

    @property
    def n_params(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    @property
    def n_layers(self) -> int:
        return int(self.key("block_count", 0))

    @property
    def family(self) -> str:
        """general.basename when present (e.g. 'gemma-3'), else the architecture."""
        return str(self.meta.get("general.basename") or self.arch)

    @property
    def base_models(self) -> tuple[str, ...]:
        """general.base_model.N.* of fine-tunes, as 'org/name' or name."""
        count = int(self.meta.get("general.base_model.count", 0))
        names = []
        for i in range(count):
            repo = self.meta.get(f"general.base_model.{i}.repo_url", "")
            name = self.meta.get(f"general.base_model.{i}.name", "")
            org = self.meta.get(f"general.base_model.{i}.organization", "")
            if repo.startswith("https://huggingface.co/"):
                names.append(repo.removeprefix("https://huggingface.co/"))
            else:
                names.append(f"{org}/{name}" if org else name)
        return tuple(n for n in names if n)


def _field_parsing_is_known() -> bool:
    """Whether GGUFReader still parses fields through the private method PlainArrayReader
    overrides, with the signature it was written against (gguf 0.10 to 0.19). If not, the
    stock reader's own parsing is used: slower, never wrong. tests/test_pinned_apis.py
    asserts this holds, so a gguf release that changes it fails there first."""
    try:
        params = list(inspect.signature(GGUFReader._get_field_parts).parameters)
    except (AttributeError, TypeError, ValueError):
        return False
    return params == ["self", "orig_offs", "raw_type"] and hasattr(GGUFReader, "_get")


FAST_FIELD_PARSING = _field_parsing_is_known()


class PlainArrayReader(GGUFReader):
    """GGUFReader with two speed-ups for 100k+-token vocabularies (11 s -> 1.5 s on Gemma 3).

    - It slices a plain ndarray view of its memmap: memmap bookkeeping on each of the
      million slices it takes was most of the time.
    - Arrays of scalars and strings are read in one pass instead of one recursive call
      per element. The fields are the same as the stock reader's, part for part; a test
      compares them, so a gguf release that changes the layout fails loudly.
    """

    @property  # type: ignore[override]
    def data(self) -> np.ndarray:
        return self._plain

    @data.setter
    def data(self, value: np.ndarray) -> None:
        self._plain = np.asarray(value)

    def _get_field_parts(self, orig_offs: int, raw_type: int) -> tuple[int, list, list, list]:
        if not FAST_FIELD_PARSING or GGUFValueType(raw_type) != GGUFValueType.ARRAY or self.byte_order != "I":
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype = self._get(orig_offs, np.uint32)
        alen = self._get(orig_offs + 4, np.uint64)
        itype, count, offs = GGUFValueType(raw_itype[0]), int(alen[0]), orig_offs + 12
        types = [GGUFValueType.ARRAY] + ([itype] if count else [])
        parts: list[np.ndarray] = [raw_itype, alen]
        nptype = self.gguf_scalar_to_np.get(itype)
        if nptype is not None:
            values = self._get(offs, nptype, count)
            parts += list(values.reshape(-1, 1))  # one 1-element view per value, as stock
            return 12 + int(values.nbytes), parts, list(range(2, 2 + count)), types
        if itype != GGUFValueType.STRING:
            return super()._get_field_parts(orig_offs, raw_type)
        buffer, indexes = self.data.data, []  # the array's memoryview, without a copy
        for _ in range(count):
            (length,) = struct.unpack_from("<Q", buffer, offs)
            parts += [self.data[offs : offs + 8].view(np.uint64), self.data[offs + 8 : offs + 8 + length]]
            indexes.append(len(parts) - 1)
            offs += 8 + length
        return offs - orig_offs, parts, indexes, types


def open_reader(path: str | os.PathLike[str]) -> GGUFReader:
    try:
        return PlainArrayReader(path)
    except (ValueError, KeyError, IndexError, struct.error) as exc:  # a cut or damaged header
        raise SpecrunError(f"{path}: not a readable GGUF file, cut short or damaged ({exc or type(exc).__name__})") from None
    except OSError as exc:
        raise SpecrunError(f"cannot read {path}: {exc.strerror}") from None


# GGUF value types (gguf.GGUFValueType) as struct formats; 8 is a string, 9 an array.
SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
GGUF_STRING, GGUF_ARRAY = 8, 9


@dataclass(frozen=True)
class HeaderKeys:
    """A GGUF's metadata (scalars and short arrays) and tensor names: no vocabulary, no shapes."""

    meta: dict[str, Any]
    tensor_names: tuple[str, ...]


def read_keys(path: str | os.PathLike[str], max_array: int = 4096) -> HeaderKeys:
    """The metadata and tensor names of a local GGUF, read in one pass that steps over token lists
    instead of parsing them: fast enough for every model `specrun models` lists (GGUFReader takes
    seconds on a 262k-token vocabulary)."""
    try:
        # struct reads the map in place and slices copy out of it: no view outlives the map
        with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _walk_header(data, max_array)
    except (ValueError, IndexError, struct.error, UnicodeDecodeError) as exc:  # cut short, damaged, empty
        raise SpecrunError(f"{path}: not a readable GGUF file, cut short or damaged ({exc or type(exc).__name__})") from None
    except OSError as exc:
        raise SpecrunError(f"cannot read {path}: {exc.strerror}") from None


def _walk_header(data: mmap.mmap, max_array: int) -> HeaderKeys:
    magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", data, 0)
    if magic != b"GGUF" or not 2 <= version <= 3:  # llama.cpp reads versions 2 and 3, little-endian here
        raise ValueError(f"GGUF magic or version {version} not readable")
    meta: dict[str, Any] = {}
    offset = 24
    for _ in range(n_kv):
        key, offset = _string(data, offset)
        (kind,), offset = struct.unpack_from("<I", data, offset), offset + 4
        value, offset = _value(data, offset, kind, max_array)
        if value is not _SKIPPED:
            meta[key] = value
    names = []
    for _ in range(n_tensors):
        name, offset = _string(data, offset)
        (n_dims,) = struct.unpack_from("<I", data, offset)
        offset += 4 + 8 * n_dims + 4 + 8  # the dimensions, the type and the data offset
        names.append(name)
    return HeaderKeys(meta, tuple(names))


_SKIPPED = object()  # an array longer than max_array: stepped over, not kept


def _string(data: mmap.mmap, offset: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", data, offset)
    end = offset + 8 + length
    if end > len(data):
        raise ValueError("a string runs past the end of the file")
    return data[offset + 8 : end].decode("utf-8", "replace"), end


def _value(data: mmap.mmap, offset: int, kind: int, max_array: int) -> tuple[Any, int]:
    if kind in SCALAR_FORMATS:
        fmt = "<" + SCALAR_FORMATS[kind]
        return struct.unpack_from(fmt, data, offset)[0], offset + struct.calcsize(fmt)
    if kind == GGUF_STRING:
        return _string(data, offset)
    if kind != GGUF_ARRAY:
        raise ValueError(f"unknown GGUF value type {kind}")
    item, count = struct.unpack_from("<IQ", data, offset)
    offset += 12
    if item in SCALAR_FORMATS:
        fmt = "<" + SCALAR_FORMATS[item]
        size = struct.calcsize(fmt)
        if count > max_array:
            return _SKIPPED, offset + count * size
        return list(struct.unpack_from(f"<{count}{SCALAR_FORMATS[item]}", data, offset)), offset + count * size
    values = []
    for _ in range(count):  # strings (a token list: only their lengths are read when skipped) or arrays
        if item == GGUF_STRING and count > max_array:
            offset += 8 + struct.unpack_from("<Q", data, offset)[0]
        else:
            value, offset = _value(data, offset, item, max_array)
            values.append(value)
    if offset > len(data):
        raise ValueError("an array runs past the end of the file")
    return (_SKIPPED if count > max_array else values), offset


def read_local(path: str | os.PathLike[str]) -> ModelFacts:
    """Facts from a local GGUF, cached per (path, size, mtime) within a process."""
    path = Path(path)
    if not path.is_file():
        raise SpecrunError(f"{path}: no such file")
    stat = path.stat()
    return _read_local_cached(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _read_local_cached(path: str, size: int, _mtime_ns: int) -> ModelFacts:
    return facts_from_reader(open_reader(path), source=path, file_size=size)


def facts_from_reader(reader: GGUFReader, source: str, file_size: int) -> ModelFacts:
    meta = read_metadata(reader)
    arch = str(meta.get("general.architecture", "unknown"))
    tensors = tuple(
        TensorInfo(t.name, t.tensor_type.name, tuple(int(d) for d in t.shape), int(t.n_elements), int(t.n_bytes))
        for t in reader.tensors
    )
    vocab = vocab_facts(reader, meta, arch)
    return ModelFacts(source, file_size, arch, meta, vocab, tensors)


def read_metadata(reader: GGUFReader, max_array: int = 4096) -> dict[str, Any]:
    """Scalars and short arrays (per-layer values); token-sized arrays are skipped."""
    meta: dict[str, Any] = {}
    for name, fld in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        is_array = fld.types[0] == GGUFValueType.ARRAY
        if is_array and len(fld.data) > max_array:
            continue
        meta[name] = fld.contents()
    return meta


def token_texts(reader: GGUFReader) -> list[str]:
    fld = reader.fields.get("tokenizer.ggml.tokens")
    if fld is None:
        return []
    # surrogateescape keeps invalid UTF-8 byte-exact, as llama.cpp compares raw bytes.
    return [bytes(fld.parts[i]).decode("utf-8", "surrogateescape") for i in fld.data]


def vocab_facts(reader: GGUFReader, meta: dict[str, Any], arch: str) -> VocabFacts:
    """llama.cpp's view of the vocabulary, including its defaults for missing keys."""
    model = str(meta.get("tokenizer.ggml.model", "none"))
    if model not in VOCAB_TYPES:
        raise SpecrunError(f"unknown tokenizer model {model!r}: llama.cpp cannot load this file")
    vocab_type = VOCAB_TYPES[model]
    tokens = token_texts(reader)
    n_tokens = len(tokens) if vocab_type != "none" else int(meta.get(f"{arch}.vocab_size", 0))
    pre = str(meta.get("tokenizer.ggml.pre", ""))
    bos, eos = _special_ids(model, pre, meta, n_tokens)
    add_bos, add_eos = _add_flags(model, vocab_type, pre, meta)
    return VocabFacts(vocab_type, n_tokens, bos, eos, add_bos, add_eos, tokens)


def _special_ids(model: str, pre: str, meta: dict[str, Any], n_tokens: int) -> tuple[int, int]:
    bos, eos = DEFAULT_SPECIAL_IDS.get(model, (NO_TOKEN, NO_TOKEN))
    if model in ("gpt2", "hybriddna", "whitespace") and pre in BPE_PRE_WITHOUT_BOS:
        bos = NO_TOKEN
    ids = []
    for default, key in ((bos, "bos"), (eos, "eos")):
        if default >= n_tokens:  # llama.cpp disables defaults outside the vocabulary
            default = NO_TOKEN
        value = meta.get(f"tokenizer.ggml.{key}_token_id")
        # An id outside the vocabulary is ignored by llama.cpp (it keeps the default).
        ids.append(int(value) if value is not None and int(value) < n_tokens else default)
    return ids[0], ids[1]


def _add_flags(model: str, vocab_type: str, pre: str, meta: dict[str, Any]) -> tuple[bool, bool]:
    if model == "gemma4":
        pre = "gemma4"  # llama.cpp overrides the pre-tokenizer of this tokenizer model
    if vocab_type == "bpe":
        add_bos, add_eos = pre in BPE_PRE_ADDING_BOS, False
    else:
        add_bos, add_eos = DEFAULT_ADD_FLAGS.get(vocab_type, (False, False))
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", add_bos))
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", add_eos))
    if vocab_type == "bpe" and pre in BPE_PRE_FORCING_BOS:
        add_bos = True
    return add_bos, add_eos
