"""`specrun pair`: which draft works with a target, what it costs, and self-derived drafts."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from specrun.cli.app import app
from specrun.cli.options import INT32_MAX, MAX_THREADS, in_range
from specrun.errors import SpecrunError

pair_app = typer.Typer(help="Check, find and derive draft models for a target.",
                       no_args_is_help=True)
app.add_typer(pair_app, name="pair")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]
OfflineOpt = Annotated[bool, typer.Option(
    "--offline", help="Use only what is on disk (files, caches, other tools' stores) and the profiles.")]
CtxOpt = Annotated[int, typer.Option("--ctx", callback=in_range(1, INT32_MAX, f"an integer from 1 to {INT32_MAX}"),
                                     help="Context length for the memory estimate.")]
AcceptOpt = Annotated[Optional[float], typer.Option(
    "--acceptance", callback=in_range(0, 1, "a number in [0, 1]"),
    help="Per-token acceptance rate to assume (default: the family's prior).")]


@pair_app.command("check")
def check(
    target: Annotated[str, typer.Argument(help="Target: a .gguf path, alias, owner/repo, owner/repo/file.gguf or ollama:NAME.")],
    draft: Annotated[str, typer.Argument(help="Draft: a .gguf path, alias, owner/repo, owner/repo/file.gguf or ollama:NAME.")],
    json_out: JsonOpt = False,
    offline: OfflineOpt = False,
    n_ctx: CtxOpt = 4096,
    acceptance: AcceptOpt = None,
    rpc_servers: Annotated[Optional[str], typer.Option(
        "--rpc", help="rpc-servers that would take layers, HOST:PORT[,...]: their free memory counts (default: none).")] = None,
) -> None:
    """Would DRAFT work with TARGET in llama.cpp, could it be faster, and does it fit? Reads headers only."""
    from specrun import rpc
    from specrun.hub.memory import memory_budget
    from specrun.pair.check import check_pair
    from specrun.pair.report import check_lines
    from specrun.pair.sources import load_facts

    endpoints = rpc.parse_endpoints(rpc_servers, "--rpc")
    facts = load_facts(target, offline), load_facts(draft, offline)
    result = check_pair(*facts, n_ctx, acceptance, budget=memory_budget(rpc=endpoints))
    if json_out:
        typer.echo(json.dumps(result.as_json(), indent=2))
    else:
        typer.echo("\n".join(check_lines(result)))
    if not result.compat.ok:
        raise typer.Exit(code=1)


@pair_app.command("derive")
def derive(
    target: Annotated[str, typer.Option("--target", "-m", help="Target .gguf to take layers from.")],
    output: Annotated[str, typer.Option("--output", "-o", help="Where to write the draft .gguf.")],
    layers: Annotated[Optional[str], typer.Option(
        "--layers", help="Target layers to keep, e.g. 0-5 or 0-2,15-17 (default: none; give --layers or --auto).")] = None,
    auto: Annotated[bool, typer.Option(
        "--auto", help="Choose the layers by measuring acceptance and cost on sample prompts.")] = False,
    threads: Annotated[int, typer.Option("--threads", "-t", callback=in_range(0, MAX_THREADS, f"an integer from 0 to {MAX_THREADS} (0 = all cores)"),
                                         help="CPU threads for --auto (0 = all).")] = 0,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing output file.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Write a self-speculative draft: a subset of TARGET's layers, sharing its vocabulary."""
    from pathlib import Path

    from specrun.cli.app import err_console
    from specrun.pair.check import check_pair
    from specrun.files import check_writable
    from specrun.pair.derive import check_derivable, derive_draft, parse_layers
    from specrun.pair.header import read_local
    from specrun.pair.report import auto_lines, derive_lines
    from specrun.pair.sources import local_path

    target_path, out = local_path(target), Path(output)
    if (layers is None) == (not auto):
        raise SpecrunError("give either --layers (e.g. --layers 0-2,15-17) or --auto")
    check_writable(out, "--output")
    if out.exists() and not force:
        raise SpecrunError(f"{out} exists: pass --force to overwrite it")
    if out.resolve() == target_path.resolve():
        raise SpecrunError("--output must differ from the target file")
    target_facts = read_local(target_path)
    check_derivable(target_facts)
    measured = []
    if auto:
        from specrun.pair.autoderive import measure

        measured = measure(target_path, threads=threads,
                           report=lambda line: err_console.print(line, markup=False))
        best = max(measured, key=lambda m: m.speedup)
        kept = list(best.layers)
    else:
        kept = parse_layers(layers or "", target_facts.n_layers)
    derived = derive_draft(target_path, kept, out)
    result = check_pair(target_facts, read_local(out),
                        acceptance=best.acceptance if auto else None, why="measured by --auto")
    if json_out:
        typer.echo(json.dumps({"path": str(out), "layers": kept, **result.as_json(),
                               "measured": [m.__dict__ for m in measured]}, indent=2))
    else:
        typer.echo("\n".join(auto_lines(measured) + derive_lines(derived, result)))


@pair_app.command("suggest")
def suggest(
    target: Annotated[str, typer.Option("--target", "-m", help="Target: path, alias, hub repo or ollama:NAME.")],
    top: Annotated[int, typer.Option("--top", callback=in_range(1, allowed="an integer >= 1"), help="How many drafts to list.")] = 5,
    offline: OfflineOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Compatible drafts for TARGET, best first: from profiles, files on disk, then the hub."""
    from specrun.cli.app import err_console
    from specrun.pair.report import suggest_lines
    from specrun.pair.suggest import suggest as find_drafts

    known, found = find_drafts(target, offline, top, report=lambda line: err_console.print(line, markup=False))
    if json_out:
        typer.echo(json.dumps({
            "target": known.facts.source if known.facts else known.spec,
            "target_evidence": known.evidence,
            "target_on_disk": str(known.path) if known.path else None,
            "drafts": [s.as_json() for s in found],
        }, indent=2))
    else:
        typer.echo("\n".join(suggest_lines(known, found)))
