"""Models from local files, the embedded default, other tools' stores (read-only) or the Hugging Face hub."""

from specrun.hub.memory import MemoryBudget, memory_budget, run_bytes
from specrun.hub.resolve import ResolvedModel, resolve_model, resolve_pair

__all__ = ["MemoryBudget", "ResolvedModel", "memory_budget", "resolve_model", "resolve_pair", "run_bytes"]
