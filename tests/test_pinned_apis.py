"""The private corners of libraries specrun reaches into, pinned: an upgrade that moves them fails here.

- gguf: PlainArrayReader overrides GGUFReader._get_field_parts for speed (test_pair_check
  compares its fields with the stock reader's, part for part);
- llama-cpp-python: the names of its chat formats and their formatters are read from
  its handler registry, which has no public listing;
- llama-cpp-python's raw API: every call the specrun.backend package makes;
- llama.cpp's thread pools: `llama_attach_threadpool`, which llama-cpp-python does not bind, from
  the libllama it loaded, and ggml's pool calls from the CPU backend's registry.
"""

import importlib
import inspect
import pkgutil
import re

import llama_cpp
import pytest

from specrun import backend
from specrun.backend import library
from specrun.chat.formats import registered_formats
from specrun.headers import read as header

# Formats llama-cpp-python 0.3.36 registers that render plain text; users pass these names.
KNOWN_FORMATS = {"chatml", "gemma", "llama-2", "llama-3", "mistral-instruct", "qwen", "vicuna", "zephyr", "alpaca"}


def test_the_fast_gguf_field_parsing_still_applies():
    assert header.FAST_FIELD_PARSING, "gguf changed GGUFReader._get_field_parts: PlainArrayReader fell back to the slow path"


def test_the_chat_format_registry_still_yields_formatters():
    formats = registered_formats()
    assert KNOWN_FORMATS <= set(formats)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    for name in KNOWN_FORMATS:
        result = formats[name](messages=messages)
        assert "Name a colour." in result.prompt, name


def test_every_raw_call_the_backend_makes_exists():
    missing = [name for name in backend.RAW_API if not hasattr(llama_cpp, name)]
    assert missing == []
    from llama_cpp import llama_cpp_ext  # the staging calls MTP drafts need

    assert [name for name in library.EXT_API if not hasattr(llama_cpp_ext, name)] == []
    modules = [importlib.import_module(f"specrun.backend.{m.name}") for m in pkgutil.iter_modules(backend.__path__)]
    called = {name for module in modules for name in re.findall(r"\bL\.((?:llama|LLAMA)_\w+)", inspect.getsource(module))}
    assert called <= set(backend.RAW_API), f"add to RAW_API: {called - set(backend.RAW_API)}"
    staged = {name for module in modules for name in re.findall(r"(?:LX|llama_ext\(\))\.(llama_\w+)", inspect.getsource(module))}
    assert staged <= set(library.EXT_API), f"add to EXT_API: {staged - set(library.EXT_API)}"


def test_the_drafter_calls_are_found_by_their_cpp_names():
    """llama-cpp-python binds none of them: a llama.cpp that renames one fails here, not in a user's run."""
    calls = library.drafter_calls()
    assert all(callable(getattr(calls, name)) for name in library.DRAFTER_API)


def test_the_thread_pool_calls_are_found():
    assert library.thread_pool_calls() is not None


@pytest.mark.parametrize("version, too_old", [("0.3.36", False), ("0.3.40", False), ("0.3.9", True), ("0.2.90", True)])
def test_the_version_floor(version, too_old):
    assert library.older_than_supported(version) is too_old
