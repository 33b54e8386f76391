"""Rich tables and bar charts of a bench document (the same dict --json writes)."""

from __future__ import annotations

from rich.console import Console, Group
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from specrun.bench.methods import k_order
from specrun.bench.results import SPEEDUP_DEFINITION

BAR_WIDTH = 40
MAX_PROMPT_ROWS = 40  # beyond this the per-prompt table is only in --json / --csv
EXACTNESS_DOC = "docs/troubleshooting.md#output-differs-from-plain-decoding"
TITLE = "Per prompt: plain tok/s; speed-up (acceptance)"


def show(document: dict, out: Console) -> None:
    """Everything bench prints on stdout, at the console's width."""
    for table in prompt_tables(document, out):
        out.print(table)
    out.print(summary_table(document))
    note = exactness_note(document)
    if note is not None:
        out.print(note)
    translated = translation_table(document)
    if translated is not None:
        out.print(translated)
    if document["summary"]:
        out.print(acceptance_chart(document))
        out.print(speedup_chart(document))
    out.print(f"recommendation: {document['recommendation']}")


def summary_table(document: dict) -> Table:
    plain = document["plain"]
    table = Table(
        title="Summary",
        caption=(
            f"tok/s counts generated tokens after the prompt is processed; prompt processing (plain, caches "
            f"emptied before each run): {plain['prefill_tokens_per_s']:.0f} tok/s. Speed-up: {SPEEDUP_DEFINITION}. "
            f"Peak memory (whole process, peak RSS): {document['peak_rss_mb']:.0f} MiB."
        ),
        caption_justify="left",
        # One space between columns rather than two, and headers on two lines: the table fits 80
        # columns with every header whole, even with k llama.cpp and four-digit tok/s.
        collapse_padding=True,
    )
    for column in ("method", "k", "tok/s", "speed-up", "accepted", "tok/step", "draft /\nverify", "same as\nplain"):
        table.add_column(column, justify="left" if column == "method" else "right", no_wrap=True)
    table.add_row("plain", "", f"{plain['tokens_per_s']:.1f}", "1.00x", "", "1.00", "", "")
    for row in document["summary"].values():
        table.add_row(
            row["method"],
            str(row["k"]),
            f"{row['tokens_per_s']:.1f}",
            _speedup(row["speedup"]),
            f"{100 * row['acceptance_rate']:.0f}%",
            f"{row['tokens_per_step']:.2f}",
            f"{100 * row['draft_share']:.0f}% / {100 * row['verify_share']:.0f}%",
            _match(row["matches_plain"]),
        )
    return table


def exactness_note(document: dict) -> Text | None:
    """Why greedy output can differ from plain decoding, for a reader who was told it is exact."""
    if all(row["matches_plain"] in (None, 1.0) for row in document["summary"].values()):
        return None
    return Text(
        "same as plain below 100%: batched and one-token decodes round differently in llama.cpp, which can flip a "
        "near-tie in greedy output (not a change of distribution); --ubatch-size 6 makes them identical on CPU. "
        f"See {EXACTNESS_DOC}",
        style="dim",
    )


def translation_table(document: dict) -> Table | None:
    """For drafts with another vocabulary: how their caches were kept in step, and what it cost."""
    rows = [row for row in document["summary"].values() if row.get("reencoded_share") is not None]
    if not rows:
        return None
    table = Table(
        title="Translated drafts (a draft with another vocabulary)",
        caption=(
            "re-encoded: of the tokens fed to the draft's cache, the share re-encoded from a window of the accepted text "
            "(the rest: its own guesses the text confirmed); translating: share of the time "
            "spent converting between the vocabularies"
        ),
        caption_justify="left",
    )
    for column in ("method", "k", "re-encoded", "translating", "accepted"):
        table.add_column(column, justify="left" if column == "method" else "right")
    for row in rows:
        table.add_row(
            row["method"],
            str(row["k"]),
            f"{100 * row['reencoded_share']:.0f}%",
            f"{100 * row['translate_share']:.1f}%",
            f"{100 * row['acceptance_rate']:.0f}%",
        )
    return table


def prompt_tables(document: dict, console: Console) -> list[Table | Text]:
    """The per-prompt table: one if it fits the console, else one per method, each as wide as fits."""
    prompts = document["prompts"]
    if len(prompts) > MAX_PROMPT_ROWS:
        return [Text(f"({len(prompts)} prompts: per-prompt results are in --json / --csv)", style="dim")]
    keys = list(document["summary"])
    if _fits(console, _prompt_table(document, keys, TITLE)):
        return [_prompt_table(document, keys, TITLE)]
    by_method: dict[str, list[str]] = {}
    for key in keys:
        by_method.setdefault(document["summary"][key]["method"], []).append(key)
    groups: list[list[str]] = []
    for same in by_method.values():
        groups.append([])
        for key in same:  # a k that does not fit beside the others starts a table of its own
            if groups[-1] and not _fits(console, _prompt_table(document, [*groups[-1], key], TITLE)):
                groups.append([])
            groups[-1].append(key)
    # The title once: the tables that follow have the same columns, and a narrow one would wrap it.
    return [_prompt_table(document, group, TITLE if i == 0 else None) for i, group in enumerate(groups)]


def _prompt_table(document: dict, keys: list[str], title: str | None) -> Table:
    table = Table(title=title, collapse_padding=True)  # one space between columns, as in the summary
    table.add_column("prompt", overflow="fold")  # a long path folds rather than losing its end
    table.add_column("prompt\ntokens", justify="right")
    table.add_column("plain\ntok/s", justify="right")
    for key in keys:
        row = document["summary"][key]
        table.add_column(f"{row['method']}\nk={row['k']}", justify="right", no_wrap=True)
    for prompt in document["prompts"]:
        cells = [
            f"{_speedup(r['speedup'])} ({100 * r['acceptance_rate']:.0f}%)" for r in (prompt["results"][key] for key in keys)
        ]
        plain = prompt["plain"]
        table.add_row(prompt["source"], str(prompt["prompt_tokens"]), f"{plain['tokens_per_s']:.1f}", *cells)
    return table


def _fits(console: Console, table: Table) -> bool:
    """Whether the table fits the console unwrapped (measured wider: at its width the measure is capped)."""
    return Measurement.get(console, console.options.update_width(10_000), table).maximum <= console.width


def acceptance_chart(document: dict) -> Group:
    """Per method at its largest k (which covers the most positions): accepted fraction by position."""
    lines = [Text("Acceptance by draft position (each method at its largest k)", style="bold")]
    largest: dict[str, dict] = {}
    for row in document["summary"].values():
        if k_order(row["k"]) >= k_order(largest.get(row["method"], {"k": 0})["k"]):
            largest[row["method"]] = row
    for method, row in largest.items():
        lines.append(Text(f"{method} k={row['k']}"))
        drafted, accepted = row["drafted_by_position"], row["accepted_by_position"]
        for first, last in position_groups(len(drafted)):
            # Every draft that reached a position reached the one before: no group's count is 0.
            rate = sum(accepted[first - 1 : last]) / sum(drafted[first - 1 : last])
            label = f"{first}" if first == last else f"{first}-{last}"
            reached = drafted[first - 1]
            shown = f"{100 * rate:.0f}% of {reached} draft{'s' * (reached != 1)}"
            lines.append(_bar(f"  pos {label:<6}", rate, 1.0, shown, "cyan"))
    lines.append(Text("of N drafts: how many drafts reached the position (of a range, its first)", style="dim"))
    return Group(*lines)


def position_groups(positions: int) -> list[tuple[int, int]]:
    """Chart rows as (first, last) positions: 1 to 8 one by one, then 9-16, 17-32, and 33 on.

    Auto drafts for as long as the text keeps matching (dozens of positions, up to hundreds),
    and few drafts reach the far ones: ranges keep a method's chart to 12 lines with its name.
    """
    groups, first = [], 1
    while first <= positions:
        if first <= 8:
            last = first
        elif first <= 32:
            last = min(2 * (first - 1), positions)  # 9-16, 17-32
        else:
            last = positions
        groups.append((first, last))
        first = last + 1
    return groups


def speedup_chart(document: dict) -> Group:
    lines = [Text("Speed-up vs k (1.00x = plain)", style="bold")]
    rows = list(document["summary"].values())
    scale = max([1.0, *(row["speedup"] for row in rows)])
    labels = [f"{row['method']:>6} k={row['k']}" for row in rows]
    for row, label in zip(rows, labels):
        style = "green" if row["speedup"] >= 1 else "red"
        lines.append(_bar(f"{label:<{max(map(len, labels))}}", row["speedup"], scale, f"{row['speedup']:.2f}x", style))
    return Group(*lines)


def _bar(label: str, value: float, scale: float, shown: str, style: str) -> Text:
    width = round(BAR_WIDTH * max(value, 0.0) / scale) if scale else 0
    text = Text(f"{label} ")
    text.append("█" * width, style=style)
    text.append(f" {shown}")
    return text


def _speedup(value: float) -> str:
    return f"{value:.2f}x"


def _match(fraction: float | None) -> str:
    return "" if fraction is None else f"{100 * fraction:.0f}%"
