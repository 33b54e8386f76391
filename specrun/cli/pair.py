"""`specrun pair`: which draft works with a target, what it costs, and self-derived drafts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from specrun.backend import rpc
from specrun.cli.app import app, err_console
from specrun.pair.check import DEFAULT_CTX, check_models
from specrun.pair.make import make_draft
from specrun.pair.mtp import MTP_SPEC, check_mtp
from specrun.pair.report import auto_lines, check_lines, derive_lines, mtp_check_lines, suggest_lines
from specrun.pair.suggest import known_traits
from specrun.pair.suggest import suggest as find_drafts

pair_app = typer.Typer(help="Check, find and derive draft models for a target.", no_args_is_help=True)
app.add_typer(pair_app, name="pair")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]
OfflineOpt = Annotated[
    bool, typer.Option("--offline", help="Use only what is on disk (files, caches, other tools' stores) and the profiles.")
]
CtxOpt = Annotated[int, typer.Option("--ctx", help="Context length for the memory estimate.")]
AcceptOpt = Annotated[
    Optional[float], typer.Option("--acceptance", help="Per-token acceptance rate to assume (default: the family's prior).")
]


def _report(line: str) -> None:
    err_console.print(line, markup=False)


@pair_app.command("check")
def check(
    target: Annotated[str, typer.Argument(help="Target: a .gguf path, alias, owner/repo, owner/repo/file.gguf or ollama:NAME.")],
    draft: Annotated[
        str,
        typer.Argument(
            help="Draft: a .gguf path, alias, owner/repo, owner/repo/file.gguf, ollama:NAME, or mtp (the target's own MTP layers)."
        ),
    ],
    json_out: JsonOpt = False,
    offline: OfflineOpt = False,
    ctx: CtxOpt = DEFAULT_CTX,
    acceptance: AcceptOpt = None,
    k: Annotated[
        str,
        typer.Option(
            "--k",
            help="The --k you would run with: a hybrid target keeps a copy of its recurrent state for each token of the longest draft it grants (16 for auto and llama.cpp).",
        ),
    ] = "auto",
    rpc_servers: Annotated[
        Optional[str],
        typer.Option(
            "--rpc", help="rpc-servers that would take layers, HOST:PORT[,...]: their free memory counts (default: none)."
        ),
    ] = None,
) -> None:
    """Would DRAFT work with TARGET in llama.cpp, could it be faster, and does it fit? Reads headers only."""
    endpoints = rpc.parse_endpoints(rpc_servers, "--rpc")
    options: dict[str, Any] = dict(ctx=ctx, acceptance=acceptance, offline=offline, rpc=endpoints, k=k)
    if draft == MTP_SPEC:
        own = check_mtp(target, **options)
        typer.echo(json.dumps(own.as_json(), indent=2) if json_out else "\n".join(mtp_check_lines(own)))
        if not own.can_draft:
            raise typer.Exit(code=1)
        return
    result = check_models(target, draft, **options)
    if json_out:
        typer.echo(json.dumps(result.as_json(), indent=2))
    else:
        typer.echo("\n".join(check_lines(result)))
    if not result.can_draft:
        raise typer.Exit(code=1)


@pair_app.command("derive")
def derive(
    target: Annotated[str, typer.Option("--target", "-m", help="Target .gguf to take layers from.")],
    output: Annotated[str, typer.Option("--output", "-o", help="Where to write the draft .gguf.")],
    layers: Annotated[
        Optional[str],
        typer.Option("--layers", help="Target layers to keep, e.g. 0-5 or 0-2,15-17 (default: none; give --layers or --auto)."),
    ] = None,
    auto: Annotated[
        bool, typer.Option("--auto", help="Choose the layers by measuring acceptance and cost on sample prompts.")
    ] = False,
    threads: Annotated[int, typer.Option("--threads", "-t", help="CPU threads for --auto (0 = all).")] = 0,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing output file.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Write a self-speculative draft: a subset of TARGET's layers, sharing its vocabulary."""
    made = make_draft(target, Path(output), layers=layers, auto=auto, threads=threads, force=force, report=_report)
    if json_out:
        typer.echo(
            json.dumps(
                {
                    "path": str(made.draft.path),
                    "layers": list(made.draft.layers),
                    **made.check.as_json(),
                    "measured": [m.__dict__ for m in made.measured],
                },
                indent=2,
            )
        )
    else:
        typer.echo("\n".join(auto_lines(made.measured) + derive_lines(made.draft, made.check)))


@pair_app.command("suggest")
def suggest(
    target: Annotated[str, typer.Option("--target", "-m", help="Target: path, alias, hub repo or ollama:NAME.")],
    top: Annotated[int, typer.Option("--top", help="How many drafts to list.")] = 5,
    offline: OfflineOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Drafts for TARGET, best first: its own MTP layers, then from profiles, files on disk (another vocabulary: translated), then the hub."""
    known, own, found = find_drafts(target, offline, top, report=_report)
    if json_out:
        typer.echo(
            json.dumps(
                {
                    "target": known.facts.source if known.facts else known.spec,
                    "target_evidence": known.evidence,
                    "target_on_disk": str(known.path) if known.path else None,
                    "target_traits": known_traits(known).as_json(),
                    "drafts": ([own.as_json()] if own else []) + [s.as_json() for s in found],
                },
                indent=2,
            )
        )
    else:
        typer.echo("\n".join(suggest_lines(known, own, found)))
