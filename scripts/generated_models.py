"""The generated models scripts/host_time.py and scripts/gpu_check.sh time (random weights, real
shapes), written with tests/tinymodels.py and tests/tinyhybrid.py; nothing here loads llama.cpp, so
they can be written while it builds.

    python scripts/generated_models.py DIR [cpu|cpu-small|gpu]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from tinydrafters import write_tiny_dflash, write_tiny_eagle3  # noqa: E402
from tinyhybrid import write_tiny_qwen35  # noqa: E402
from tinymodels import write_tiny_llama  # noqa: E402

SIZES = {  # --size: the llama target's and draft's layers and shapes, and the qwen35's
    # 4 x 512 in f32, 51 MB: more than this CPU's L3 holds, so each decode leaves the caches cold
    "cpu": (4, 1, dict(n_embd=512, n_head=8, n_ff=1408), dict(n_embd=384, n_ff=1024)),
    # 4 x 256, 14 MB: stays in L3, as the host's own data does beside a GPU
    "cpu-small": (4, 1, dict(n_embd=256, n_head=4, n_ff=704), dict(n_embd=192, n_ff=512)),
    # shared/notes/gpu.md's l16 / l2 (0.8B, f32) and Qwen3.5-0.8B's shapes in Q8_0: a GPU decode of 1-3 ms
    "gpu": (16, 2, dict(n_embd=2048, n_head=16, n_ff=5632), dict(shapes="qwen3.5-0.8b", wtype="q8_0")),
}


def write_models(folder: Path, size: str) -> dict[str, Path]:
    """The generated models (written once per size): a llama target, its first layers as a draft
    of the same vocabulary and, relabelled, of another; a qwen35 with one MTP block built to agree
    with its trunk (this shows cost, not a trained head's acceptance); an EAGLE-3 and a DFlash
    drafter of the llama's shapes, random (cost only: they are seldom right)."""
    folder = folder / size
    folder.mkdir(parents=True, exist_ok=True)
    paths = {name: folder / f"{name}.gguf" for name in ("target", "draft", "translated", "q35", "eagle3", "dflash")}
    target_layers, draft_layers, llama_shape, q35_shape = SIZES[size]
    shape = llama_shape | dict(n_ctx_train=4096, seed=3, endless=True)
    drafter_shape = dict(
        target_n_embd=shape["n_embd"], target_n_layer=target_layers, n_head=shape["n_head"], n_ff=shape["n_ff"], seed=3
    )
    writers = {
        "target": lambda p: write_tiny_llama(p, n_layer=target_layers, **shape),
        "draft": lambda p: write_tiny_llama(p, n_layer=draft_layers, **shape),
        "translated": lambda p: write_tiny_llama(p, n_layer=draft_layers, vocab="different", relabelled=True, **shape),
        "q35": lambda p: write_tiny_qwen35(p, nextn=True, trunk_scale=0.3, mtp_agree=1.0, mtp_scale=0.1, **q35_shape),
        "eagle3": lambda p: write_tiny_eagle3(p, **drafter_shape),
        "dflash": lambda p: write_tiny_dflash(p, **drafter_shape),
    }
    for name, path in paths.items():
        if not path.exists():
            writers[name](path)
    return paths


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="where the models go (in a folder named after the size)")
    parser.add_argument("size", nargs="?", choices=sorted(SIZES), default="cpu")
    args = parser.parse_args()
    for name, path in write_models(args.folder, args.size).items():
        print(f"{name}: {path}")
