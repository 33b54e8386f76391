"""Where a step's wall time goes: inside llama.cpp, or in specrun's own Python (a benchmark, not CI).

On generated models small enough that a decode takes about a millisecond on a CPU, as a small
model's does on a GPU, it runs plain decoding, prompt lookup, a draft model (same vocabulary, and
another one, translated), the target drafting for itself, MTP and four batched streams, greedy,
and splits each run's wall time into:
- llama.cpp's part: inside `llama_decode` (`llama_process` for an MTP head) and the calls that
  read what a decode computed (`llama_get_logits*`, the MTP head's hidden rows), which are where
  a GPU decode is waited for;
- specrun's part: everything else, per token, per decode call and per step.
With `--llama-bin DIR` (llama-bench and llama-speculative-simple built from the llama.cpp that
llama-cpp-python vendors, `compare_llama_cpp.build_tools`) each round also runs llama.cpp's own
loop on the same files, prompt, threads and k, interleaved with specrun's.

    python scripts/host_time.py [--models DIR] [--tokens 256] [--rounds 3] [--threads 2] [--llama-bin DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import specrun.backend  # noqa: F401  libllama loads before numpy, as in every entry point

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "tests"))
from tinyhybrid import write_tiny_qwen35  # noqa: E402
from tinymodels import write_tiny_llama  # noqa: E402

from specrun.backend.library import llama, llama_ext  # noqa: E402
from specrun.config import SessionConfig  # noqa: E402
from specrun.core.events import Done, TokenEvent  # noqa: E402
from specrun.session import Session  # noqa: E402

PROMPT = "the cat sat on the mat and the cat sat on the mat , then the dog was there and the cat"
DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
ACCEPTED = re.compile(r"n_accept\s*=\s*(\d+)")
SHAPES = {  # --width: the llamas' shapes; each qwen35 is three quarters as wide
    512: dict(n_embd=512, n_head=8, n_ff=1408),  # 51 MB in f32: more than this CPU's L3, like a real model
    256: dict(n_embd=256, n_head=4, n_ff=704),  # 14 MB: stays in L3, as the host's data does beside a GPU
}


def write_models(folder: Path, width: int) -> dict[str, Path]:
    """The generated models (written once per width): a 4-layer llama, its first layer as a draft
    of the same vocabulary and, relabelled, of another; a qwen35 with one MTP block built to agree
    with its trunk (this shows cost, not a trained head's acceptance)."""
    folder = folder / f"w{width}"
    folder.mkdir(parents=True, exist_ok=True)
    paths = {name: folder / f"{name}.gguf" for name in ("t4", "d1", "d1x", "q35")}
    wide = SHAPES[width] | dict(n_ctx_train=4096, seed=3, endless=True)
    q35 = dict(n_embd=width * 3 // 4, n_ff=width * 2)
    writers = {
        "t4": lambda p: write_tiny_llama(p, n_layer=4, **wide),
        "d1": lambda p: write_tiny_llama(p, n_layer=1, **wide),
        "d1x": lambda p: write_tiny_llama(p, n_layer=1, vocab="different", relabelled=True, **wide),
        "q35": lambda p: write_tiny_qwen35(p, nextn=True, trunk_scale=0.3, mtp_agree=1.0, mtp_scale=0.1, **q35),
    }
    for name, path in paths.items():
        if not path.exists():
            writers[name](path)
    return paths


@dataclass
class LlamaClock:
    """Seconds inside llama.cpp's decode calls and the reads that wait for a decode, counted by
    wrapping those functions of llama-cpp-python's bindings (specrun looks each up per call)."""

    DECODES = ("llama_decode", "llama_process")
    READS = ("llama_get_logits", "llama_get_logits_ith")
    EXT_READS = ("llama_get_embeddings_nextn", "llama_get_embeddings_nextn_ith")
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


def one_stream(session: Session, clock: LlamaClock, tokens: int, plain: bool) -> Split:
    """A generation, timed from its first token (the prefill's) to its end."""
    split, start = Split(), None
    for event in session.stream(PROMPT, tokens, plain=plain):
        if isinstance(event, TokenEvent) and start is None:
            start, (llama_at, decodes_at) = time.perf_counter(), clock.reading()
        if isinstance(event, Done):
            llama_s, decodes = clock.reading()
            split = Split(time.perf_counter() - start, llama_s - llama_at, decodes - decodes_at)
            split.steps, split.tokens, split.accepted = event.stats.steps, event.stats.tokens - 1, event.stats.accepted
    return split


def four_streams(session: Session, clock: LlamaClock, tokens: int, plain: bool) -> Split:
    """Four generations in one batch, timed from the first step (prefills included: short prompts)."""
    batch = session.batch()
    results = []
    for slot in range(session.config.parallel):
        prompt = session.tokenize(f"{slot} {PROMPT}")
        batch.add(session.generator(plain=plain, slot=slot), prompt, tokens, on_done=results.append)
    started, (llama_at, decodes_at) = time.perf_counter(), clock.reading()
    while batch.streams:
        batch.step()
    llama_s, decodes = clock.reading()
    split = Split(time.perf_counter() - started, llama_s - llama_at, decodes - decodes_at, batch.decodes)
    split.tokens, split.accepted = sum(len(r.tokens) for r in results), sum(r.stats.accepted for r in results)
    return split


def configs(models: dict[str, Path], threads: int) -> dict[str, tuple[SessionConfig, bool]]:
    """Each run: its session's set-up, and whether it decodes plainly."""
    base = dict(target=models["t4"], n_ctx=2048, threads=threads)
    return {
        "plain": (SessionConfig(**base), True),
        "lookup k 8": (SessionConfig(**base, lookup=True, k=8), False),
        "draft d1 k 4": (SessionConfig(**base, draft=models["d1"], k=4), False),
        "self-draft k 4": (SessionConfig(**base, draft=models["t4"], k=4), False),
        "translated d1x k 4": (SessionConfig(**base, draft=models["d1x"], k=4), False),
        "mtp k 3": (SessionConfig(target=models["q35"], n_ctx=2048, threads=threads, sources=("mtp",), k=3), False),
        "plain, 4 streams": (SessionConfig(**base | {"n_ctx": 4096}, parallel=4), True),
        "draft d1 k 4, 4 streams": (SessionConfig(**base | {"n_ctx": 4096}, draft=models["d1"], k=4, parallel=4), False),
    }


def llama_cpp_runs(models: dict[str, Path], bin_dir: Path, tokens: int, threads: int) -> dict[str, list[str]]:
    """llama.cpp's own loop for a run of the same name: its command line."""
    common = ["-p", PROMPT, "-n", str(tokens), "-t", str(threads), "-c", "2048", "--temp", "0", "--no-repack"]
    spec = [str(bin_dir / "llama-speculative-simple"), *common, "--spec-draft-n-min", "0", "--spec-draft-p-min", "0"]
    return {
        "plain": [str(bin_dir / "llama-bench"), "-m", str(models["t4"]), "-p", "0", "-n", str(tokens), "-t", str(threads)]
        + ["-r", "3", "-o", "json", "--repack", "0"],
        "draft d1 k 4": [*spec, "-m", str(models["t4"]), "-md", str(models["d1"]), "--spec-type", "draft-simple"]
        + ["--spec-draft-n-max", "4"],
        "self-draft k 4": [*spec, "-m", str(models["t4"]), "-md", str(models["t4"]), "--spec-type", "draft-simple"]
        + ["--spec-draft-n-max", "4"],
        "mtp k 3": [*spec, "-m", str(models["q35"]), "--spec-type", "draft-mtp", "--spec-draft-n-max", "3"],
    }


def llama_cpp_speed(command: list[str]) -> tuple[float, int | None]:
    """Tokens/s of llama.cpp's run (llama-bench's mean, or the speculative loop's decoded tokens),
    and the draft tokens it accepted."""
    out = subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=600)
    if out.returncode != 0:
        sys.exit(f"host_time.py: {Path(command[0]).name} failed ({out.returncode}): {out.stderr.strip()[-400:]}")
    if Path(command[0]).name == "llama-bench":
        return json.loads(out.stdout)[0]["avg_ts"], None
    log = out.stdout + out.stderr
    decoded, accepted = DECODED.search(log), ACCEPTED.search(log)
    assert decoded, log[-2000:]
    return int(decoded[1]) / float(decoded[2]), int(accepted[1]) if accepted else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=Path("/tmp/specrun-host-time"), help="folder of the generated models")
    parser.add_argument("--width", type=int, choices=sorted(SHAPES), default=512, help="the generated llamas' width")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", default="", help="comma-separated names of the runs to do (default: all)")
    parser.add_argument("--llama-bin", type=Path, help="folder with llama-bench and llama-speculative-simple")
    parser.add_argument("--json", type=Path, help="also write every round's figures here")
    args = parser.parse_args()
    models = write_models(args.models, args.width)
    clock = LlamaClock()
    clock.install()
    runs = {name: run for name, run in configs(models, args.threads).items() if not args.runs or name in args.runs.split(",")}
    theirs = llama_cpp_runs(models, args.llama_bin, args.tokens, args.threads) if args.llama_bin else {}
    totals = {name: Split() for name in runs}
    rounds: list[dict] = []
    for round_ in range(args.rounds + 1):  # round 0 warms up (auto's costs, page cache) and is not counted
        for name, (config, plain) in runs.items():
            with Session(config) as session:
                drive = four_streams if config.parallel > 1 else one_stream
                split = drive(session, clock, args.tokens, plain)
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
            rounds.append(figures)
            print(json.dumps(figures), flush=True)
    print_table(totals, rounds)
    if args.json:
        args.json.write_text(json.dumps(rounds, indent=1))


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


if __name__ == "__main__":
    main()
