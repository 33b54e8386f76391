"""Command-line interface: thin commands over the specrun library."""

from __future__ import annotations

import sys

import specrun.backend  # noqa: F401  (libllama loads before anything imports numpy: backend.library.load_before_numpy)
from specrun.cli.app import app, run_app  # noqa: F401  (commands register on `app` when run_app starts)


def main() -> None:
    sys.exit(run_app())
