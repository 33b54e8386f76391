"""The CLI's run: registers every command module on the app, then runs it inside the error
boundary. Apart from app.py so that the command modules, which import the app, are not
imported back by it."""

from __future__ import annotations

import os
import sys

import typer

from specrun.cli.app import app, is_click_error, one_line
from specrun.errors import SpecrunError

INTERRUPTED = 130  # 128 + SIGINT, as shells report Ctrl-C


def run_app(argv: list[str] | None = None) -> int:
    """Run the CLI; every problem the user can fix becomes one line on stderr and a non-zero exit."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        register_commands()
        # Without standalone mode click returns a typer.Exit's code instead of raising it.
        result = app(args=argv, prog_name="specrun", standalone_mode=False)
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        print("aborted", file=sys.stderr)
        return INTERRUPTED
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return INTERRUPTED
    except Exception as exc:
        if not isinstance(exc, (SpecrunError, OSError, UnicodeError)) and not is_click_error(exc):
            raise  # a bug: the traceback is what helps
        if os.environ.get("SPECRUN_DEBUG"):
            raise
        if type(exc).__name__ == "NoArgsIsHelpError" and is_click_error(exc):  # a bare `specrun` or `specrun pair`
            print(exc.format_message(), file=sys.stderr)
            return 2
        print(f"error: {one_line(exc, argv)}", file=sys.stderr)
        exit_code = getattr(exc, "exit_code", None)  # click's, or SpecrunError's
        return exit_code if isinstance(exit_code, int) else 2
    if result == INTERRUPTED:  # typer turns Ctrl-C inside a command into this exit code
        print("interrupted", file=sys.stderr)
    return result if isinstance(result, int) else 0


def register_commands() -> None:
    """Import the command modules (each registers on `app`) inside the error boundary, so a
    missing or too old llama-cpp-python is one line, not an import traceback."""
    from specrun import backend

    backend.check_install()  # first: a missing or too old llama-cpp-python is one line saying what to install
    from specrun.cli import bench, chat, doctor, generate, models, pair, pull, serve  # noqa: F401
