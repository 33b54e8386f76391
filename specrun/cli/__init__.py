"""Command-line interface: thin commands over the specrun library."""

from __future__ import annotations

import sys

import specrun.backend  # noqa: F401  (libllama loads before anything imports numpy: backend.library.load_before_numpy)
from specrun.cli.commands import run_app  # the commands register on the app when run_app starts


def main() -> None:
    sys.exit(run_app())
