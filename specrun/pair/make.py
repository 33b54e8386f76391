"""`pair derive` from start to end: the checks, the layers (given or measured), the file, its pair check."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from specrun import settings
from specrun.errors import SpecrunError
from specrun.files import check_writable
from specrun.headers.read import read_local
from specrun.pair.autoderive import Measured, measure
from specrun.pair.check import PairCheck, check_pair
from specrun.pair.derive import DerivedDraft, check_derivable, derive_draft, parse_layers
from specrun.pair.sources import local_path

MEASURED = "measured by --auto"


@dataclass(frozen=True)
class MadeDraft:
    draft: DerivedDraft
    check: PairCheck  # the target with the written draft
    measured: list[Measured]  # every subset --auto measured, in the order measured; [] without it


def make_draft(
    target: str,
    output: Path,
    *,
    layers: str | None = None,
    auto: bool = False,
    threads: int = 0,
    force: bool = False,
    report: Callable[[str], None] = lambda line: None,
) -> MadeDraft:
    """Write a draft of TARGET's layers to `output`: the `layers` given (e.g. "0-2,15-17") or,
    with `auto`, the subset that measures fastest on `threads` threads (`report` hears each).

    Refused before any work: both or neither of layers and auto, an output that cannot be
    written, exists without `force`, or is the target itself.
    """
    settings.check(threads=threads)
    target_path = local_path(target)
    if (layers is None) == (not auto):
        raise SpecrunError("give either --layers (e.g. --layers 0-2,15-17) or --auto")
    check_output(output, target_path, force)
    target_facts = read_local(target_path)
    check_derivable(target_facts)
    measured, acceptance = [], None
    if auto:
        measured = measure(target_path, threads=threads, report=report)
        best = max(measured, key=lambda m: m.speedup)
        kept, acceptance = list(best.layers), best.acceptance
    else:
        kept = parse_layers(layers or "", target_facts.n_layers)
    derived = derive_draft(target_path, kept, output)
    return MadeDraft(derived, check_pair(target_facts, read_local(output), acceptance=acceptance, why=MEASURED), measured)


def check_output(output: Path, target: Path, force: bool) -> None:
    check_writable(output, "--output")
    if output.exists() and not force:
        raise SpecrunError(f"{output} exists: pass --force to overwrite it")
    if output.resolve() == target.resolve():
        raise SpecrunError("--output must differ from the target file")
