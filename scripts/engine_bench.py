"""Engine measurements for the README (a benchmark, not a test).

For each llama.cpp setting (flash attention, CPU weight repacking) on the same prompts:
plain greedy decoding, prompt lookup at fixed k and auto, and a draft equal to the target,
all in one Session. Reports tokens/s (after the prompt), speed-up vs plain, how many whole
greedy outputs match plain decoding, the acceptance of the target drafting for itself, the
loop's own overhead per step, and the time per step spent checking the verified rows.

    python scripts/engine_bench.py [--prompts scripts/prompts/copy_heavy.txt] [--max-tokens 128]
"""

from __future__ import annotations

import specrun.backend  # noqa: F401  (libllama loads before numpy: backend.library.load_before_numpy)

# isort: split

import argparse
import json
import statistics
from pathlib import Path

from compare_llama_cpp import read_prompts

from specrun.config import SessionConfig
from specrun.core.events import Stats
from specrun.hub.embedded import embedded_model_path
from specrun.session import Session

HERE = Path(__file__).parent


def run(session: Session, tokens: list[int], max_tokens: int, plain: bool, k) -> tuple[list[int], Stats]:
    session.target.truncate(0)  # the same cold start for every run
    run = session.engine(plain=plain, policy=k).run(tokens, max_tokens)
    return run.tokens, run.stats


def measure(model: Path, prompts: list[str], max_tokens: int, flash_attn: int, repack: bool, threads: int) -> tuple[dict, list]:
    """Per method: rates and counts; and the verify cost per batch width (ms, index 0 = 1 row)."""
    rows: dict[str, list] = {"plain": [], "lookup_k8": [], "lookup_k16": [], "lookup_kauto": [], "self_k4": []}
    configs = {
        "lookup": SessionConfig(target=model, lookup=True, n_ctx=2048, flash_attn=flash_attn, repack=repack, threads=threads),
        "self": SessionConfig(target=model, draft=model, n_ctx=2048, flash_attn=flash_attn, repack=repack, threads=threads),
    }
    with Session(configs["lookup"]) as lookup, Session(configs["self"]) as self_draft:
        costs_ms = [round(1000 * c, 1) for c in lookup.policies.verify_costs()[1:]]
        for text in prompts:
            tokens = lookup.tokenize(text)
            plain_out, plain = run(lookup, tokens, max_tokens, True, 1)
            rows["plain"].append((plain_out, plain))
            for k in (8, 16, "auto"):
                rows[f"lookup_k{k}"].append(run(lookup, tokens, max_tokens, False, k))
            self_draft.drafter.context.truncate(0)
            rows["self_k4"].append(run(self_draft, tokens, max_tokens, False, 4))
    plain_outputs = [out for out, _ in rows["plain"]]
    report = {}
    for name, results in rows.items():
        stats = [s for _, s in results]
        total = Stats()
        for s in stats:
            total.accumulate(s)
        report[name] = {
            "tokens_per_s": total.tokens_per_s,
            "prefill_tokens_per_s": total.prefilled_tokens / total.prefill_s,
            "acceptance_rate": total.acceptance_rate,
            "tokens_per_step": total.mean_accepted_length,
            "overhead_per_step_ms": total.overhead_per_step_ms,
            "check_per_step_ms": 1000 * total.check_s / total.steps,
            "matches_plain": sum(out == ref for (out, _), ref in zip(results, plain_outputs)),
            "per_prompt_tokens_per_s": [round(s.tokens_per_s, 1) for s in stats],
        }
    for name in report:
        report[name]["speedup"] = report[name]["tokens_per_s"] / report["plain"]["tokens_per_s"]
    return report, costs_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=Path, default=HERE / "prompts" / "copy_heavy.txt")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--settings", default="fa-1/rp0,fa0/rp0,fa1/rp0,fa-1/rp1", help="flash_attn/repack pairs")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    model, prompts = embedded_model_path(), read_prompts(args.prompts)
    results = {}
    for setting in args.settings.split(","):
        fa, rp = setting.split("/")
        report, costs_ms = measure(model, prompts, args.max_tokens, int(fa[2:]), rp == "rp1", args.threads)
        results[setting] = {"methods": report, "verify_costs_ms": costs_ms}
        print(f"\n== flash_attn={fa[2:]} repack={rp == 'rp1'}  ({len(prompts)} prompts, {args.max_tokens} tokens)")
        print(
            f"{'method':14} {'tok/s':>7} {'x plain':>8} {'accept':>7} {'tok/step':>8} {'ovh ms':>7} {'check ms':>8} {'=plain':>7} {'prefill t/s':>11}"
        )
        for name, r in report.items():
            print(
                f"{name:14} {r['tokens_per_s']:7.1f} {r['speedup']:8.2f} {r['acceptance_rate']:7.2f} "
                f"{r['tokens_per_step']:8.2f} {r['overhead_per_step_ms']:7.3f} {r['check_per_step_ms']:8.3f} {r['matches_plain']:>4}/{len(prompts)} "
                f"{r['prefill_tokens_per_s']:11.1f}"
            )
        print("verify cost per batch width 1..N, ms:", " ".join(f"{c:.0f}" for c in costs_ms))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print(
        "\nmedian plain tok/s over settings:",
        round(statistics.median(r["methods"]["plain"]["tokens_per_s"] for r in results.values()), 1),
    )


if __name__ == "__main__":
    main()
