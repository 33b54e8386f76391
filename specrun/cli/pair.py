"""`specrun pair`: which draft works with a target, what it costs, and self-derived drafts."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from specrun.cli.app import app
from specrun.errors import SpecrunError

pair_app = typer.Typer(help="Check, find and derive draft models for a target.",
                       no_args_is_help=True)
app.add_typer(pair_app, name="pair")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]
OfflineOpt = Annotated[bool, typer.Option("--offline", help="Use only local files and the cache.")]
CtxOpt = Annotated[int, typer.Option("--ctx", help="Context length for the memory estimate.")]
AcceptOpt = Annotated[Optional[float], typer.Option(
    "--acceptance", help="Per-token acceptance rate to assume instead of the family prior.")]


def _check_acceptance(value: float | None) -> None:
    if value is not None and not 0.0 <= value <= 1.0:
        raise SpecrunError(f"--acceptance must be in [0, 1], got {value}")


@pair_app.command("check")
def check(
    target: Annotated[str, typer.Argument(help="Target: .gguf path or owner/repo/file.gguf.")],
    draft: Annotated[str, typer.Argument(help="Draft: .gguf path or owner/repo/file.gguf.")],
    json_out: JsonOpt = False,
    offline: OfflineOpt = False,
    n_ctx: CtxOpt = 4096,
    acceptance: AcceptOpt = None,
) -> None:
    """Would DRAFT work with TARGET in llama.cpp, and could it be faster? Reads headers only."""
    from specrun.pair.check import check_pair
    from specrun.pair.report import check_lines
    from specrun.pair.sources import load_facts

    _check_acceptance(acceptance)
    if n_ctx <= 0:
        raise SpecrunError(f"--ctx must be positive, got {n_ctx}")
    result = check_pair(load_facts(target, offline), load_facts(draft, offline), n_ctx, acceptance)
    if json_out:
        typer.echo(json.dumps(result.as_json(), indent=2))
    else:
        typer.echo("\n".join(check_lines(result)))
    if not result.compat.ok:
        raise typer.Exit(code=1)
