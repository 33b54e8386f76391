"""`specrun pull SPEC...`: fetch models into the Hugging Face cache ahead of time."""

from __future__ import annotations

from typing import Annotated, List, Optional

import typer

from specrun.cli.app import app, err_console
from specrun.hub import resolve_model


@app.command()
def pull(
    specs: Annotated[List[str], typer.Argument(help="alias[:QUANT], owner/repo[:QUANT], owner/repo/file.gguf")],
    quant: Annotated[
        Optional[str],
        typer.Option(
            "--quant",
            "-q",
            help="Quant to fetch, e.g. Q4_K_M, overriding :QUANT (default: the spec's :QUANT, else the largest that fits in memory).",
        ),
    ] = None,
    offline: Annotated[bool, typer.Option("--offline", help="Only check the cache; never use the network.")] = False,
) -> None:
    """Download models (with their split parts) into the Hugging Face cache; print their paths."""
    for spec in specs:
        model = resolve_model(spec, quant=quant, offline=offline)
        err_console.print(model.reason, highlight=False)
        typer.echo(str(model.path))
