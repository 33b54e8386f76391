"""`specrun models`: the GGUF models on disk (Hugging Face cache, Ollama, LM Studio, llama.cpp), or the aliases."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from specrun.cli.app import app, err_console
from specrun.errors import SpecrunError
from specrun.headers.arch import Traits, header_traits, profile_traits
from specrun.headers.read import read_keys
from specrun.hub.memory import format_bytes
from specrun.hub.profiles import load_profiles
from specrun.hub.stores import SOURCE_LABELS, StoredModel, store_roots, stored_models


@app.command()
def models(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document instead of a table."),
    aliases: bool = typer.Option(False, "--aliases", help="List the known aliases instead of the models on disk."),
) -> None:
    """List the models on disk: the Hugging Face cache, Ollama, LM Studio and llama.cpp (read-only)."""
    profiles = load_profiles()
    if aliases:
        rows = [
            {
                "alias": p.alias,
                "family": p.family,
                "repo": p.repo,
                "params": p.params,
                "active": p.active_params,
                "drafts": list(p.drafts),
                "k": p.k,
                "mtp": p.mtp or None,
                "hybrid": p.hybrid,
            }
            for p in profiles.values()
        ]
        if not as_json:
            for row, p in zip(rows, profiles.values()):
                row["notes"] = profile_traits(p.mtp, p.hybrid).short
        return _print(rows, as_json, ["alias", "family", "repo", "params", "drafts", "k", "notes"])
    found = stored_models(profiles)
    if not found:
        places = [f"{SOURCE_LABELS[source]} ({root})" for source, root in store_roots().items()]
        err_console.print(f"no GGUF models in {', '.join(places[:-1])} or {places[-1]}", highlight=False)
    kinds = [_traits(m) for m in found]
    rows = [
        {**m.as_json(), "architecture": (t.arch or None) if t else None, **(t.as_json() if t else UNKNOWN_TRAITS)}
        for m, t in zip(found, kinds)
    ]
    if as_json:
        return _print(rows, True, [])
    for row, m, t in zip(rows, found, kinds):
        row["path"] = str(m.path) if m.usable else f"not usable: {m.problem or 'split parts missing'}"
        row["notes"] = t.short if t else None
    _print(rows, False, ["source", "alias", "name", "family", "quant", "size", "notes", "path"])


UNKNOWN_TRAITS = {"mtp": None, "mtp_layers": None, "hybrid": None, "rolls_back": None}


def _traits(model: StoredModel) -> Traits | None:
    """What the file is for drafting (its MTP heads, a recurrent state), from its header; None where
    the file is not usable or its header cannot be read."""
    if not model.usable:
        return None
    try:
        keys = read_keys(model.path)  # type: ignore[arg-type]
    except SpecrunError:
        return None  # the listing still shows the file; only what it is stays unknown
    return header_traits(keys.meta, keys.tensor_names)


def _print(rows: list[dict], as_json: bool, columns: list[str]) -> None:
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        return
    table = Table(box=None, pad_edge=False)
    for column in columns:  # names and paths fold onto more lines rather than lose their ends
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(_cell(column, row[column]) for column in columns))
    console = Console(soft_wrap=True)
    if console.is_terminal:
        return console.print(table)
    console.width = 10_000  # piped: one line per model, whatever its length, no padding after it
    with console.capture() as captured:
        console.print(table)
    typer.echo("\n".join(line.rstrip() for line in captured.get().splitlines()))


def _cell(column: str, value: Any) -> str:  # a row's JSON value
    if value is None or value == "":
        return "-"
    if column == "size":
        return format_bytes(int(value))
    if column == "params":
        return f"{int(value) / 1e9:.2f}B"
    if isinstance(value, list):
        return ", ".join(value) or "-"
    return str(value)
