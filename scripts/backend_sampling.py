"""Greedy tokens read as specrun reads them, or sampled inside llama.cpp's graph (a benchmark, not CI).

specrun takes a verify's argmax from the logits llama.cpp copies out of each decode (numpy, one
call per decode). llama.cpp can instead sample inside the decode's graph (its backend sampling,
experimental): the context gets a greedy sampler chain, and a decode hands back only the token
ids, with no logits row copied out for numpy to scan. On a large vocabulary that row is most of
a decode's host work. This times both, interleaved, on one model: a bare loop of one decode of
`--rows` rows (the last token repeated, as a verify of a draft) and reading every row's token, the
rows dropped again after each decode as a rejected draft's are.

    python scripts/backend_sampling.py MODEL.gguf [--rows 1] [--rounds 10] [--tokens 64] [--threads 2] [--gpu-layers 0]
"""

from __future__ import annotations

import specrun.backend  # noqa: F401  (libllama loads before numpy: backend.library.load_before_numpy)

# isort: split

import argparse
import ctypes
import statistics
import time

import numpy as np

from specrun.backend.library import llama

PROMPT_TOKENS = list(range(2, 30))


class Loop:
    """One llama.cpp context over the model, reading greedy tokens one way."""

    def __init__(self, model, args: argparse.Namespace, in_graph: bool):
        L = self.L = llama()
        self.rows, self.in_graph = args.rows, in_graph
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
        params = L.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch = 4096, 512, 512
        params.n_threads = params.n_threads_batch = args.threads
        params.no_perf = True
        if in_graph:
            self.chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
            L.llama_sampler_chain_add(self.chain, L.llama_sampler_init_greedy())
            self.config = (L.llama_sampler_seq_config * 1)()
            self.config[0].seq_id, self.config[0].sampler = 0, ctypes.cast(self.chain, ctypes.c_void_p)
            params.samplers, params.n_samplers = self.config, 1
            params.n_outputs_max_per_seq = args.rows
        self.ctx = L.llama_init_from_model(model, params)
        self.batch = L.llama_batch_init(512, 0, 1)

    def _decode(self, tokens: list[int], start: int, rows: int) -> None:
        batch = self.batch
        for i, token in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, start + i, 1, i >= len(tokens) - rows
            batch.seq_id[i][0] = 0
        batch.n_tokens = len(tokens)
        if self.L.llama_decode(self.ctx, batch) != 0:
            raise SystemExit(f"backend_sampling: llama_decode failed ({'in the graph' if self.in_graph else 'logits'})")

    def _tokens(self) -> list[int]:
        L = self.L
        if self.in_graph:
            return [L.llama_get_sampled_token_ith(self.ctx, i) for i in range(self.rows)]
        logits = np.ctypeslib.as_array(L.llama_get_logits(self.ctx), shape=(self.rows, self.n_vocab))
        return logits.argmax(axis=1).tolist()

    def seconds_per_decode(self, decodes: int) -> float:
        L = self.L
        memory = L.llama_get_memory(self.ctx)
        L.llama_memory_clear(memory, True)
        self._decode(PROMPT_TOKENS, 0, 1)
        position, token = len(PROMPT_TOKENS), 5
        started = time.perf_counter()
        for _ in range(decodes):
            self._decode([token] * self.rows, position, self.rows)
            token = self._tokens()[-1]
            L.llama_memory_seq_rm(memory, 0, position + 1, -1)  # keep one row, as after a rejected draft
            position += 1
        return (time.perf_counter() - started) / decodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--rows", type=int, default=1, help="rows per decode, each read for its token")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=64, help="decodes per loop and round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--gpu-layers", type=int, default=0)
    args = parser.parse_args()
    L = llama()
    model_params = L.llama_model_default_params()
    model_params.n_gpu_layers = args.gpu_layers
    model = L.llama_model_load_from_file(args.model.encode(), model_params)
    if not model:
        raise SystemExit(f"backend_sampling: llama.cpp could not load {args.model}")
    loops = {"logits + numpy argmax": Loop(model, args, False), "sampled in the graph": Loop(model, args, True)}
    for loop in loops.values():
        loop.seconds_per_decode(4)  # warm-up: graphs reserved, caches touched
    times: dict[str, list[float]] = {name: [] for name in loops}
    for _ in range(args.rounds):
        for name, loop in loops.items():
            times[name].append(loop.seconds_per_decode(args.tokens))
    (a, first), (b, second) = times.items()
    ratio = statistics.median(x / y for x, y in zip(first, second))
    print(
        f"{args.model}: vocabulary {loops[a].n_vocab}, {args.rows} rows a decode, {args.threads} threads, {args.gpu_layers} GPU layers"
    )
    for name, values in times.items():
        print(f"| {name} | {1000 * statistics.median(values):.3f} ms a decode (median of {args.rounds}) |")
    print(f"{a} / {b}, median per round: {ratio:.3f}")


if __name__ == "__main__":
    main()
