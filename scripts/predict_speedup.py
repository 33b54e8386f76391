"""The speed-up the cost model predicts for a bench run's measured acceptance on another cost curve (not CI).

Reads a `specrun bench --json` document and, for each method x k, takes its measured
acceptance by draft position (the share of drafts that reached position i whose first i
tokens were all accepted) and predicts tokens per second against plain decoding on a cost
curve given in units of one plain decode: a verify of w rows costs 1 + SLOPE * (w - 1)
(GPU-like by default: 16 rows cost 1.1 rows' worth), and each drafted token costs
--draft-cost (a draft model's per-token cost against the target's: `specrun pair check`
prints it; 0 for lookup). The best draft length up to the longest measured is reported.
A prediction, not a measurement.

    python scripts/predict_speedup.py bench.json --draft-cost 0.39
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

GPU_SLOPE = 0.1 / 15  # a verify of 16 rows costs 1.1x one row


def predicted(acceptance: list[float], draft_cost: float, slope: float) -> tuple[int, float]:
    """(best k, speed-up over plain) for per-position cumulative acceptance."""
    best_k, best, expected = 0, 1.0, 1.0
    for k, reached in enumerate(acceptance, start=1):
        expected += reached
        speedup = expected / (1 + slope * k + k * draft_cost)
        if speedup > best:
            best_k, best = k, speedup
    return best_k, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench", type=Path, help="a specrun bench --json document")
    parser.add_argument("--draft-cost", type=float, default=0.0, help="a draft token's cost in plain decodes, for draft/hybrid")
    parser.add_argument("--slope", type=float, default=GPU_SLOPE, help="extra cost per verified row, in plain decodes")
    args = parser.parse_args()
    document = json.loads(args.bench.read_text())
    print(f"{'method':14} {'k':>5} {'measured x plain':>17} {'predicted x plain':>18} {'at k':>5}")
    for row in document["summary"].values():
        cost = args.draft_cost if row["method"] in ("draft", "hybrid") else 0.0
        k, speedup = predicted(row["acceptance_by_position"], cost, args.slope)
        print(f"{row['method']:14} {str(row['k']):>5} {row['speedup']:17.2f} {speedup:18.2f} {k:5}")


if __name__ == "__main__":
    main()
