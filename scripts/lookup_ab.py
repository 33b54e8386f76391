"""Prompt lookup and its k policy as they are now against a git revision's, in one process (benchmark, not CI).

Both share one session and one verify-cost table, and run interleaved per prompt with a
fresh lookup and policy per generation, so the machine's drift between runs does not
enter the ratio. Prints each one's speed-up over plain decoding (total tokens / total
time), the median tok/s per prompt, and per prompt group and lookup source how many
drafted tokens the target accepted.

    python scripts/lookup_ab.py --baseline REV [--prompts F | --builtin] [--k auto,16] [--rounds 3] [--keep-policy]

--keep-policy keeps one policy per version and k across all prompts and rounds, as
`specrun bench`, `chat` and `serve` keep theirs, so what auto learned carries over.
The baseline's lookup and policies must speak today's contracts (DraftSource.propose with a
DraftRequest, returning its draft or, as now, yielding its decodes; DraftPolicy.offer/extend/
observe) in today's layout (specrun/drafts/lookup.py, specrun/core/policy.py and auto.py): a
revision from the one that introduced them on.
"""

from __future__ import annotations

import specrun.backend  # noqa: F401  (libllama loads before numpy: backend.library.load_before_numpy)

# isort: split

import argparse
import collections
import importlib.util
import inspect
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from compare_llama_cpp import read_prompts

from specrun.bench.prompts import load_builtin
from specrun.config import SessionConfig
from specrun.core import auto, policy
from specrun.core.drafting import without_decodes
from specrun.core.engine import Engine
from specrun.core.events import Stats, StepEvent
from specrun.core.sampling import Sampler
from specrun.drafts import lookup
from specrun.hub.embedded import embedded_model_path
from specrun.session import Session

HERE = Path(__file__).parent


def module_at(revision: str, name: str, tmp: Path):
    """specrun/NAME.py as it was at `revision`, loaded as a module of its own."""
    shown = subprocess.run(["git", "show", f"{revision}:specrun/{name}.py"], cwd=HERE.parent, capture_output=True, text=True)
    if shown.returncode != 0:
        sys.exit(
            f"lookup_ab: no specrun/{name}.py at revision {revision!r} (give a commit of this repository "
            "from the drafts/ and core/ layout on)"
        )
    name = name.replace("/", "_")
    path = tmp / f"baseline_{name}.py"
    path.write_text(shown.stdout)
    spec = importlib.util.spec_from_file_location(f"baseline_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def new_lookup(lookup_module, session: Session):
    """A PromptLookup as `lookup_module` (now or a revision's) builds it for the session's model;
    a revision's from before propose yielded its decodes has its propose wrapped as today's."""
    lookup_class = lookup_module.PromptLookup
    if not inspect.isgeneratorfunction(lookup_class.propose):
        lookup_class.propose = without_decodes(lookup_class.propose)
    return lookup_class(breaks=lookup_module.blank_lines(session.target.model))


def make_policy(policies, k: int | str, costs: list[float]):
    """`policies`: the (policy, auto) modules of one version."""
    fixed, cost_aware = policies
    return cost_aware.AutoK(costs) if k == "auto" else fixed.FixedK(k)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="git revision whose lookup to compare against")
    parser.add_argument("--prompts", type=Path, default=HERE / "prompts" / "copy_heavy.txt")
    parser.add_argument("--builtin", action="store_true", help="use the built-in bench sets instead of --prompts")
    parser.add_argument("--k", default="auto,16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--keep-policy", action="store_true", help="one policy per version and k for the whole run")
    args = parser.parse_args()
    if args.builtin:
        prompts = [(p.group, p.text) for p in load_builtin()]
    else:
        prompts = [("prompts", text) for text in read_prompts(args.prompts)]
    ks = [int(k) if k.isdigit() else k for k in args.k.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        baseline = (
            module_at(args.baseline, "drafts/lookup", Path(tmp)),
            (module_at(args.baseline, "core/policy", Path(tmp)), module_at(args.baseline, "core/auto", Path(tmp))),
        )
        versions = {"now": (lookup, (policy, auto)), args.baseline: baseline}
        runs = [("plain", None, 1)] + [(name, modules, k) for name, modules in versions.items() for k in ks]
        speed = collections.defaultdict(list)  # (name, k) -> (prompt index, tokens, seconds)
        sources = collections.defaultdict(lambda: [0, 0])  # (name, k, group, source) -> drafted, accepted
        config = SessionConfig(target=embedded_model_path(), lookup=True, n_ctx=2048, threads=args.threads)
        with Session(config) as session:
            costs = session.policies.verify_costs()
            kept = {(name, k): make_policy(modules[1], k, costs) for name, modules, k in runs if modules}
            for _ in range(args.rounds):
                for i, (group, text) in enumerate(prompts):
                    tokens = session.tokenize(text)
                    for name, modules, k in runs:
                        session.target.truncate(0)
                        # Each generation learns from nothing, like a fresh process, unless kept.
                        sampler = Sampler.seeded(config.sampler)
                        if modules:
                            chosen = kept[(name, k)] if args.keep_policy else make_policy(modules[1], k, costs)
                            generator = Engine(session.target, new_lookup(modules[0], session), sampler, chosen)
                        else:
                            generator = Engine(session.target, None, sampler)

                        def count(event: StepEvent, stats: Stats, where=(name, k, group)) -> None:
                            if event.drafted:
                                counts = sources[(*where, event.draft_source)]
                                counts[0] += event.drafted
                                counts[1] += event.accepted

                        stats = generator.run(tokens, args.max_tokens, on_step=count).stats
                        speed[(name, k)].append((i, stats.tokens, stats.generate_s))
    report(speed, sources)


def report(speed: dict, sources: dict) -> None:
    def rate(rows):
        return sum(n for _, n, _ in rows) / sum(s for _, _, s in rows)

    plain = rate(speed[("plain", 1)])
    for (name, k), rows in speed.items():
        per_prompt = collections.defaultdict(list)
        for i, n, s in rows:
            per_prompt[i].append(n / s)
        medians = " ".join(f"{statistics.median(v):5.1f}" for v in per_prompt.values())
        print(f"{name:12} k {str(k):5} {rate(rows) / plain:5.2f}x plain   median tok/s per prompt: {medians}")
    print("accepted / drafted, per group and lookup source:")
    for (name, k, group, source), (drafted, accepted) in sorted(sources.items(), key=str):
        print(f"  {name:12} k {str(k):5} {group:11} {source:12} {accepted:5} / {drafted:5} = {accepted / drafted:4.0%}")


if __name__ == "__main__":
    main()
