"""`--help` is a new user's manual: commands in the order they need them, every option with what it does and its default."""

from __future__ import annotations

import contextlib
import io

import pytest
import typer

from specrun.cli import run_app
from specrun.cli.app import COMMAND_ORDER, app


@pytest.fixture(scope="module")
def root():
    with contextlib.redirect_stdout(io.StringIO()):
        assert run_app(["--help"]) == 0  # the first run registers every command on the app
    return typer.main.get_command(app)


def all_commands(group, path=("specrun",)):
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            yield from all_commands(command, (*path, name))
        else:
            yield " ".join((*path, name)), command


def help_pages(group, path=("specrun",)):
    """The group's own page, then every sub-command's, groups included."""
    yield " ".join(path), group
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            yield from help_pages(command, (*path, name))
        else:
            yield " ".join((*path, name)), command


def test_every_help_page_renders_with_all_its_options(root, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # no option folded over lines
    broken = []
    for path, command in help_pages(root):
        try:
            code = run_app([*path.split()[1:], "--help"])
        except Exception as exc:  # a help text rich cannot render: list them all, not just the first
            broken.append(f"{path} --help: {type(exc).__name__}: {exc}")
            capsys.readouterr()
            continue
        out, err = capsys.readouterr()
        options = [
            opt
            for param in command.params
            if param.param_type_name == "option" and not param.hidden
            for opt in (*param.opts, *param.secondary_opts)
        ]
        missing = [opt for opt in options if opt not in out]
        if code != 0 or "Traceback" in out + err or missing:
            broken.append(f"{path} --help: exit {code}, options missing: {missing}, stderr: {err.strip()!r}")
    assert not broken, "\n".join(broken)


def test_specrun_help_lists_every_command_in_a_new_users_order(root, capsys, monkeypatch):
    assert set(root.commands) == set(COMMAND_ORDER)
    monkeypatch.setenv("COLUMNS", "400")  # one line per command
    assert run_app(["--help"]) == 0
    out = capsys.readouterr().out
    first_words = [line.strip("\u2502 ").split()[0] for line in out.splitlines() if line.strip("\u2502 ").split()]
    assert [word for word in first_words if word in COMMAND_ORDER] == list(COMMAND_ORDER), out


def test_each_command_has_a_one_line_summary(root):
    for name in COMMAND_ORDER:
        summary = (root.commands[name].help or "").strip()
        assert summary and "\n" not in summary, f"specrun {name}: {summary!r}"


def test_every_option_says_what_it_does_and_what_leaving_it_out_means(root):
    missing = []
    for path, command in all_commands(root):
        for param in command.params:
            name = max(param.opts, key=len) if param.opts else param.name
            help_text = (getattr(param, "help", None) or "").strip()
            if not help_text:
                missing.append(f"{path} {name}: no help")
                continue
            flag_off = getattr(param, "is_flag", False) and not param.default
            # Typer shows a default that is a value; None and an unset flag show nothing, so the text has to say it.
            if not param.required and param.default is None and not flag_off and "default" not in help_text.lower():
                missing.append(f"{path} {name}: help does not say what the default is")
    assert not missing, "\n".join(missing)


def test_typer_shows_the_value_defaults(root, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # no option help folded over lines
    assert run_app(["generate", "--help"]) == 0
    out = capsys.readouterr().out
    for shown in ("[default: auto]", "[default: 256]", "[default: 4096]", "default: none"):
        assert shown in out, out
