"""GGUF file names: which quant a file holds, and split sets (-00001-of-0000N)."""

from __future__ import annotations

import re
from dataclasses import dataclass

# llama.cpp quant labels as they appear in file names (upper or lower case).
_QUANT = (
    r"IQ[1-4]_(?:XXS|XS|NL|S|M)"
    r"|TQ[12]_0"
    r"|Q[2-8]_K(?:_(?:XXL|XL|L|M|S))?"
    r"|Q[4-8]_[01]"
    r"|MXFP4|BF16|FP16|F16|F32"
)
QUANT_RE = re.compile(rf"(?<![A-Za-z0-9])({_QUANT})(?![A-Za-z0-9])", re.IGNORECASE)
QUANT_ONLY_RE = re.compile(rf"(?:{_QUANT})", re.IGNORECASE)
SPLIT_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)

# Never chosen automatically: twice the memory of F16/BF16 for no quality gain in practice.
NEVER_AUTO = frozenset({"F32"})
# A draft must be fast more than exact: 16-bit weights double its cost for little acceptance gain.
NEVER_AUTO_FOR_DRAFT = NEVER_AUTO | {"F16", "BF16"}


@dataclass(frozen=True)
class RepoFile:
    """One file of a repository: its path in the repo, size, and LFS sha256 when known."""

    path: str
    size: int
    sha256: str | None = None


@dataclass(frozen=True)
class QuantChoice:
    """One quant of a model: a single GGUF or a whole split set, first part first."""

    quant: str
    parts: tuple[RepoFile, ...]

    @property
    def size(self) -> int:
        return sum(part.size for part in self.parts)

    @property
    def first(self) -> RepoFile:
        return self.parts[0]


def normalize_quant(text: str) -> str:
    """Upper-case quant label; refuses anything that is not a llama.cpp quant name."""
    label = text.strip().upper()
    if not QUANT_ONLY_RE.fullmatch(label):
        raise ValueError(label)
    return "F16" if label == "FP16" else label


def quant_of(filename: str) -> str | None:
    """The quant a GGUF file name carries, e.g. 'Q4_K_M'; None when it names none."""
    found = QUANT_RE.findall(filename.rsplit("/", 1)[-1])
    return normalize_quant(found[-1]) if found else None


def split_index(filename: str) -> tuple[int, int] | None:
    """(part, count) for 'x-00002-of-00003.gguf'; None for a single-file GGUF."""
    match = SPLIT_RE.search(filename)
    return (int(match.group(1)), int(match.group(2))) if match else None


def pattern_regex(file_pattern: str | None) -> re.Pattern[str]:
    """Regex for a profile's file pattern ('Model-{quant}.gguf'); any GGUF when None.

    Large quants are often split and kept in a subfolder named after the stem, so an
    optional folder and an optional -0000i-of-0000N suffix are allowed.
    """
    if file_pattern is None:
        body = r"[^/]*\.gguf"
    else:
        head, _, tail = file_pattern.partition("{quant}")
        stem_tail = tail[: -len(".gguf")] if tail.lower().endswith(".gguf") else tail
        body = rf"{re.escape(head)}(?:{_QUANT}){re.escape(stem_tail)}" + r"(?:-\d{5}-of-\d{5})?\.gguf"
    return re.compile(rf"(?:[^/]+/)?{body}", re.IGNORECASE)


def is_model_gguf(path: str) -> bool:
    """GGUF weights, not a vision projector or an importance matrix."""
    name = path.rsplit("/", 1)[-1].lower()
    return name.endswith(".gguf") and "mmproj" not in name and "imatrix" not in name


def gguf_sets(files: list[RepoFile], file_pattern: str | None = None) -> dict[str, list[RepoFile]]:
    """Model GGUFs matching a pattern, by stem: each single file or split set, parts sorted."""
    regex = pattern_regex(file_pattern)
    sets: dict[str, list[RepoFile]] = {}
    for repo_file in sorted(files, key=lambda f: f.path):
        if is_model_gguf(repo_file.path) and regex.fullmatch(repo_file.path):
            sets.setdefault(SPLIT_RE.sub("", repo_file.path), []).append(repo_file)
    return sets


def quant_sets(files: list[RepoFile], file_pattern: str | None = None) -> dict[str, list[RepoFile]]:
    """GGUF files matching a pattern, grouped by quant (first set per quant, parts sorted)."""
    by_quant: dict[str, list[RepoFile]] = {}
    for parts in gguf_sets(files, file_pattern).values():
        quant = quant_of(parts[0].path)
        if quant is not None:
            by_quant.setdefault(quant, parts)
    return by_quant


def group_quants(files: list[RepoFile], file_pattern: str | None = None) -> dict[str, QuantChoice]:
    """The quants a repository offers for a pattern, keyed by label, complete sets only."""
    return {
        quant: QuantChoice(quant, tuple(parts))
        for quant, parts in quant_sets(files, file_pattern).items()
        if not missing_parts(parts)
    }


def missing_parts(parts: list[RepoFile]) -> list[str]:
    """Names of split parts absent from `parts` (sorted by path); [] when complete."""
    index = split_index(parts[0].path)
    if index is None:
        return []
    count = index[1]
    have = {split_index(p.path)[0] for p in parts if split_index(p.path)}  # type: ignore[index]
    first = parts[0].path
    return [SPLIT_RE.sub(f"-{i:05d}-of-{count:05d}.gguf", first) for i in range(1, count + 1) if i not in have]
