"""The Typer app every command module registers on, and the messages of the error boundary
(specrun.cli.commands.run_app)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import typer
from rich.console import Console
from typer.core import TyperGroup

from specrun.settings import SettingError

if TYPE_CHECKING:
    from typing_extensions import TypeIs  # in typing from Python 3.13; mypy ships typing_extensions

# The order a new user needs the commands in: run a model, serve it, measure, pick a draft, get models, check the install.
COMMAND_ORDER = ("generate", "chat", "serve", "bench", "pair", "pull", "models", "doctor")


class _Commands(TyperGroup):
    """Lists the commands in COMMAND_ORDER (Typer lists them as registered, command groups last)."""

    def list_commands(self, ctx) -> list[str]:
        names = super().list_commands(ctx)
        return sorted(names, key=lambda name: COMMAND_ORDER.index(name) if name in COMMAND_ORDER else len(COMMAND_ORDER))


app = typer.Typer(
    name="specrun",
    cls=_Commands,
    help="Exact speculative generation on llama.cpp: a small draft guesses, the target checks.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Results go to stdout, everything else (progress, stats, errors) to stderr.
err_console = Console(stderr=True)


class _ClickError(Protocol):
    exit_code: int

    def format_message(self) -> str: ...


def is_click_error(exc: object) -> TypeIs[_ClickError]:
    """click's usage errors. Typer 0.2x ships its own copy of click, so they are known by shape."""
    return isinstance(getattr(exc, "exit_code", None), int) and callable(getattr(exc, "format_message", None))


# The option of each library setting whose name is not just `--` and its name with dashes.
SETTING_OPTIONS = {
    "temperature": "--temp",
    "top_n_sigma": "--top-nsigma",
    "typical_p": "--typical",
    "dynatemp_exponent": "--dynatemp-exp",
    "n_ctx": "--ctx-size",
    "n_ubatch": "--ubatch-size",
    "translation": "--draft-translation",
}


def option_for(setting: str) -> str:
    """The CLI option that sets a library setting (`top_k` -> `--top-k`)."""
    return SETTING_OPTIONS.get(setting, "--" + setting.replace("_", "-"))


def one_line(exc: Exception, argv: list[str]) -> str:
    """The message for an exception that reached the CLI boundary."""
    if isinstance(exc, SettingError):
        return exc.phrase(option_for(exc.param))
    if is_click_error(exc):
        return _usage_line(exc, argv)
    if isinstance(exc, UnicodeDecodeError):
        return f"input is not UTF-8 text ({exc.reason} at byte {exc.start})"
    if isinstance(exc, UnicodeError):
        return "text holds bytes that are not UTF-8: give UTF-8 text"
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror or exc}"
    return str(exc)


def _usage_line(exc, argv: list[str]) -> str:
    """click's message in one line; a value it could not convert is shown as given."""
    param, ctx = getattr(exc, "param", None), getattr(exc, "ctx", None)
    hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
    opts: list[str] = getattr(param, "opts", None) or []
    given = _given_value(argv, opts) if opts and getattr(param, "param_type_name", "") == "option" else None
    if given is not None:
        detail = str(getattr(exc, "message", "") or exc.format_message())
        return f"{max(opts, key=len)} {given!r}: {detail[:1].lower()}{detail[1:]}{hint}"
    message = exc.format_message().rstrip(".")
    return f"{message[:1].lower()}{message[1:]}{hint}"


def _given_value(argv: list[str], opts: list[str]) -> str | None:
    """The last value given for an option on the command line (--temp x, --temp=x or -nx)."""
    found = None
    for i, arg in enumerate(argv):
        if arg in opts and i + 1 < len(argv):
            found = argv[i + 1]
        for opt in opts:
            if opt.startswith("--") and arg.startswith(opt + "="):
                found = arg[len(opt) + 1 :]
            elif not opt.startswith("--") and arg.startswith(opt) and arg != opt and not arg.startswith("--"):
                found = arg[len(opt) :]
    return found
