"""CPU threads that live as long as a llama.cpp context.

A context without a thread pool of its own has ggml start one for every graph it computes and
join it after: every decode starts and stops n_threads - 1 threads, also where a GPU holds every
layer and the CPU computes only the input rows. llama.cpp's own tools attach a pool to their
context (common's `common_threadpools`, llama-bench) whose threads wait for the next graph by
polling a while before they sleep; specrun does the same for every context it makes.
"""

from __future__ import annotations

import ctypes

from specrun.backend.library import ThreadPoolParams, ggml, thread_pool_calls


class ThreadPool:
    """A ggml CPU thread pool attached to one llama.cpp context, with llama.cpp's default
    polling; `free` it after the context. Where the CPU backend offers no pools it holds none,
    and the context goes on with ggml's pool per graph."""

    def __init__(self, context_handle, n_threads: int):
        self.handle = None
        self.params = ThreadPoolParams()
        calls = thread_pool_calls()
        if calls is None:
            return
        ggml().ggml_threadpool_params_init(ctypes.byref(self.params), n_threads)
        self.handle = calls.new(ctypes.byref(self.params))
        if self.handle:
            calls.attach(context_handle, self.handle, None)
            self._free = calls.free

    def free(self) -> None:
        """Stop the threads; the context they were attached to must be freed already."""
        if self.handle:
            handle, self.handle = self.handle, None
            self._free(handle)
