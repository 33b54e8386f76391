"""The --json document and the --csv rows of a benchmark."""

from __future__ import annotations

import csv
import io
import json

from specrun.bench.methods import PLAIN
from specrun.bench.results import Results, recommend

CSV_COLUMNS = [
    "prompt",
    "source",
    "group",
    "prompt_tokens",
    "method",
    "k",
    "runs",
    "tokens",
    "tokens_per_s",
    "speedup",
    "acceptance_rate",
    "mean_accepted_length",
    "tokens_per_step",
    "drafted",
    "accepted",
    "acceptance_by_position",
    "prefill_tokens_per_s",
    "draft_share",
    "verify_share",
    "matches_plain",
    "stop_reasons",
]


def build_document(results: Results, config: dict, prompts: list[dict]) -> dict:
    """config: the run's settings; prompts: per prompt {"source", "group", "prompt_tokens"}."""
    summary = results.summary()
    per_prompt = []
    for index, meta in enumerate(prompts):
        rows = {v.key: {"method": v.method, "k": v.k, **results.prompt_row(index, v.key)} for v in results.speculative}
        per_prompt.append({"index": index, **meta, "plain": results.prompt_row(index, PLAIN), "results": rows})
    return {
        "config": config,
        "summary": summary,
        "plain": results.summary_row(PLAIN),
        "prompts": per_prompt,
        "recommendation": recommend(summary),
        "peak_rss_mb": results.peak_rss_mb,
    }


def csv_rows(document: dict) -> list[dict]:
    """One row per prompt x method x k (plain included, with k = 0)."""
    rows = []
    for prompt in document["prompts"]:
        head = {
            "prompt": prompt["index"],
            "source": prompt["source"],
            "group": prompt["group"],
            "prompt_tokens": prompt["prompt_tokens"],
        }
        plain = {"method": PLAIN, "k": 0, **prompt["plain"]}
        for row in [plain, *prompt["results"].values()]:
            flat = {**head, **row}
            flat["acceptance_by_position"] = ";".join(f"{x:.4f}" for x in row["acceptance_by_position"])
            flat["stop_reasons"] = ";".join(row["stop_reasons"])
            rows.append({column: flat.get(column) for column in CSV_COLUMNS})
    return rows


def json_text(document: dict) -> str:
    return json.dumps(document, indent=2) + "\n"


def csv_text(document: dict) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(csv_rows(document))
    return out.getvalue()
