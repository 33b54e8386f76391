"""The README and docs/ cannot rot: their commands parse, their Python runs, their figures have commands.

- Every shell command in a ```bash block, and every inline `specrun ...` or
  `python scripts/...` span, is checked: a specrun command is parsed by the CLI's own
  parser (names, values and option callbacks; missing required parameters are allowed,
  for a command named in prose), a script's options must be ones it declares.
- Every ```python block runs on the embedded model, unless the line before it says
  `<!-- not run: REASON -->` (it then only has to compile).
- README figures: a line outside tables and code with a figure in it (a number followed by
  x, ×, %, ms or tok/s) fails; so does a table row with a number or TBD but no backticked
  command in its Command column or nothing in its Machine column; and so does any TBD
  cell, until the figure is measured and filled in.
- docs/benchmarks.md: every section (##) with a figure lists `- Machine:`, `- Date:` and
  `- Command:` with a backticked command.
- Relative links and their #anchors point at files and headings that exist.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import specrun
from specrun import settings
from specrun.bench.methods import parse_k_values
from specrun.cli.options import ModelOptions
from specrun.errors import SpecrunError

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_RUN = re.compile(r"<!--\s*not run:.*-->")
FIGURE = re.compile(r"\d(?:[\d.,]*\d)?\s*(?:x|×|%|ms|tok/s)(?![A-Za-z0-9])")
SPAN = re.compile(r"`([^`]+)`")
SHELL = {"bash", "sh", "shell", "console"}


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    run: bool  # not marked `not run`

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    found, lines = [], path.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^(\s*)```(\w*)\s*$", lines[i])
        if fence:
            start, body = i, []
            i += 1
            while not re.match(r"^\s*```\s*$", lines[i]):
                body.append(lines[i][len(fence.group(1)) :])
                i += 1
            before = next((line for line in reversed(lines[:start]) if line.strip()), "")
            found.append(Block(path, start + 1, fence.group(2), "\n".join(body), not NOT_RUN.search(before)))
        i += 1
    return found


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the lines outside code blocks."""
    inside, out = False, []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if re.match(r"^\s*```", line):
            inside = not inside
        elif not inside:
            out.append((number, line))
    return out


# --- commands --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cli():
    import typer

    from specrun.cli.app import app
    from specrun.cli.commands import register_commands

    register_commands()
    return typer.main.get_command(app)


def shell_commands(text: str) -> list[list[str]]:
    """The simple commands of a shell line: split at | && || ;, without VAR=value prefixes or `time`."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands, current = [], []
    for token in lexer:
        if token in ("|", "||", "&&", ";", "&"):
            commands.append(current)
            current = []
        else:
            current.append(token)
    commands.append(current)
    cleaned = []
    for words in commands:
        while words and (re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]) or words[0] == "time"):
            words = words[1:]
        if words:
            cleaned.append(words)
    return cleaned


def documented_commands() -> list[tuple[str, list[str], bool]]:
    """(where, words, complete) of every command the docs show: complete in shell blocks, where
    it is meant to be run as it stands; in prose a command may be named without its arguments."""
    found = []
    for path in DOCS:
        for block in blocks(path):
            if block.lang in SHELL:
                for offset, line in enumerate(block.text.replace("\\\n", " ").splitlines(), 1):
                    found += [(f"{block.where}+{offset}", words, True) for words in shell_commands(line)]
        for number, line in prose_lines(path):
            for span in SPAN.findall(line):
                if re.match(r"^(time )?(specrun |python3? scripts/)", span):
                    found += [(f"{path.relative_to(ROOT)}:{number}", words, False) for words in shell_commands(span)]
    return found


COMMANDS = documented_commands()


def parse_specrun(root, argv: list[str], complete: bool = True) -> None:
    """Parse argv as `specrun` would and check its values as the command checks them first,
    without running it. `complete` False (a command named in prose) allows missing arguments."""
    command, path = root, ["specrun"]
    args = [arg for arg in argv if arg != "--help"]
    while hasattr(command, "commands"):  # a group: the next word names a command
        if not args and "--help" in argv:
            return  # `specrun --help`, `specrun pair --help`
        assert args, f"`{' '.join(path)}` needs a command"
        name = args.pop(0)
        assert name in command.commands, f"`{' '.join(path)}` has no command {name!r}"
        command, path = command.commands[name], [*path, name]
    try:
        context = command.make_context(" ".join(path), args, resilient_parsing="--help" in argv)
    except Exception as exc:
        if complete or type(exc).__name__ != "MissingParameter":
            raise
        return
    check_values(context.params)


def check_values(params: dict) -> None:
    """The library's checks of the values a command line gives, as the commands run them first."""
    shared = {f.name for f in dataclasses.fields(ModelOptions)}
    if shared <= params.keys():
        ModelOptions(**{name: params[name] for name in shared})
    if isinstance(params.get("k"), str):
        parse_k_values(params["k"])  # one k, or bench's comma list
    settings.check(**{name: value for name, value in params.items() if name in settings.RULES and value is not None})


@functools.cache
def script_help(script: str) -> str:
    result = subprocess.run([sys.executable, str(ROOT / script), "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{script} --help failed: {result.stderr[-500:]}"
    return result.stdout


def check_script(words: list[str]) -> None:
    script = ROOT / words[1]
    assert script.is_file(), f"no script {words[1]}"
    own = words[2 : words.index("--")] if "--" in words else words[2:]  # after a bare --: the wrapped command's
    for word in own:
        if word.startswith("--"):
            option = word.split("=", 1)[0]
            assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", script_help(words[1])), (
                f"{words[1]} --help lists no option {option}"
            )


# What else the docs may tell users to run; a command not here (a typo, a renamed tool) fails.
OTHER_COMMANDS = {"pip", "bash", "curl", "printf", "git", "cmake", "claude"}  # claude: Claude Code, a client of serve


@pytest.mark.parametrize("where, words, complete", COMMANDS, ids=[f"{w}:{' '.join(c)[:40]}" for w, c, _ in COMMANDS])
def test_documented_commands_parse(where, words, complete, cli):
    if words[0] == "specrun":
        parse_specrun(cli, words[1:], complete)
    elif words[0] in ("python", "python3") and len(words) > 1 and words[1].startswith("scripts/"):
        check_script(words)
    elif words[0] in ("python", "python3"):
        assert words[1:3] in (["-m", "pytest"], ["-m", "specrun"]) or words[1] == "-c", f"{where}: {' '.join(words)}"
    else:
        assert words[0] in OTHER_COMMANDS, f"{where}: the docs tell users to run {words[0]!r}, which these checks do not know"


def test_the_checks_catch_a_bad_command(cli):
    with pytest.raises(Exception, match="No such option"):
        parse_specrun(cli, ["generate", "--no-such-option"])
    with pytest.raises(SpecrunError, match="k has to be"):
        parse_specrun(cli, ["generate", "--k", "0"])
    with pytest.raises(SpecrunError, match="temperature has to be"):
        parse_specrun(cli, ["generate", "hi", "--temp", "-1"])
    with pytest.raises(SpecrunError, match="repeat has to be"):
        parse_specrun(cli, ["bench", "--repeat", "0"])
    with pytest.raises(Exception, match="Missing"):
        parse_specrun(cli, ["pair", "check", "one.gguf"])  # a shell block's command must be complete
    parse_specrun(cli, ["pair", "check", "one.gguf"], complete=False)  # prose may leave arguments out
    with pytest.raises(AssertionError):
        parse_specrun(cli, ["pair", "nothing"])
    with pytest.raises(AssertionError):
        check_script(["python", "scripts/compare_llama_cpp.py", "--no-such-option"])
    assert shell_commands("A=1 time specrun bench && printf 'x' | specrun chat --lookup  # a comment") == [
        ["specrun", "bench"],
        ["printf", "x"],
        ["specrun", "chat", "--lookup"],
    ]


def test_the_readme_set_up_commands_are_the_real_ones():
    shell = [block.text for block in blocks(ROOT / "README.md") if block.lang in SHELL]
    assert "pip install -e '.[demo]' && specrun bench" in shell
    assert "pip install -e '.[test]' && python -m pytest -q" in shell
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install --quiet -e '.[test]'" in ci and ci.rstrip().endswith("python3 -m pytest -q")


# --- Python examples -------------------------------------------------------------------
PYTHON = [block for path in DOCS for block in blocks(path) if block.lang == "python"]


@pytest.fixture(scope="module")
def shared_costs(tmp_path_factory):
    return tmp_path_factory.mktemp("costs") / "verify-costs.json"


@pytest.fixture
def verify_cost_cache(shared_costs, monkeypatch):
    """Overrides conftest's: the examples share one measurement of the verify costs, as a user's runs do."""
    monkeypatch.setattr("specrun.session.cost_cache.cache_file", lambda: shared_costs)
    return shared_costs


@pytest.mark.parametrize("block", PYTHON, ids=[block.where for block in PYTHON])
def test_python_examples_compile(block):
    compile(block.text, block.where, "exec")


@pytest.mark.gemma
@pytest.mark.parametrize("block", [b for b in PYTHON if b.run], ids=[b.where for b in PYTHON if b.run])
def test_python_examples_run(block, gemma, capsys):
    exec(compile(block.text, block.where, "exec"), {"__name__": "__main__"})
    assert capsys.readouterr().out.strip(), f"{block.where} printed nothing"


def test_the_python_api_doc_runs_most_of_its_examples():
    examples = [block for block in PYTHON if block.path.name == "python-api.md"]
    assert len(examples) >= 8 and sum(not block.run for block in examples) <= 2


# --- figures ---------------------------------------------------------------------------
def table_rows(path: Path) -> list[tuple[int, list[str], list[str]]]:
    """(line number, header cells, cells) of every data row of every table outside code blocks."""
    rows, header = [], None
    for number, line in prose_lines(path):
        if not line.startswith("|"):
            header = None
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if header is None:
            header = [cell.lower() for cell in cells]
        elif not all(re.fullmatch(r":?-+:?", cell) for cell in cells):
            rows.append((number, header, cells))
    return rows


def figure_problems(path: Path) -> list[str]:
    """What makes the README's figures unreproducible, one line each; [] when none."""
    problems = []
    in_table = {number for number, _, _ in table_rows(path)}
    for number, line in prose_lines(path):
        if not line.startswith("|") and number not in in_table and FIGURE.search(SPAN.sub("", line)):
            problems.append(f"line {number}: a figure outside the table, with no command: {line.strip()}")
    for number, header, cells in table_rows(path):
        if not any(re.search(r"\d|TBD", cell) for cell in cells):
            continue
        row = dict(zip(header, cells))
        command = SPAN.findall(row.get("command", ""))
        if not any(re.match(r"^(specrun|python3?) ", span) for span in command):
            problems.append(f"line {number}: a row with figures but no `command` in a Command column")
        if not row.get("machine"):
            problems.append(f"line {number}: a row with figures but no Machine")
        if any("TBD" in cell for cell in cells):
            problems.append(f"line {number}: TBD: run the row's command and fill in the measured figure")
    return problems


def test_every_readme_figure_has_its_command_and_machine():
    problems = figure_problems(ROOT / "README.md")
    assert not problems, "README.md:\n" + "\n".join(problems)


def test_the_figure_check_catches_what_it_should(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(
        "Lookup is 2.1x faster.\n\n"
        "| Question | specrun | Command | Machine |\n|---|---|---|---|\n"
        "| copies | 98 tok/s | `specrun bench` | 2 CPU cores |\n"
        "| chat | 1.2x | none | 2 CPU cores |\n"
        "| writing | TBD | `specrun bench --set writing` | 2 CPU cores |\n"
        "| rpc | 3 ms | `python scripts/bench_rpc.py` | |\n"
    )
    problems = "\n".join(figure_problems(readme))
    assert "line 1: a figure outside" in problems
    assert "line 6: a row with figures but no `command`" in problems
    assert "line 7: TBD" in problems
    assert "line 8: a row with figures but no Machine" in problems
    assert "line 5" not in problems


def sections(path: Path) -> dict[str, str]:
    """## heading -> the text under it (up to the next ## heading)."""
    parts = re.split(r"^## (.+)$", path.read_text(), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_every_benchmark_section_names_machine_date_and_command():
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    intro = re.split(r"^## ", text, flags=re.M)[0]
    assert not FIGURE.search(intro), "a figure in the introduction of docs/benchmarks.md: put it in a section with its command"
    for heading, body in sections(ROOT / "docs" / "benchmarks.md").items():
        if not FIGURE.search(body) and not re.search(r"^\|.*\d", body, flags=re.M):
            continue
        lines = body.splitlines()
        for field in ("- Machine: ", "- Date: "):
            assert any(line.startswith(field) and line[len(field) :].strip() for line in lines), (
                f"## {heading}: no '{field.strip()}' line"
            )
        commands = [line for line in lines if line.startswith("- Command")]
        assert commands and any(re.search(r"`(time )?(specrun|python3?) ", line) for line in commands), (
            f"## {heading}: no '- Command:' line with a backticked command"
        )


# --- links -----------------------------------------------------------------------------
def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_relative_links_and_anchors_resolve():
    broken = []
    for path in DOCS:
        for number, line in prose_lines(path):
            for target in re.findall(r"\]\(([^)\s]+)\)", line):
                if re.match(r"^[a-z]+:", target):
                    continue  # http(s), mailto
                file, _, anchor = target.partition("#")
                linked = (path.parent / file).resolve() if file else path
                if not linked.exists():
                    broken.append(f"{path.relative_to(ROOT)}:{number}: no file {file}")
                elif anchor and linked.suffix == ".md":
                    headings = re.findall(r"^#+ (.+)$", linked.read_text(), flags=re.M)
                    if anchor not in {slug(h) for h in headings}:
                        broken.append(f"{path.relative_to(ROOT)}:{number}: no heading #{anchor} in {linked.name}")
    assert not broken, "\n".join(broken)


def test_the_readme_names_no_commit():
    text = (ROOT / "README.md").read_text()
    hashes = [word for word in re.findall(r"\b[0-9a-f]{7,40}\b", text) if re.search(r"\d", word) and re.search(r"[a-f]", word)]
    assert not hashes, f"commit hashes belong in docs/benchmarks.md, not the README: {hashes}"


# --- the example draft source ------------------------------------------------------------
@pytest.mark.gemma
def test_the_example_draft_source_in_the_design_doc_drafts_and_keeps_output_exact(gemma, tmp_path, monkeypatch):
    """docs/design.md's source, as a module of its own and its one registration: a session asks
    it by name, its drafts are verified under its name, and greedy output stays the target's."""
    design = ROOT / "docs" / "design.md"
    source = next(block for block in blocks(design) if block.lang == "python" and "class LineAbove" in block.text)
    assert 30 <= len(source.text.splitlines()) <= 40
    (tmp_path / "line_above.py").write_text(source.text)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("line_above")
    prompt = "apple, banana, cherry, grape\napple, banana, cherry, grape\napple,"  # a list Gemma goes on repeating
    with specrun.load(gemma, sources=["line-above"], k=4, n_ctx=512) as session:
        drafted = session.generate(prompt, max_tokens=24)
        plain = session.generate(prompt, max_tokens=24, plain=True)
    assert drafted.stats.accepted_by_source.get("line-above", 0) > 0 and set(drafted.stats.accepted_by_source) == {"line-above"}
    assert drafted.tokens == plain.tokens
