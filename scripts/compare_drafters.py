"""specrun's EAGLE-3 drafts against llama.cpp's own draft-eagle3, draft by draft (a cross-check, not CI).

Writes a tiny llama target and two EAGLE-3 drafters for it (tests/tinydrafters.py): one built to
agree with the target often, so that drafts are kept and the later calls follow accepted text,
and one of random weights. Builds llama-server from the llama.cpp that the installed
llama-cpp-python vendors and runs both greedily on the same prompt, as compare_mtp.py does:
llama-server with `--spec-type draft-eagle3` (p-min 0, so it drafts k tokens as specrun's fixed
k does) at log verbosity 5, and specrun with `--draft FILE`. Prints, per drafter and k, how many
draft calls each made, how many drafts were identical token for token, and whether the
generated tokens were.

    python scripts/compare_eagle3.py [--k 1,2,3,4] [--tokens 64] [--build DIR]
"""

from __future__ import annotations

import specrun.backend  # noqa: F401  (libllama loads before numpy: backend.library.load_before_numpy)

# isort: split

import argparse
import sys
import tempfile
from pathlib import Path

from compare_llama_cpp import build_tools
from compare_mtp import compare, llama_drafts, specrun_drafts

from specrun.config import SessionConfig
from specrun.drafts.eagle3 import Eagle3Draft

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from tinydrafters import write_agreeing_eagle3, write_tiny_eagle3  # noqa: E402
from tinymodels import write_tiny_llama  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", default="1,2,3,4")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--build", type=Path, default=Path(tempfile.gettempdir()) / "llama-tools")
    args = parser.parse_args()
    bin_dir = build_tools(args.build, ["llama-server"])
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        target = write_tiny_llama(folder / "target.gguf", seed=0, layer_scale=0.4, logit_std=4.5, endless=True)
        drafters = {
            "agreeing": write_agreeing_eagle3(folder / "agreeing.gguf", target_seed=0, logit_std=4.5),
            "random": write_tiny_eagle3(folder / "random.gguf", seed=1),
        }
        for name, drafter in drafters.items():
            print(f"{name} drafter:")
            for k in (int(value) for value in args.k.split(",")):
                spec = ["-m", target, "-md", drafter, "--spec-draft-p-min", "0", "--spec-draft-n-min", "0"]
                theirs = llama_drafts(bin_dir, spec, k, args.tokens, folder / f"server-{name}-{k}.log", "draft-eagle3")
                config = SessionConfig(target=target, draft=drafter, k=k, n_ctx=1024, threads=1)
                compare(theirs, specrun_drafts(config, Eagle3Draft, args.tokens), k)


if __name__ == "__main__":
    main()
