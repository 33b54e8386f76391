"""Which of a repository's GGUF files a spec loads: the file it names, the quant asked for, or
the largest quant that fits in the memory left (`choose_file`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from specrun.errors import SpecrunError
from specrun.hub.memory import MemoryBudget, format_bytes, memory_budget, run_bytes
from specrun.hub.profiles import ModelProfile
from specrun.hub.quants import NEVER_AUTO, QuantChoice, group_quants, missing_parts, quant_of, quant_sets
from specrun.hub.spec import ModelSpec

if TYPE_CHECKING:
    from specrun.hub.download import RepoListing

# llama.cpp's `-hf` default, used when the memory to fit in cannot be read.
FALLBACK_QUANT = "Q4_K_M"


@dataclass(frozen=True)
class ModelRequest:
    """An alias or hub spec, and how to choose among its files."""

    parsed: ModelSpec
    profile: ModelProfile | None  # the alias's
    quant: str | None  # asked for, by --quant or the spec; None lets the memory decide
    budget_bytes: int | None  # the memory to fit in; None: measure it
    reserve_bytes: int  # kept for the draft and the caches
    excluded: frozenset[str]  # quants never chosen automatically
    rpc: tuple[str, ...]  # the servers whose free memory counts

    @property
    def repo(self) -> str:
        repo = self.profile.repo if self.profile else self.parsed.repo
        assert repo is not None  # parse_spec gives an alias or a repo
        return repo

    @property
    def pattern(self) -> str | None:
        return self.profile.file_pattern if self.profile else None

    @property
    def expected_file(self) -> str | None:
        """The file a named file or an alias's quant stands for, for messages."""
        if self.parsed.filename is not None:
            return self.parsed.filename
        return self.pattern.replace("{quant}", self.quant) if self.pattern and self.quant else None

    def budget(self) -> MemoryBudget | None:
        if self.budget_bytes is not None:
            return MemoryBudget(self.budget_bytes, "the given budget")
        return memory_budget(rpc=self.rpc)


@dataclass(frozen=True)
class ChosenQuant:
    quant_choice: QuantChoice
    reason: str
    fits: bool = True  # False when even the smallest quant exceeds the memory budget


def choose_file(listing: RepoListing, request: ModelRequest) -> ChosenQuant:
    """The file named, the quant asked for, or the largest that fits; one the list lacks is an error."""
    name = request.parsed.alias or listing.repo
    if request.parsed.filename is not None:
        filename = request.parsed.filename
        return ChosenQuant(named_file(listing, filename), f"{name}: {filename} as named")
    choices = group_quants(listing.files, request.pattern)
    if not choices:
        raise SpecrunError(no_gguf_message(listing, request.pattern))
    where = "cached " if listing.cached else ""
    if request.quant is None:
        return fit_quant(name, choices, request.budget(), request.reserve_bytes, where, request.excluded)
    if request.quant not in choices:
        raise SpecrunError(
            f"{name} has no {where}{request.quant} GGUF{missing_note(listing, request.pattern, request.quant)}; "
            f"{where}quants: {', '.join(sorted(choices))}"
        )
    chosen = choices[request.quant]
    return ChosenQuant(chosen, f"{name}: {request.quant} ({format_bytes(chosen.size)}) as asked")


def fit_quant(
    name: str,
    choices: dict[str, QuantChoice],
    budget: MemoryBudget | None,
    reserve_bytes: int,
    where: str = "",
    excluded: frozenset[str] = NEVER_AUTO,
) -> ChosenQuant:
    """The largest quant whose run size fits the budget after the reserve."""
    candidates = sorted((c for q, c in choices.items() if q not in excluded), key=lambda c: c.size)
    if not candidates:
        candidates = sorted(choices.values(), key=lambda c: c.size)
    if budget is None:
        chosen = choices.get(FALLBACK_QUANT) or candidates[0]
        return ChosenQuant(chosen, f"{name}: {chosen.quant} ({format_bytes(chosen.size)}), free memory unknown")
    room = budget.bytes - reserve_bytes
    reserve_note = f" after {format_bytes(reserve_bytes)} kept for the draft and cache" if reserve_bytes else ""
    fitting = [c for c in candidates if run_bytes(c.size) <= room]
    if not fitting:
        smallest = candidates[0]
        return ChosenQuant(
            smallest,
            f"{name}: {smallest.quant} ({format_bytes(smallest.size)}), the smallest {where}quant; none fits in "
            f"{format_bytes(budget.bytes)} of {budget.where}{reserve_note}, expect partial offload or swapping",
            fits=False,
        )
    chosen = fitting[-1]
    return ChosenQuant(
        chosen,
        f"{name}: {chosen.quant} ({format_bytes(chosen.size)}), the largest {where}quant that fits in "
        f"{format_bytes(budget.bytes)} of {budget.where}{reserve_note}",
    )


def named_file(listing: RepoListing, filename: str) -> QuantChoice:
    """owner/repo/file.gguf: that file, or the whole split set it is the first part of."""
    by_path = {f.path: f for f in listing.files}
    if filename not in by_path:
        source = "the cache" if listing.cached else listing.repo
        raise SpecrunError(f"{filename} is not in {source}; `specrun pull {listing.repo}` shows what it has")
    sets = quant_sets(listing.files)
    for parts in sets.values():
        if parts[0].path == filename:
            gaps = missing_parts(parts)
            if gaps:
                raise SpecrunError(f"{listing.repo}: split parts missing from the cache: {', '.join(gaps)}")
            return QuantChoice(quant_of(filename) or "", tuple(parts))
    return QuantChoice(quant_of(filename) or "", (by_path[filename],))


def missing_note(listing: RepoListing, pattern: str | None, quant: str) -> str:
    parts = quant_sets(listing.files, pattern).get(quant)
    if not parts:
        return ""
    return f" (split parts missing: {', '.join(missing_parts(parts))})"


def no_gguf_message(listing: RepoListing, pattern: str | None) -> str:
    what = f"matching {pattern}" if pattern else "with a quant in its name"
    if listing.cached:
        from specrun.hub.download import hub_cache_dir  # a cached listing came from there: already imported

        return (
            f"no complete GGUF {what} of {listing.repo} is in the cache ({hub_cache_dir()}) and the "
            f"hub is not reachable: connect and run `specrun pull {listing.repo}`"
        )
    return f"{listing.repo} has no GGUF file {what}: pick a GGUF repository or name the file"
