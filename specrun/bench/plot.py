"""--plot: acceptance by draft position and speed-up vs k as one image (matplotlib, optional)."""

from __future__ import annotations

from pathlib import Path

from specrun.bench.methods import k_order
from specrun.errors import SpecrunError
from specrun.files import atomic_path


def check_plot_path(path: Path) -> None:
    """Before measuring: matplotlib is there and knows the file type."""
    try:  # matplotlib is optional (the plot extra) and slow to import: only --plot loads it
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        raise SpecrunError("--plot needs matplotlib: run `pip install 'specrun[plot]'`") from None
    kinds = FigureCanvasBase.get_supported_filetypes()
    if path.suffix.lstrip(".").lower() not in kinds:
        raise SpecrunError(f"--plot {path}: unknown image type; end the name in one of .{', .'.join(sorted(kinds))}")


def save_plot(document: dict, path: Path) -> None:
    from matplotlib.figure import Figure  # as above; no pyplot: no global state, no display needed

    figure = Figure(figsize=(11, 4.2), layout="constrained")
    by_position, by_k = figure.subplots(1, 2)
    summary = document["summary"].values()
    for row in summary:
        rates = row["acceptance_by_position"]
        by_position.plot(range(1, len(rates) + 1), rates, marker="o", label=f"{row['method']} k{row['k']}")
    by_position.set(title="Acceptance by draft position", xlabel="draft position", ylabel="accepted fraction", ylim=(0, 1.05))
    # k is categorical: draft lengths in order, then the policies (auto, llama.cpp).
    ks = sorted({row["k"] for row in summary}, key=k_order)
    for method in dict.fromkeys(row["method"] for row in summary):
        rows = sorted((r for r in summary if r["method"] == method), key=lambda r: k_order(r["k"]))
        by_k.plot([ks.index(r["k"]) for r in rows], [r["speedup"] for r in rows], marker="o", label=method)
    by_k.axhline(1.0, color="grey", linestyle="--", label="plain")
    speedups = [row["speedup"] for row in summary]
    if speedups:  # keep plain's 1.0 line in view, with room around the points
        by_k.set_ylim(min(0.9, min(speedups) - 0.05), max(1.1, max(speedups) + 0.05))
        by_k.set_xticks(range(len(ks)), [str(k) for k in ks])
    by_k.set(title="Speed-up vs k (summary throughput / plain)", xlabel="k (tokens drafted per step)", ylabel="speed-up")
    for axes in (by_position, by_k):
        if axes.lines:
            axes.legend(fontsize="small")
    figure.suptitle(f"specrun bench: {Path(document['config']['target']).name}, {len(document['prompts'])} prompts")
    with atomic_path(path, "--plot") as temp:
        figure.savefig(temp, format=path.suffix.lstrip(".").lower())
