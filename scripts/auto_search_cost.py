"""What `--k auto`'s search for the best draft length costs per step (a benchmark, not CI).

Where verifying hundreds of rows costs about one decode, as on a GPU, the verify-cost table is
as wide as the batch (512), and every step's `AutoK.best_k` may look that far. This times it on
such a table, for sources of low, high and very high acceptance, with a short limit and the
batch's; the draft length it picks is printed beside it.

    python scripts/auto_search_cost.py
"""

from __future__ import annotations

import timeit
from functools import partial

from specrun.core.auto import AutoK, SourceTrack

# 1.7 ms for one row and 10 us more per row: verifying 512 rows costs about four one-row decodes.
policy = AutoK([0.0] + [0.0017 + 0.00001 * width for width in range(1, 513)])
for acceptance in (0.6, 0.95, 0.99):
    track = SourceTrack(prior=acceptance, draft_token_s=0.0002)
    for limit in (8, 510):
        seconds = min(timeit.repeat(partial(policy.best_k, track, limit), number=2000, repeat=5)) / 2000
        print(f"acceptance {acceptance}, limit {limit}: k {policy.best_k(track, limit)}, {seconds * 1e6:.1f} us")
