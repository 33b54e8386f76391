"""Where a step's wall time goes: inside llama.cpp, or in specrun's own Python (a benchmark, not CI).

On generated models small enough that a decode takes about a millisecond on a CPU, as a small
model's does on a GPU, it runs plain decoding, prompt lookup, a draft model (same vocabulary, and
another one, translated), the target drafting for itself, an EAGLE-3 and a DFlash drafter,
MTP and four batched streams, greedy, and splits each run's wall time into:
- llama.cpp's part: inside `llama_decode` (the target's, an MTP head's, a drafter's),
  `llama_encode` (an EAGLE-3 drafter's encoder) and the calls that read what a decode computed
  (`llama_get_logits`, the MTP head's hidden rows), which are where a GPU decode is waited for;
- specrun's part: everything else, per token, per decode call and per step.
With `--llama-bin DIR` (llama-bench and llama-speculative-simple built from the llama.cpp that
llama-cpp-python vendors, `compare_llama_cpp.build_tools`) each round also runs llama.cpp's own
loop on the same files, prompt, threads and k, interleaved with specrun's.

    python scripts/host_time.py [--size cpu|cpu-small|gpu] [--k 4 | --k 1,2,4,8,auto] [--rounds 3]
                                [--threads 2] [--llama-bin DIR] [--only REGEX] [--json FILE]

With several k, a last line says how auto's speed compares with the best fixed k's, per pair.
"""

from __future__ import annotations

import specrun.backend  # noqa: F401  (libllama loads before numpy: backend.library.load_before_numpy)

# isort: split

import argparse
import json
import re
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from generated_models import SIZES, write_models

from specrun.backend.library import llama, llama_ext
from specrun.config import SessionConfig
from specrun.core.events import Done, TokenEvent
from specrun.session import Session

PROMPT = "the cat sat on the mat and the cat sat on the mat , then the dog was there and the cat"
DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
ACCEPTED = re.compile(r"n_accept\s*=\s*(\d+)")


def skip_decode(context, batch) -> int:
    """A `llama_decode` that decodes nothing: the logits of the last real decode stay in place."""
    return 0


@contextmanager
def llama_decode_as(replacement):
    """llama-cpp-python's `llama_decode` replaced while the block runs (specrun looks it up at each
    call); yields the original, for a replacement that wraps it."""
    L = llama()
    original, L.llama_decode = L.llama_decode, replacement
    try:
        yield original
    finally:
        L.llama_decode = original


@dataclass
class LlamaClock:
    """Seconds inside llama.cpp's decode calls and the reads that wait for a decode, counted by
    wrapping those functions of llama-cpp-python's bindings (specrun looks each up per call)."""

    DECODES = ("llama_decode", "llama_encode")  # an EAGLE-3 drafter's encoder runs a graph too
    READS = ("llama_get_logits",)
    EXT_READS = ("llama_get_embeddings_nextn",)
    seconds: float = 0.0
    decodes: int = 0
    originals: dict = field(default_factory=dict)

    def install(self) -> None:
        for module, names in ((llama(), self.DECODES + self.READS), (llama_ext(), self.EXT_READS)):
            for name in names:
                original = getattr(module, name)
                self.originals[name] = (module, original)
                setattr(module, name, self._timed(original, name in self.DECODES))

    def _timed(self, function, counts_decode: bool):
        clock, perf = self, time.perf_counter

        def timed(*args):
            started = perf()
            try:
                return function(*args)
            finally:
                clock.seconds += perf() - started
                clock.decodes += counts_decode

        return timed

    def reading(self) -> tuple[float, int]:
        return self.seconds, self.decodes


@dataclass
class Split:
    """One run after its first token: wall seconds, llama.cpp's seconds, decode calls, steps, tokens."""

    wall: float = 0.0
    llama: float = 0.0
    decodes: int = 0
    steps: int = 0
    tokens: int = 0
    accepted: int = 0

    def add(self, other: Split) -> None:
        for name in ("wall", "llama", "decodes", "steps", "tokens", "accepted"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def row(self, name: str) -> dict:
        own_ms = 1000 * (self.wall - self.llama)
        return {
            "run": name,
            "tok/s": self.tokens / self.wall,
            "tokens/step": self.tokens / self.steps,
            "decodes/step": self.decodes / self.steps,
            "wall ms/step": 1000 * self.wall / self.steps,
            "llama.cpp ms/step": 1000 * self.llama / self.steps,
            "specrun ms/step": own_ms / self.steps,
            "specrun ms/decode": own_ms / self.decodes,
            "specrun ms/token": own_ms / self.tokens,
        }


def one_stream(session: Session, clock: LlamaClock, tokens: int, run: Run) -> Split:
    """A generation, timed from its first token (the prefill's) to its end."""
    split, start = Split(), None
    for event in session.stream(PROMPT, tokens, plain=run.plain, k=run.k):
        if isinstance(event, TokenEvent) and start is None:
            start, (llama_at, decodes_at) = time.perf_counter(), clock.reading()
        if isinstance(event, Done):
            llama_s, decodes = clock.reading()
            split = Split(time.perf_counter() - start, llama_s - llama_at, decodes - decodes_at)
            split.steps, split.tokens, split.accepted = event.stats.steps, event.stats.tokens - 1, event.stats.accepted
    return split


def four_streams(session: Session, clock: LlamaClock, tokens: int, run: Run) -> Split:
    """Four generations in one batch, timed from the first step (prefills included: short prompts)."""
    batch = session.batch()
    results = []
    for slot in range(session.config.parallel):
        prompt = session.tokenize(f"{slot} {PROMPT}")
        batch.add(session.engine(plain=run.plain, policy=run.k, slot=slot), prompt, tokens, on_done=results.append)
    started, (llama_at, decodes_at) = time.perf_counter(), clock.reading()
    while batch.streams:
        batch.step()
    llama_s, decodes = clock.reading()
    split = Split(time.perf_counter() - started, llama_s - llama_at, decodes - decodes_at, batch.decodes)
    split.tokens, split.accepted = sum(len(r.tokens) for r in results), sum(r.stats.accepted for r in results)
    return split


class Run(NamedTuple):
    setup: str  # the session it runs on (`setups`)
    plain: bool
    k: str | None = None


def setups(models: dict[str, Path], threads: int) -> dict[str, SessionConfig]:
    """The sessions the runs share, each loaded once: a run is a set-up at a k."""
    base = dict(target=models["target"], n_ctx=2048, threads=threads)
    return {
        "target": SessionConfig(**base, lookup=True),
        "draft": SessionConfig(**base, draft=models["draft"]),
        "self": SessionConfig(**base, draft=models["target"]),
        "translated": SessionConfig(**base, draft=models["translated"]),
        "mtp": SessionConfig(target=models["q35"], n_ctx=2048, threads=threads, sources=("mtp",)),
        "eagle3": SessionConfig(**base, draft=models["eagle3"]),
        "dflash": SessionConfig(**base, draft=models["dflash"]),
        "four": SessionConfig(**base | {"n_ctx": 4096}, draft=models["draft"], parallel=4),
    }


def runs_at(ks: list[str]) -> dict[str, Run]:
    """Every run by name, its model drafts at each of `ks` (a number or auto)."""
    runs = {"plain": Run("target", True), "lookup k 8": Run("target", False, "8")}
    for k in ks:
        runs |= {f"draft k {k}": Run("draft", False, k), f"self-draft k {k}": Run("self", False, k)}
        runs[f"translated k {k}"] = Run("translated", False, k)
        runs[f"eagle3 k {k}"] = Run("eagle3", False, k)
        runs[f"dflash k {k}"] = Run("dflash", False, k)
    runs |= {"mtp k 3": Run("mtp", False, "3"), "4 streams: plain": Run("four", True)}
    runs[f"4 streams: draft k {ks[0]}"] = Run("four", False, ks[0])
    return runs


def llama_cpp_runs(
    models: dict[str, Path], bin_dir: Path, tokens: int, threads: int, ks: list[str], depth: int
) -> dict[str, list[str]]:
    """llama.cpp's own loop for a run of the same name (every layer offloaded where it can): its command line.
    llama-bench generates after `depth` tokens, the prompt's: later tokens attend to more, and
    past 256 cells llama.cpp attends over twice as many (its cache is padded to 256)."""
    common = ["-p", PROMPT, "-n", str(tokens), "-t", str(threads), "-c", "2048", "--temp", "0", "--no-repack", "-ngl", "99"]
    spec = [str(bin_dir / "llama-speculative-simple"), *common, "--spec-draft-n-min", "0", "--spec-draft-p-min", "0"]
    pair = [*spec, "-ngld", "99", "--spec-type", "draft-simple", "-m", str(models["target"])]
    runs = {
        "plain": [str(bin_dir / "llama-bench"), "-m", str(models["target"]), "-p", "0", "-n", str(tokens), "-d", str(depth)]
        + ["-t", str(threads), "-r", "3", "-o", "json", "--repack", "0", "-ngl", "99"],
        "mtp k 3": [*spec, "-m", str(models["q35"]), "--spec-type", "draft-mtp", "--spec-draft-n-max", "3"],
    }
    for k in (k for k in ks if k.isdigit()):
        runs[f"draft k {k}"] = [*pair, "-md", str(models["draft"]), "--spec-draft-n-max", k]
        runs[f"self-draft k {k}"] = [*pair, "-md", str(models["target"]), "--spec-draft-n-max", k]
        for drafter in ("eagle3", "dflash"):
            runs[f"{drafter} k {k}"] = [*spec, "-ngld", "99", "-m", str(models["target"]), "-md", str(models[drafter])]
            runs[f"{drafter} k {k}"] += ["--spec-type", f"draft-{drafter}", "--spec-draft-n-max", k]
    return runs


def llama_cpp_speed(command: list[str]) -> tuple[float, int | None]:
    """Tokens/s of llama.cpp's run (llama-bench's mean, or the speculative loop's decoded tokens),
    and the draft tokens it accepted."""
    for _ in range(3):  # llama.cpp's log thread now and then loses the last lines at exit: run it again
        out = subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=600)
        if out.returncode != 0:
            sys.exit(f"host_time.py: {Path(command[0]).name} failed ({out.returncode}): {out.stderr.strip()[-400:]}")
        if Path(command[0]).name == "llama-bench":
            return json.loads(out.stdout)[0]["avg_ts"], None
        log = out.stdout + out.stderr
        decoded, accepted = DECODED.search(log), ACCEPTED.search(log)
        if decoded:
            return int(decoded[1]) / float(decoded[2]), int(accepted[1]) if accepted else None
    sys.exit(f"host_time.py: {Path(command[0]).name} printed no speed in three runs: {log.strip()[-400:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=Path("/tmp/specrun-host-time"), help="folder of the generated models")
    parser.add_argument("--size", choices=sorted(SIZES), default="cpu", help="the generated models' size")
    parser.add_argument("--k", default="4", help="comma-separated draft lengths of the model drafts (numbers, auto)")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", default="", help="a regular expression: only the runs whose names it finds")
    parser.add_argument("--llama-bin", type=Path, help="folder with llama-bench and llama-speculative-simple")
    parser.add_argument("--json", type=Path, help="also write every round's figures here")
    args = parser.parse_args()
    models = write_models(args.models, args.size)
    ks = args.k.split(",")
    clock = LlamaClock()
    clock.install()
    runs = {name: run for name, run in runs_at(ks).items() if re.search(args.only, name)}
    configs = setups(models, args.threads)
    totals = {name: Split() for name in runs}
    rounds: list[dict] = []
    with ExitStack() as open_sessions:
        sessions = {name: open_sessions.enter_context(Session(configs[name])) for name in {run.setup for run in runs.values()}}
        depth = len(sessions["target"].tokenize(PROMPT)) if "target" in sessions else 0  # plain's, the one llama-bench run
        theirs = llama_cpp_runs(models, args.llama_bin, args.tokens, args.threads, ks, depth) if args.llama_bin else {}
        for round_ in range(args.rounds + 1):  # round 0 warms up (auto's costs, page cache) and is not counted
            rounds += measure_round(round_, runs, sessions, clock, args.tokens, theirs, totals)
    print_table(totals, rounds)
    if args.json:
        args.json.write_text(json.dumps(rounds, indent=1))


def measure_round(
    round_: int, runs: dict[str, Run], sessions: dict[str, Session], clock: LlamaClock, tokens: int, theirs: dict, totals: dict
) -> list[dict]:
    """Each run once, and llama.cpp's loop of the same name after it; round 0 warms up (auto's
    costs, the page cache) and is not kept."""
    kept = []
    for name, run in runs.items():
        session = sessions[run.setup]
        split = (four_streams if session.config.parallel > 1 else one_stream)(session, clock, tokens, run)
        if round_ == 0:
            continue
        totals[name].add(split)
        figures = {"round": round_, **split.row(name), "accepted": split.accepted}
        if name in theirs:
            speed, accepted = llama_cpp_speed(theirs[name])
            figures |= {
                "llama.cpp tok/s": speed,
                "llama.cpp accepted": accepted,
                "vs llama.cpp": split.tokens / split.wall / speed,
            }
        kept.append(figures)
        print(json.dumps(figures), flush=True)
    return kept


def print_table(totals: dict[str, Split], rounds: list[dict]) -> None:
    columns = ["tok/s", "tokens/step", "decodes/step", "wall ms/step", "llama.cpp ms/step", "specrun ms/step"]
    columns += ["specrun ms/decode", "specrun ms/token"]
    print("| run | " + " | ".join(columns) + " | vs llama.cpp (per round) |")
    print("|---" * (len(columns) + 2) + "|")
    for name, split in totals.items():
        row = split.row(name)
        ratios = [f"{r['vs llama.cpp']:.2f}" for r in rounds if r["run"] == name and "vs llama.cpp" in r]
        cells = [f"{row[c]:.3f}" if "ms" in c else f"{row[c]:.1f}" if c == "tok/s" else f"{row[c]:.2f}" for c in columns]
        print(f"| {name} | " + " | ".join(cells) + f" | {' / '.join(ratios) or '-'} |")
    for family in ("draft", "self-draft", "translated"):
        fixed = {name: split for name, split in totals.items() if name.startswith(f"{family} k ") and name[-1].isdigit()}
        auto = totals.get(f"{family} k auto")
        if auto and fixed:
            best = max(fixed, key=lambda name: fixed[name].tokens / fixed[name].wall)
            speed = auto.tokens / auto.wall / (fixed[best].tokens / fixed[best].wall)
            print(f"{family}: auto runs at {speed:.3f}x the best fixed k ({best})")


if __name__ == "__main__":
    main()
