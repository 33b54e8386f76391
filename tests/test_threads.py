"""The llama.cpp contexts specrun makes decode on CPU threads that outlive a decode, as llama.cpp's
tools attach them (without, ggml starts and joins a pool on every decode); the contexts of one
session take turns on one pool, so no second pool polls while the first computes."""

from specrun import load
from specrun.backend import Context, ContextOptions, Model, ThreadPool
from specrun.errors import RpcLost

LLAMA_CPP_DEFAULT_POLL = 50  # ggml_threadpool_params_default: what llama-bench and the server run with


def test_a_context_alone_decodes_on_a_thread_pool_of_its_own(tiny):
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


def test_contexts_that_take_turns_share_one_pool_until_the_last_closes(tiny):
    target, draft = Model(tiny["target"]), Model(tiny["draft"])
    threads = ThreadPool(2)
    big, small = Context(target, ContextOptions(n_ctx=64), threads), Context(draft, ContextOptions(n_ctx=64), threads)
    assert big.threads is small.threads and threads.handle and threads.users == 2 and big.n_threads == 2
    for context in (big, small, big):
        context.eval(context.model.tokenize("the cat sat"))
    target.close()
    assert threads.handle and threads.users == 1  # the draft still decodes on it
    small.eval(draft.tokenize(" on the mat"))
    draft.close()
    assert threads.handle is None and threads.users == 0


def test_a_sessions_target_and_draft_decode_on_one_pool(tiny):
    with load(tiny["target"], draft=tiny["draft"], threads=2, n_ctx=256) as session:
        session.generate("the cat sat", max_tokens=8)
        threads = session.resources.threads
        assert threads.handle and threads.users == 2 and session.target.threads is threads
    assert threads.handle is None


def test_the_sequences_of_one_cache_share_its_threads(tiny):
    model = Model(tiny["target"])
    cache = Context(model, ContextOptions(n_ctx=128, n_threads=2, sequences=2))
    assert cache.sequence(1).threads is cache.threads
    cache.close()
    cache.close()  # twice is fine: the threads are stopped once
    assert cache.threads.handle is None and cache.threads.users == 0
    model.close()


def test_a_context_lost_with_its_rpc_server_still_stops_its_threads(tiny, monkeypatch):
    """llama.cpp cannot free a context whose RPC server is lost (a parked thread may be inside it),
    but the CPU threads, idle between graphs, stop all the same."""
    model = Model(tiny["target"])
    context = Context(model, ContextOptions(n_ctx=64, n_threads=2))
    context.eval(model.tokenize("the cat sat"))

    def lost(*args, **kwargs):
        raise RpcLost("lost RPC server 127.0.0.1:1: gone")

    monkeypatch.setattr(model, "_call_llama", lost)
    context.close()
    assert context.closed and context.threads.handle is None
