"""Command-line interface: thin commands over the specrun library."""

from __future__ import annotations

import sys

from specrun.cli.app import app, run_app

# Each module registers its commands on `app` when imported.
from specrun.cli import bench, chat, doctor, generate  # noqa: E402,F401
from specrun.cli import models, pull  # noqa: E402,F401
from specrun.cli import pair  # noqa: E402,F401
from specrun.cli import serve  # noqa: E402,F401


def main() -> None:
    sys.exit(run_app())
