"""Models from local files, the embedded default, other tools' stores (read-only) or the Hugging Face hub."""

from specrun.hub.memory import MemoryBudget, memory_budget, run_bytes
from specrun.hub.resolve import HubLookupError, ModelLocation, ResolvedModel, locate_model, resolve_model, resolve_pair

__all__ = [
    "HubLookupError",
    "MemoryBudget",
    "ModelLocation",
    "ResolvedModel",
    "locate_model",
    "memory_budget",
    "resolve_model",
    "resolve_pair",
    "run_bytes",
]
