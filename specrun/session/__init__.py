"""A loaded target and its draft sources, shared by the commands and the Python API: `Session`
(session.py), with what it loads (resources.py), each stream's sources (drafters.py), its
policies and verify costs (policies.py, cost_cache.py) and the scheduler of its streams (slots.py)."""

from specrun.session.session import Session

__all__ = ["Session"]
