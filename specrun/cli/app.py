"""The Typer app every command module registers on, and the error boundary."""

from __future__ import annotations

import os
import sys

import typer
from rich.console import Console

from specrun.errors import SpecrunError

app = typer.Typer(
    name="specrun",
    help="Exact speculative generation on llama.cpp: a small draft guesses, the target checks.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Results go to stdout, everything else (progress, stats, errors) to stderr.
err_console = Console(stderr=True)


def run_app(argv: list[str] | None = None) -> int:
    """Run the CLI; user errors become one line on stderr and a non-zero exit."""
    try:
        # Without standalone mode click returns a typer.Exit's code instead of raising it.
        result = app(args=argv, standalone_mode=False)
    except SpecrunError as exc:
        if os.environ.get("SPECRUN_DEBUG"):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        print("aborted", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # click usage errors carry their own exit code
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            return exc.exit_code
        raise
    return result if isinstance(result, int) else 0
