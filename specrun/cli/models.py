"""`specrun models`: the GGUF models in the Hugging Face cache, or the known aliases."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from specrun.cli.app import app, err_console


@app.command()
def models(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document instead of a table."),
    aliases: bool = typer.Option(False, "--aliases", help="List the known aliases instead of the cache."),
) -> None:
    """List cached models (alias, repo, quant, size, path)."""
    from specrun.hub.profiles import load_profiles

    profiles = load_profiles()
    if aliases:
        rows = [
            {"alias": p.alias, "family": p.family, "repo": p.repo, "params": p.params,
             "drafts": list(p.drafts), "k": p.k}
            for p in profiles.values()
        ]
        return _print(rows, as_json, ["alias", "family", "repo", "params", "drafts", "k"])
    from specrun.hub.cache import cached_models
    from specrun.hub.download import hub_cache_dir

    found = cached_models(profiles)
    if not found:
        err_console.print(f"no GGUF models in the Hugging Face cache ({hub_cache_dir()})", highlight=False)
    rows = [m.as_json() for m in found]
    _print(rows, as_json, ["alias", "repo", "quant", "size", "path"])


def _print(rows: list[dict], as_json: bool, columns: list[str]) -> None:
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        return
    table = Table(*columns, box=None, pad_edge=False)
    for row in rows:
        table.add_row(*(_cell(column, row[column]) for column in columns))
    Console(soft_wrap=True).print(table)


def _cell(column: str, value: object) -> str:
    if value is None:
        return "-"
    if column == "size":
        from specrun.hub.memory import format_bytes

        return format_bytes(int(value))  # type: ignore[arg-type]
    if column == "params":
        return f"{int(value) / 1e9:.2f}B"  # type: ignore[arg-type]
    if isinstance(value, list):
        return ", ".join(value) or "-"
    return str(value)
