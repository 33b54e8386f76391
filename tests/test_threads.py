"""Every llama.cpp context specrun makes runs on CPU threads of its own, made once, as llama.cpp's
tools attach them: without, ggml starts and joins a thread pool on every decode."""

from specrun.backend import Context, ContextOptions, Model

LLAMA_CPP_DEFAULT_POLL = 50  # ggml_threadpool_params_default: what llama-bench and the server run with


def test_a_context_decodes_on_a_thread_pool_of_its_own(tiny):
    model = Model(tiny["target"])
    first, second = (Context(model, ContextOptions(n_ctx=64, n_threads=n)) for n in (2, 3))
    assert first.threads.handle and second.threads.handle and first.threads.handle != second.threads.handle
    # Read back from the struct ggml filled in: the layout specrun declares is ggml's.
    assert (first.threads.params.n_threads, second.threads.params.n_threads) == (2, 3)
    assert first.threads.params.poll == LLAMA_CPP_DEFAULT_POLL and not first.threads.params.paused
    first.eval(model.tokenize("the cat sat"))
    assert first.tokens
    model.close()  # closes the contexts, then their threads
    assert first.threads.handle is None and second.threads.handle is None


def test_the_sequences_of_one_cache_share_its_threads(tiny):
    model = Model(tiny["target"])
    cache = Context(model, ContextOptions(n_ctx=128, n_threads=2, sequences=2))
    assert cache.sequence(1).threads is cache.threads
    cache.close()
    cache.close()  # twice is fine: the threads are stopped once
    assert cache.threads.handle is None
    model.close()
