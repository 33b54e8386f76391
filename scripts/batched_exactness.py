"""Does any setting make batched verification give the logits of one-token decoding?

For each setting (flash attention auto/on/off, CPU weight repacking off/on, micro-batch
size n_ubatch), the same history is decoded two ways from the same cache: the k+1
tokens of a verify step in one batch, and one token at a time, as plain decoding does.
Reported per setting: the largest |logit difference| over all rows, the share of rows
whose greedy argmax differs, and the decode times (one-token ms per token, verify ms per
batch of k+1). The cache before each step is built by one-token decoding, as plain
decoding builds it, so only the batching differs.

A llama.cpp build without llamafile's sgemm (cmake -DGGML_LLAMAFILE=OFF) can be tried by
pointing LLAMA_CPP_LIB_PATH at its lib folder; the library used is printed.

Speed figures need an idle machine: the exactness columns do not depend on load.

    python scripts/batched_exactness.py                       # Gemma 3 270M, k = 4
    python scripts/batched_exactness.py --model M.gguf --k 8 --tokens 96 --ubatch 0,1,4 --json out.json
"""

from __future__ import annotations

import specrun.backend  # noqa: F401  (libllama loads before numpy: backend.library.load_before_numpy)

# isort: split

import argparse
import itertools
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specrun.backend import Context, ContextOptions, Model, ModelOptions, llama_cpp_version  # noqa: E402
from specrun.errors import SpecrunError  # noqa: E402

PROMPT = (
    "The history of the city begins with a small settlement on the river. Over the centuries it grew into "
    "a market town, then a port, and finally the capital of the region. Its people"
)
FLASH = {-1: "auto", 0: "off", 1: "on"}


@dataclass
class Row:
    flash_attn: str
    repack: bool
    n_ubatch: int
    rows: int  # logits rows compared
    max_abs_diff: float
    argmax_differs: float  # share of rows whose greedy token differs
    one_token_ms: float  # per token, one-token decoding
    verify_ms: float  # per batch of k+1 rows


def history(model: Model, prompt: str, n_tokens: int, threads: int) -> list[int]:
    """The prompt and its greedy continuation by one-token decoding (the same for every setting)."""
    context = Context(model, ContextOptions(n_ctx=len(prompt) + n_tokens + 64, n_threads=threads))
    try:
        tokens = model.tokenize(prompt)
        logits = context.eval(tokens)
        for _ in range(n_tokens):
            tokens.append(int(np.argmax(logits[-1])))
            logits = context.eval(tokens[-1:])
        return tokens
    finally:
        context.close()


def compare(
    model: Model, tokens: list[int], n_prompt: int, k: int, options: ContextOptions
) -> tuple[int, float, int, list, list]:
    context = Context(model, options)
    try:
        context.eval(tokens[:n_prompt])
        rows = mismatches = 0
        worst = 0.0
        single_s, batch_s = [], []
        for start in range(n_prompt, len(tokens) - k, k + 1):
            step = tokens[start : start + k + 1]
            began = time.perf_counter()
            batched = np.array(context.eval(step, logits_rows=len(step)))
            batch_s.append(time.perf_counter() - began)
            context.truncate(start)
            one_by_one = []
            for token in step:  # leaves the cache as one-token decoding builds it
                began = time.perf_counter()
                one_by_one.append(np.array(context.eval([token])[-1]))
                single_s.append(time.perf_counter() - began)
            one_by_one = np.array(one_by_one)
            worst = max(worst, float(np.max(np.abs(batched - one_by_one))))
            mismatches += int(np.sum(np.argmax(batched, axis=1) != np.argmax(one_by_one, axis=1)))
            rows += len(step)
        return rows, worst, mismatches, single_s, batch_s
    finally:
        context.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="GGUF (default: the embedded Gemma 3 270M)")
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--tokens", type=int, default=60, help="generated tokens compared after the prompt")
    parser.add_argument("--k", type=int, default=4, help="drafts per verify step (batches of k+1)")
    parser.add_argument("--threads", type=int, default=0, help="0 = all cores")
    parser.add_argument("--n-batch", type=int, default=512, help="n_batch (specrun's sessions use 512)")
    parser.add_argument("--ubatch", default="0,1,2", help="n_ubatch values; 0 = n_batch (specrun's default)")
    parser.add_argument("--repack", default="off,on", help="weight repacking settings to try")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON")
    args = parser.parse_args()
    if args.model is None:
        from specrun.hub.embedded import embedded_model_path

        args.model = embedded_model_path()
    ubatches = [int(value) for value in args.ubatch.split(",")]

    from llama_cpp import __file__ as llama_cpp_file

    library = os.environ.get("LLAMA_CPP_LIB_PATH") or str(Path(llama_cpp_file).parent / "lib")
    print(f"llama-cpp-python {llama_cpp_version()}, libraries from {library}", file=sys.stderr)
    print(f"{args.model.name}: {args.tokens} tokens after the prompt, verify batches of {args.k + 1}", file=sys.stderr)

    results: list[Row] = []
    tokens: list[int] | None = None  # one history for every setting: the first model's greedy continuation
    for repack in (value == "on" for value in args.repack.split(",")):
        model = Model(args.model, ModelOptions(n_gpu_layers=0, repack=repack))
        try:
            tokens = tokens or history(model, args.prompt, args.tokens, args.threads)
            n_prompt = len(model.tokenize(args.prompt))
            for flash, ubatch in itertools.product(FLASH, ubatches):
                options = ContextOptions(
                    n_ctx=len(tokens) + 64,
                    n_batch=max(args.n_batch, args.k + 1),
                    n_ubatch=ubatch,
                    n_threads=args.threads,
                    flash_attn=flash,
                )
                rows, worst, mismatches, single_s, batch_s = compare(model, tokens, n_prompt, args.k, options)
                row = Row(
                    FLASH[flash],
                    repack,
                    ubatch or options.n_batch,
                    rows,
                    worst,
                    mismatches / rows,
                    1000 * float(np.median(single_s)),
                    1000 * float(np.median(batch_s)),
                )
                results.append(row)
                print(
                    f"flash {row.flash_attn:4} repack {str(repack):5} n_ubatch {row.n_ubatch:2}: "
                    f"max |diff| {worst:.3g}, argmax differs {100 * row.argmax_differs:.1f}% of {rows} rows, "
                    f"{row.one_token_ms:.1f} ms/token one by one, {row.verify_ms:.1f} ms per verify of {args.k + 1}"
                )
        finally:
            model.close()
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SpecrunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
