"""Verify costs kept across runs, per model file and set-up, in specrun's cache.

Measuring every batch width takes seconds (3-4 s for Gemma 3 270M on 2 CPU cores), which
each `specrun generate` with `--k auto` would otherwise pay before its first token. The
table auto has refined while running is written back when the session closes, so the
next run starts from what this machine measured last, once a few decodes agree with it
(`policy.verify_costs_hold`).
"""

from __future__ import annotations

import json
from pathlib import Path

from specrun.backend import llama_cpp_version
from specrun.files import WriteError, write_text_atomic
from specrun.hub.embedded import cache_dir


def cache_file() -> Path:
    return cache_dir() / "verify-costs.json"


def setup_key(model: Path, **settings) -> str:
    """What the costs depend on: the model file as it is now, the llama.cpp build and `settings`."""
    stat = model.stat()
    parts = [str(model.resolve()), str(stat.st_size), str(stat.st_mtime_ns), llama_cpp_version()]
    parts += [f"{name}={value}" for name, value in sorted(settings.items())]
    return "|".join(parts)


def load(key: str) -> list[float] | None:
    """The kept costs for widths 1..W (index = width), or None to measure them."""
    entry = _read().get(key)
    costs = entry.get("costs") if isinstance(entry, dict) else None
    if not isinstance(costs, list) or len(costs) < 2:
        return None
    if not all(isinstance(c, (int, float)) and c > 0 for c in costs[1:]):
        return None
    return [float(c) for c in costs]


def save(key: str, model: Path, costs: list[float]) -> None:
    """Keep `costs` for `key`, replacing the file whole so a crash never leaves half of it.

    Entries of model files that are gone are dropped, so the file holds only what can be used.
    """
    table = {k: v for k, v in _read().items() if isinstance(v, dict) and Path(str(v.get("model"))).exists()}
    table[key] = {"model": str(model.resolve()), "costs": list(costs)}
    path = cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(table, indent=1))
    except (OSError, WriteError):
        pass  # a read-only cache only means measuring again next time


def _read() -> dict:
    try:
        table = json.loads(cache_file().read_text())
    except (OSError, ValueError):
        return {}  # missing or damaged: measure again and write a whole new file
    return table if isinstance(table, dict) else {}
