"""Plain decoding beside llama-bench, layer by layer (a benchmark, not CI).

Where a Python loop's time goes when a decode takes a fraction of a millisecond, as a small
model's does on a GPU. Each round runs, interleaved, on the same generated target, threads and
depth (the prompt's tokens before the first timed one), greedy, N tokens after the prompt:
- llama-bench tg N at that depth (`-d`), repacking off: llama.cpp's own loop in C++;
- a bare loop of llama.cpp calls on a specrun context: a one-token batch (`llama_batch_get_one`,
  as llama-bench's), `llama_decode` and `llama_synchronize`, nothing read (`bare`); then the
  same reading the last row's logits and taking their argmax (`bare + argmax`);
- `Context.eval` and the argmax: specrun's backend;
- the decode and the argmax in C (a few lines compiled with the system's `cc` at run time, handed
  llama.cpp's function pointers): called once a token, as a C extension would be in specrun's
  place (`C, a call a token`), and once for all the tokens (`C, one call`): what compiled code
  could save, measured instead of guessed;
- `Session.stream(plain=True)`: a whole generation, as `specrun generate` runs it.
Each is printed as a ratio to llama-bench's tokens/s in the same round, then the medians; last,
the generation's own time per token two ways: with `llama_decode` a no-op (warm caches, before
the rounds), and between real decodes (each round, after the others), which leave the CPU's
caches holding the model's weights instead of the loop's code and objects.

    python scripts/plain_floor.py --llama-bin BIN [--size cpu-small] [--threads 2] [--rounds 8] [--tokens 256]
"""

from __future__ import annotations

import specrun.backend  # noqa: F401  (libllama loads before numpy: backend.library.load_before_numpy)

# isort: split

import argparse
import ctypes
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
from generated_models import SIZES, write_models
from host_time import PROMPT, llama_decode_as, skip_decode

from specrun.backend import Context, ContextOptions
from specrun.backend.library import llama
from specrun.config import SessionConfig
from specrun.session import Session
from specrun.settings import BATCH


def llama_bench(bin_dir: Path, model: Path, tokens: int, depth: int, threads: int) -> float:
    command = [str(bin_dir / "llama-bench"), "-m", str(model), "-p", "0", "-n", str(tokens), "-d", str(depth)]
    command += ["-t", str(threads), "-r", "3", "-o", "json", "--repack", "0", "-ngl", "99"]
    out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=600)
    return json.loads(out.stdout)[0]["avg_ts"]


# llama_batch as llama.h declares it; a one-token batch as llama_batch_get_one makes it.
C_LOOP = r"""
#include <stdint.h>
typedef struct { int32_t n_tokens; int32_t *token; float *embd; int32_t *pos; int32_t *n_seq_id;
                 int32_t **seq_id; int8_t *logits; } llama_batch;
typedef int32_t (*decode_fn)(void *ctx, llama_batch batch);
typedef float *(*logits_fn)(void *ctx, int32_t i);

int32_t next_token(decode_fn decode, logits_fn logits, void *ctx, int32_t token, int32_t n_vocab) {
    llama_batch batch = {1, &token, 0, 0, 0, 0, 0};
    if (decode(ctx, batch) != 0) return -1;
    const float *row = logits(ctx, -1);
    int32_t best = 0;
    for (int32_t i = 1; i < n_vocab; i++) if (row[i] > row[best]) best = i;  /* the first maximum, as np.argmax */
    return best;
}

int32_t next_tokens(decode_fn decode, logits_fn logits, void *ctx, int32_t token, int32_t n_vocab, int32_t n) {
    for (int32_t i = 0; i < n && token >= 0; i++) token = next_token(decode, logits, ctx, token, n_vocab);
    return token;
}
"""


def compiled_loop() -> ctypes.CDLL | None:
    """C_LOOP built with the system's `cc` (None, and a line saying so, where that fails)."""
    with tempfile.TemporaryDirectory(prefix="plain-floor-") as folder:  # a loaded library outlives its file
        source, library = Path(folder) / "loop.c", Path(folder) / "loop.so"
        source.write_text(C_LOOP)
        try:
            built = subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(library), str(source)], capture_output=True)
        except OSError as exc:  # no cc at all
            print(f"no C rows: cc could not run: {exc}")
            return None
        if built.returncode:
            print(f"no C rows: cc failed: {built.stderr.decode()[-300:]}")
            return None
        lib = ctypes.CDLL(str(library))
    for name, extra in (("next_token", []), ("next_tokens", [ctypes.c_int32])):
        getattr(lib, name).argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int32, ctypes.c_int32] + extra
        getattr(lib, name).restype = ctypes.c_int32
    return lib


def fresh_context(session: Session) -> Context:
    c = session.config
    options = ContextOptions(n_ctx=c.n_ctx, n_batch=BATCH, n_ubatch=c.n_ubatch, n_threads=c.threads, flash_attn=c.flash_attn)
    return Context(session.target_model, options)


def c_loop(session: Session, prompt: list[int], tokens: int, lib: ctypes.CDLL, one_call: bool) -> float:
    """Tokens/s of the decode and argmax in C, called once a token or once for all, on a fresh context."""
    L, n_vocab = llama(), session.target_model.n_vocab
    pointers = [ctypes.cast(f, ctypes.c_void_p) for f in (L.llama_decode, L.llama_get_logits_ith)]
    context = fresh_context(session)
    try:
        token, handle = int(np.argmax(context.eval(prompt, 1)[-1])), context.handle
        started = time.perf_counter()
        if one_call:
            token = lib.next_tokens(*pointers, handle, token, n_vocab, tokens)
        else:
            for _ in range(tokens):
                token = lib.next_token(*pointers, handle, token, n_vocab)
        speed = tokens / (time.perf_counter() - started)
        assert token >= 0, "a decode failed"
        return speed
    finally:
        context.close()


def bare_loop(session: Session, prompt: list[int], tokens: int, read: bool) -> float:
    """Tokens/s of llama.cpp calls alone, on a fresh context made as specrun makes its target's."""
    L, model = llama(), session.target_model
    context = fresh_context(session)
    try:
        token = (ctypes.c_int32 * 1)(int(np.argmax(context.eval(prompt, 1)[-1])))
        handle = context.handle
        views: dict[int, np.ndarray] = {}
        started = time.perf_counter()
        for _ in range(tokens):
            L.llama_decode(handle, L.llama_batch_get_one(token, 1))
            if not read:
                L.llama_synchronize(handle)
                continue
            pointer = L.llama_get_logits_ith(handle, -1)
            view = views.get(address := ctypes.addressof(pointer.contents))
            if view is None:
                view = views[address] = np.ctypeslib.as_array(pointer, shape=(model.n_vocab,))
            token[0] = int(np.argmax(view))
        return tokens / (time.perf_counter() - started)
    finally:
        context.close()


def eval_loop(session: Session, prompt: list[int], tokens: int) -> float:
    context = session.target
    context.truncate(0)
    token = int(np.argmax(context.eval(prompt, 1)[-1]))
    started = time.perf_counter()
    for _ in range(tokens):
        token = int(np.argmax(context.eval([token], 1)[-1]))
    speed = tokens / (time.perf_counter() - started)
    context.truncate(0)
    return speed


def generation(session: Session, prompt: list[int], tokens: int) -> float:
    """Timed from the first token (the prefill's) to the end, as host_time.py times it."""
    started = None
    for _ in session.stream(prompt, tokens + 1, plain=True):
        started = started or time.perf_counter()
    assert started is not None
    return tokens / (time.perf_counter() - started)


def loop_alone(session: Session, prompt: list[int], tokens: int) -> float:
    """Seconds a token of a plain generation with `llama_decode` a no-op: the loop's own time
    with warm caches (each token reads the logits of the last real decode)."""
    generation(session, prompt, 1)  # a real decode, whose logits every no-op leaves in place
    try:
        with llama_decode_as(skip_decode):
            started = time.perf_counter()
            for _ in session.stream(prompt, tokens, plain=True):
                pass
            return (time.perf_counter() - started) / tokens
    finally:
        session.target.truncate(0)  # the cache holds none of what the no-ops "decoded"


def loop_between_decodes(session: Session, prompt: list[int], tokens: int) -> float:
    """Seconds a token of a plain generation spends outside `llama_decode`, behind real decodes:
    the median gap from one decode's return to the next decode's call."""
    decode, returns, gaps = llama().llama_decode, [0.0], []

    def timed(context, batch):
        gaps.append(time.perf_counter() - returns[0])
        status = decode(context, batch)
        returns[0] = time.perf_counter()
        return status

    with llama_decode_as(timed):
        generation(session, prompt, tokens)
    return statistics.median(gaps[2:])  # from the second step on: the prefill's decode is no step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=Path("/tmp/specrun-host-time"), help="folder of the generated models")
    parser.add_argument("--size", choices=sorted(SIZES), default="cpu-small", help="the generated models' size")
    parser.add_argument("--llama-bin", type=Path, required=True, help="folder with llama-bench")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=256)
    args = parser.parse_args()
    model = write_models(args.models, args.size)["target"]
    with Session(SessionConfig(target=model, n_ctx=2048, threads=args.threads)) as session:
        prompt = session.tokenize(PROMPT)
        alone = min(loop_alone(session, prompt, 1000) for _ in range(5))
        runs = {
            "bare": lambda: bare_loop(session, prompt, args.tokens, read=False),
            "bare + argmax": lambda: bare_loop(session, prompt, args.tokens, read=True),
            "Context.eval": lambda: eval_loop(session, prompt, args.tokens),
            "generation": lambda: generation(session, prompt, args.tokens),
        }
        if lib := compiled_loop():
            runs["C, a call a token"] = lambda: c_loop(session, prompt, args.tokens, lib, one_call=False)
            runs["C, one call"] = lambda: c_loop(session, prompt, args.tokens, lib, one_call=True)
        ratios: dict[str, list[float]] = {name: [] for name in runs}
        between: list[float] = []
        for round_ in range(args.rounds):
            theirs = llama_bench(args.llama_bin, model, args.tokens, len(prompt), args.threads)
            for name, run in runs.items():
                ratios[name].append(run() / theirs)
            between.append(loop_between_decodes(session, prompt, args.tokens))
            print(
                f"round {round_ + 1}: llama-bench {theirs:.0f} tok/s; " + ", ".join(f"{n} {r[-1]:.3f}" for n, r in ratios.items())
            )
    print(
        f"{args.size}, depth {len(prompt)}, {args.tokens} tokens, {args.threads} threads: median / min / max of each against llama-bench"
    )
    for name, values in ratios.items():
        print(f"| {name} | {statistics.median(values):.3f} | {min(values):.3f} | {max(values):.3f} |")
    print(f"a generation's own time, llama_decode a no-op (best of 5): {1000 * alone:.4f} ms a token")
    print(f"a generation's own time between real decodes (median of rounds): {1000 * statistics.median(between):.4f} ms a token")


if __name__ == "__main__":
    main()
