"""The verify-cost curve: one target decode with logits for w rows, per width (benchmark, not CI).

Times the same decodes `--k auto` measures at start-up (specrun.core.costs.time_decodes), at
every width up to 17 and then at a few wider ones, and prints ms per decode and per row:
the curve that decides how long a draft can pay. `--ubatch-size` shows what smaller
micro-batches cost; `--plot` draws the curve (needs the plot extra). `--head` also times
each decode with logits for its last row only: the difference is the output head's share of
a verify row. The last line is the ceiling these costs put on speculation: the speed-up over
plain decoding of a draft accepted whole, at the width where a row is cheapest against one
decode of one row.

    python scripts/verify_costs.py --threads 2 [--head] --plot docs/verify-costs.png
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specrun.backend import Context, ContextOptions, Model, ModelOptions  # noqa: E402
from specrun.core.costs import time_decodes  # noqa: E402

WIDTHS = [*range(1, 18), 24, 32, 48, 64, 96, 128, 256]


def measure(
    model_path: Path, threads: int, ubatches: list[int], repeats: int, every_row: bool = True, n_gpu_layers: int = 0
) -> dict[int, dict[int, float]]:
    """ms per decode, per n_ubatch (0 = n_batch) and width; logits for every row or the last."""
    model = Model(model_path, ModelOptions(n_gpu_layers=n_gpu_layers))
    try:
        curves = {}
        for ubatch in ubatches:
            context = Context(model, ContextOptions(n_ctx=1024, n_batch=512, n_ubatch=ubatch, n_threads=threads))
            try:
                context.eval(model.tokenize("The verify cost of a batch of rows"), 1)
                curves[ubatch] = {w: 1000 * s for w, s in time_decodes(context, WIDTHS, repeats, every_row).items()}
            finally:
                context.close()
        return curves
    finally:
        model.close()


def plot(curves: dict[int, dict[int, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (per_decode, per_row) = plt.subplots(1, 2, figsize=(10, 4))
    for ubatch, curve in curves.items():
        label = f"n_ubatch {ubatch or 512}"
        per_decode.plot(list(curve), list(curve.values()), marker=".", label=label)
        per_row.plot(list(curve), [ms / w for w, ms in curve.items()], marker=".", label=label)
    per_decode.set(xlabel="rows verified in one decode", ylabel="ms per decode", xscale="log", yscale="log")
    per_row.set(xlabel="rows verified in one decode", ylabel="ms per row", xscale="log")
    for axes in (per_decode, per_row):
        axes.grid(True, alpha=0.3)
        axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="GGUF (default: the embedded Gemma 3 270M)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ubatch-size", default="0", help="comma list of n_ubatch values (0 = n_batch, 512)")
    parser.add_argument("--repeats", type=int, default=3, help="timings per width; the best is kept")
    parser.add_argument("--head", action="store_true", help="also time each width with logits for its last row only")
    parser.add_argument("--plot", type=Path, help="also draw the curves to this image")
    parser.add_argument("--n-gpu-layers", type=int, default=0, help="layers offloaded to a GPU (-1: every one; default 0)")
    args = parser.parse_args()
    if args.model is None:
        from specrun.hub.embedded import embedded_model_path

        args.model = embedded_model_path()
    ubatches = [int(u) for u in args.ubatch_size.split(",")]
    curves = measure(args.model, args.threads, ubatches, args.repeats, n_gpu_layers=args.n_gpu_layers)
    headless = measure(args.model, args.threads, ubatches, args.repeats, False, args.n_gpu_layers) if args.head else {}
    for ubatch, curve in curves.items():
        print(
            f"n_ubatch {ubatch or 512}, {args.threads} threads: width, ms per decode, ms per row"
            + (", ms per row with logits for the last row only, the output head's share" if headless else "")
        )
        for width, ms in curve.items():
            line = f"  {width:4} {ms:7.1f} {ms / width:6.2f}"
            if headless:
                bare = headless[ubatch][width]
                line += f" {bare / width:6.2f} {1 - bare / ms:6.0%}"
            print(line)
        best = max(curve, key=lambda width: width * curve[1] / curve[width])
        print(
            f"  ceiling: a draft accepted whole runs at most {best * curve[1] / curve[best]:.2f}x plain "
            f"(verified {best} rows at a time)"
        )
    if args.plot:
        plot(curves, args.plot)


if __name__ == "__main__":
    main()
