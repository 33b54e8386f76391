"""CPU threads that outlive a decode: one pool for the llama.cpp contexts that take turns.

A context without a thread pool of its own has ggml start one for every graph it computes and
join it after: every decode starts and stops n_threads - 1 threads, also where a GPU holds every
layer and the CPU computes only the input rows. llama.cpp's own tools attach a pool to their
context (common's `common_threadpools`, llama-bench) whose threads wait for the next graph by
polling a while before they sleep. specrun attaches one too, and one pool to all the contexts
whose decodes never overlap (a session's target, draft model and MTP head, which decode in turn
on one thread): a second polling pool would spin while the first computes, on the same cores.
"""

from __future__ import annotations

import ctypes
import os

from specrun.backend.library import ThreadPoolParams, ggml, thread_pool_calls


class ThreadPool:
    """ggml CPU threads of llama.cpp's default polling, made when the first context attaches and
    stopped when the last one lets go. Where the CPU backend offers no pools it holds none, and
    the contexts go on with ggml's pool per graph."""

    def __init__(self, n_threads: int = 0):
        self.n_threads = n_threads or os.cpu_count() or 1  # 0 means every core
        self.handle = None
        self.params = ThreadPoolParams()
        self.users = 0

    def attach(self, context_handle) -> None:
        """Decode `context_handle`'s graphs on these threads; `release` once llama.cpp freed it."""
        calls = thread_pool_calls()
        if calls is not None and self.handle is None:
            ggml().ggml_threadpool_params_init(ctypes.byref(self.params), self.n_threads)
            self.handle = calls.new(ctypes.byref(self.params))
        if self.handle:
            calls.attach(context_handle, self.handle, None)
        self.users += 1

    def release(self) -> None:
        """A context let go (freed, or lost with its RPC server, never to decode again): the last stops the threads."""
        self.users -= 1
        if self.users == 0 and self.handle:
            handle, self.handle = self.handle, None
            thread_pool_calls().free(handle)
