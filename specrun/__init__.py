"""specrun: exact speculative generation on llama.cpp's token API.

The public Python API is what this package exports (docs/python-api.md):

    import specrun

    with specrun.load(lookup=True) as session:  # the embedded Gemma 3 270M, prompt lookup
        print(session.generate("The capital of France is", max_tokens=16).text)

Importing specrun is cheap: llama.cpp and the models load when a name that needs them is
first used. Every other module (specrun.core, specrun.drafts, specrun.backend, ...) is
internal and may change between releases.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from specrun.errors import IncompatibleError, RpcLost, RpcTimeout, SpecrunError
from specrun.settings import SettingError

__version__ = "0.1.0"

# Public name -> the module that defines it, imported on first use.
_LAZY = {
    "load": "specrun.api",
    "resolve": "specrun.api",
    "Chat": "specrun.api",
    "Session": "specrun.session",
    "SessionConfig": "specrun.config",
    "Generation": "specrun.core.events",
    "SamplerSettings": "specrun.core.sampling",
    "TokenEvent": "specrun.core.events",
    "StepEvent": "specrun.core.events",
    "Done": "specrun.core.events",
    "Stats": "specrun.core.events",
    "Reply": "specrun.chat.reply",
    "Grammar": "specrun.grammar.schemas",
    "SchemaError": "specrun.grammar.schemas",
    "grammar_from_json_schema": "specrun.grammar.schemas",
    "grammar_from_gbnf": "specrun.grammar.schemas",
    "json_object_grammar": "specrun.grammar.schemas",
}

__all__ = ["IncompatibleError", "RpcLost", "RpcTimeout", "SettingError", "SpecrunError", "__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'specrun' has no attribute {name!r}")
    import_module("specrun.backend")  # libllama loads before the module imports numpy (backend.library.load_before_numpy)
    value = getattr(import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
