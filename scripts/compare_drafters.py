"""specrun's trained drafters (EAGLE-3, DFlash, DSpark) against llama.cpp's own, draft by draft (a cross-check, not CI).

Writes tiny llama targets and drafters for them (tests/tinydrafters.py): per kind, one drafter
built or tuned to agree with its target often, so that drafts are kept and later calls follow
accepted text, and one of random weights. Builds llama-server from the llama.cpp that the
installed llama-cpp-python vendors and runs both greedily on the same prompt, as compare_mtp.py
does: llama-server with `--spec-type draft-eagle3`, `draft-dflash` or `draft-dspark` (p-min 0, so it drafts k
tokens as specrun's fixed k does) at log verbosity 5, and specrun with `--draft FILE`. Prints,
per drafter and k, how many draft calls each made, how many drafts were identical token for
token, and whether the generated tokens were.

    python scripts/compare_drafters.py [--kinds eagle3,dflash,dspark] [--k 1,2,3,4] [--tokens 64] [--build DIR]
"""

from __future__ import annotations

import specrun.backend  # noqa: F401  (libllama loads before numpy: backend.library.load_before_numpy)

# isort: split

import sys
import tempfile
from pathlib import Path

from compare_llama_cpp import build_tools
from compare_mtp import arguments, compare, llama_drafts, specrun_drafts

from specrun.config import SessionConfig
from specrun.drafts.dflash import DFlashDraft
from specrun.drafts.eagle3 import Eagle3Draft

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from tinydrafters import write_agreeing_eagle3, write_tiny_dflash, write_tiny_eagle3  # noqa: E402
from tinymodels import write_tiny_llama  # noqa: E402


def pairs(kind: str, folder: Path) -> dict[str, tuple[Path, Path]]:
    """The (target, drafter) files of `kind`, by the drafter's name."""
    if kind == "eagle3":
        target = write_tiny_llama(folder / "target.gguf", seed=0, layer_scale=0.4, logit_std=4.5, endless=True)
        return {
            "agreeing": (target, write_agreeing_eagle3(folder / "agreeing.gguf", target_seed=0, logit_std=4.5)),
            "random": (target, write_tiny_eagle3(folder / "random.gguf", seed=1)),
        }
    # A steady target (each row leaning on the same tokens) whose greedy text alternates two
    # tokens: a drafter with quiet layers guesses every other one. DSpark: the same with a Markov head.
    steady = write_tiny_llama(folder / "steady.gguf", seed=0, layer_scale=0.2, logit_std=6.0, endless=True, steady=40)
    markov = kind == "dspark"
    drafters = {
        "quiet": (steady, write_tiny_dflash(folder / f"quiet-{kind}.gguf", seed=1, layer_scale=0.3, markov=markov)),
        "random": (steady, write_tiny_dflash(folder / f"random-{kind}.gguf", seed=2, markov=markov)),
    }
    if markov:  # SpecForge's exports: the block's first row is the anchor's, which does not draft
        path = folder / "unanchored.gguf"
        drafters["unanchored"] = (steady, write_tiny_dflash(path, seed=1, layer_scale=0.3, markov=True, sample_from_anchor=False))
    return drafters


SOURCES = {"eagle3": Eagle3Draft, "dflash": DFlashDraft, "dspark": DFlashDraft}


def main() -> None:
    parser = arguments(__doc__.splitlines()[0])
    parser.add_argument("--kinds", default="eagle3,dflash,dspark")
    args = parser.parse_args()
    bin_dir = build_tools(args.build, ["llama-server"])
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for kind in args.kinds.split(","):
            for name, (target, drafter) in pairs(kind, folder).items():
                print(f"{kind}, {name} drafter:")
                for k in (int(value) for value in args.k.split(",")):
                    spec = ["-m", target, "-md", drafter, "--spec-draft-p-min", "0", "--spec-draft-n-min", "0"]
                    log = folder / f"server-{kind}-{name}-{k}.log"
                    theirs = llama_drafts(bin_dir, spec, k, args.tokens, log, f"draft-{kind}")
                    config = SessionConfig(target=target, draft=drafter, k=k, n_ctx=1024, threads=1)
                    compare(theirs, specrun_drafts(config, SOURCES[kind], args.tokens), k)


if __name__ == "__main__":
    main()
